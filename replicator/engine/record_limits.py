"""How large a record the task's topics take, and the client settings that follow.

A destination topic accepts record batches up to its `max.message.bytes` (the broker's `message.max.bytes` where
the topic sets none), but librdkafka's producer refuses any record above its own `message.max.bytes`, 1,000,000 by
default: left so, a 5 MB record between two topics of 10 MB would be refused by the task itself, for good. So the
task reads its topics' limits with DescribeConfigs — one request per cluster, for the topics it does not know yet —
when it starts and when its topics change (`AssignmentFollower.start`), again for a partition paused for
its size before it is retried, and for every topic it serves each `LIMITS_REFRESH_S` (an operator or the topic
config sync may change one at any time). Its clients are made to fit (`RecordLimits.client_settings`):
- the producers: `message.max.bytes` = the largest destination limit, so no record a topic takes is refused, and
  `batch.size` at most the smallest less a batch's framing, so that a batch of small records fits every topic;
- the consumers: `max.partition.fetch.bytes`, `fetch.max.bytes` and `receive.message.max.bytes` large enough for a
  batch of the largest source limit (librdkafka's own values where they are larger: a task of topics at the
  default limits fetches as before).
The connector's own `producer.*` / `consumer.*` value of any of these wins, and a `producer.message.max.bytes` of
its own turns the check below off: sizes are then the user's to decide, and the destination broker refuses what
its topics do not take. Clients whose settings no longer fit are made again, as for a new configuration version.

A record too large for its destination topic is refused before it is produced (`oversized`), and only its partition
waits, with a reason that names the limit, both sizes and what to change: one comparison per record of the key and
value sizes the forwarder counts anyway, and the exact size (headers and a batch's framing included, uncompressed,
as the producer counts it) only for records within `HEADER_ALLOWANCE` of the limit. Sent to the broker instead, it
would be refused with its batch, which stops the gapless producer and every partition with it for a moment.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from replicator.clusters import ClusterAdmin, SizeLimit, max_message_bytes, topic_partitions
from replicator.configuration.connector import ConnectorConfig
from replicator.engine.partitions import NO_SIZE_CHECK, PartitionState
from replicator.engine.source_reader import SHARD_QUEUE_KBYTES

LIMITS_REFRESH_S = 60.0  # every topic's limit read again this often (one DescribeConfigs per cluster)
BATCH_OVERHEAD = 61  # a v2 record batch's header: the broker compares the whole batch with max.message.bytes
# Key + value sizes within this much of the limit are measured exactly; below, headers would have to be this large
# for the record not to fit (then the broker refuses it, and the reason still names the limit).
HEADER_ALLOWANCE = 65_536
# librdkafka's range of a producer's message.max.bytes, and its consumer defaults that the limits may only raise.
PRODUCER_MESSAGE_MAX = (1_000, 1_000_000_000)
PARTITION_FETCH_DEFAULT = 1_048_576
FETCH_MAX_DEFAULT = 52_428_800
RECEIVE_MAX_DEFAULT = 100_000_000
RECEIVE_FRAMING = 512  # librdkafka: receive.message.max.bytes >= fetch.max.bytes + 512
PRODUCER_SIZES = ("message.max.bytes", "batch.size")
CONSUMER_SIZES = ("max.partition.fetch.bytes", "fetch.max.bytes", "receive.message.max.bytes")
LIBRDKAFKA_MESSAGE_MAX = 1_000_000  # the producer's message.max.bytes when nothing sets it


def _varint(n: int) -> int:
    """Bytes of `n` as a Kafka record writes lengths: a zigzag varint (null is -1, one byte)."""
    return max(1, (((n << 1) ^ (n >> 63)).bit_length() + 6) // 7)


def batch_bytes(key: bytes | None, value: bytes | None, headers: Iterable[tuple[Any, Any]] | None) -> int:
    """The size of a record batch holding this record alone, as the broker compares it with `max.message.bytes`."""
    body = 3  # attributes, timestamp delta and offset delta: one byte each for a record alone in its batch
    body += 1 if key is None else _varint(len(key)) + len(key)
    body += 1 if value is None else _varint(len(value)) + len(value)
    listed = list(headers or ())
    body += _varint(len(listed))
    for name, content in listed:
        size = len(name.encode() if isinstance(name, str) else name)
        body += _varint(size) + size + (1 if content is None else _varint(len(content)) + len(content))
    return BATCH_OVERHEAD + _varint(body) + body


def too_large_reason(state: PartitionState, offset: int, size: int, limit: SizeLimit) -> str:
    """Why a record waits: the limit, both sizes and what to change."""
    topic = state.destination_topic
    record = f"record of {size:,} bytes at {state.topic}[{state.partition}] offset {offset}"
    if limit.set_on_topic:
        return f"{record} exceeds the destination topic {topic}'s max.message.bytes ({limit.bytes:,}); raise it there"
    return (
        f"{record} exceeds the destination topic {topic}'s max.message.bytes ({limit.bytes:,}: the topic sets none, "
        f"so the destination broker's message.max.bytes applies); raise max.message.bytes on {topic} (or the "
        "broker's message.max.bytes)"
    )


def oversized(
    state: PartitionState, offset: int, key: bytes | None, value: bytes | None, headers: Iterable[tuple[Any, Any]]
) -> str | None:
    """Why this record cannot be written to its destination topic, or None if it fits (or the limit is unknown)."""
    limit = state.size_limit
    if limit is None:
        return None
    size = batch_bytes(key, value, headers)
    return too_large_reason(state, offset, size, limit) if size > limit.bytes else None


def producer_refusal_reason(
    state: PartitionState,
    offset: int,
    record: tuple[bytes | None, bytes | None, Iterable[tuple[Any, Any]] | None],
    producer: Mapping[str, Any],
    config: ConnectorConfig,
    err: KafkaError,
) -> str:
    """The producer refused a record for its size before sending it (its own `message.max.bytes`)."""
    size = batch_bytes(*record)
    limit = state.size_limit
    own = "message.max.bytes" in config.producer_client
    if not own and limit is not None and size > limit.bytes:
        return too_large_reason(state, offset, size, limit)
    allowed = int(producer.get("message.max.bytes", LIBRDKAFKA_MESSAGE_MAX))
    if own:
        what = "set by the connector's producer.message.max.bytes; raise or remove that setting"
    elif limit is None:
        what = (
            f"librdkafka's default: the destination topic {state.destination_topic}'s max.message.bytes could not "
            "be read; grant DescribeConfigs on it (docs/SECURITY.md) or set producer.message.max.bytes"
        )
    else:
        what = "the largest destination topic's max.message.bytes when last read; it is read again before a retry"
    return (
        f"record of {size:,} bytes at {state.topic}[{state.partition}] offset {offset} exceeds the producer's "
        f"message.max.bytes ({allowed:,}, {what}) ({err.name()})"
    )


def broker_refusal_hint(state: PartitionState) -> str:
    """What a destination's MSG_SIZE_TOO_LARGE means for the operator, after the broker's own words."""
    known = f" ({state.size_limit.bytes:,} when last read)" if state.size_limit is not None else ""
    return (
        f": a record batch from there exceeds the destination topic {state.destination_topic}'s "
        f"max.message.bytes{known}; raise it there (or the broker's message.max.bytes)"
    )


@dataclass
class Readings:
    """Limits read from both clusters (off the loop, on the task's background thread, or in it at a start)."""

    source: dict[str, SizeLimit] = field(default_factory=dict)
    destination: dict[str, SizeLimit] = field(default_factory=dict)
    asked_source: set[str] = field(default_factory=set)
    asked_destination: set[str] = field(default_factory=set)  # those that existed: a missing one is asked again


def read_limits(config: ConnectorConfig, source: Iterable[str], destination: Iterable[str]) -> Readings:
    """`max.message.bytes` of these topics: one DescribeConfigs request per cluster, and a Metadata request naming
    the destination topics first (Kafka 1.0 describes a topic that does not exist with the broker's defaults)."""
    readings = Readings(asked_source=set(source))
    if readings.asked_source:
        readings.source = max_message_bytes(ClusterAdmin(config.admin_settings("source")), readings.asked_source)
    wanted = set(destination)
    if wanted:
        admin = ClusterAdmin(config.admin_settings("destination"))
        try:
            layouts = topic_partitions(admin, wanted)
        except KafkaException:  # the destination is away: nothing is known of its topics yet, they are asked again
            return readings
        readings.asked_destination = {topic for topic, layout in layouts.items() if layout.error is None}
        readings.destination = max_message_bytes(admin, readings.asked_destination)
    return readings


class RecordLimits:
    """What a task knows of its topics' limits (`source`, `destination`: topic -> limit; a topic whose limit could
    not be read is absent) and the routes it serves (source topic -> destination topic)."""

    def __init__(self) -> None:
        self.source: dict[str, SizeLimit] = {}
        self.destination: dict[str, SizeLimit] = {}
        self.routes: dict[str, str] = {}
        self.asked_source: set[str] = set()
        self.asked_destination: set[str] = set()

    def serve(self, config: ConnectorConfig, topics: Iterable[str], only: bool = False) -> None:
        """The task replicates these source topics (`only`: and no others, at a start of its clients)."""
        if only:
            self.routes = {}
        for topic in topics:
            self.routes[topic] = config.namer.destination_topic(topic)

    def unread(self) -> tuple[set[str], set[str]]:
        """The served topics never asked (source, destination)."""
        return set(self.routes) - self.asked_source, set(self.routes.values()) - self.asked_destination

    def learn(self, config: ConnectorConfig, again: Iterable[str] = ()) -> set[str]:
        """Read the limits of the served topics never asked, and of destination topics `again`; the destination
        topics whose limit changed."""
        source, destination = self.unread()
        return self.apply(read_limits(config, source, destination | set(again)))

    def served(self) -> tuple[set[str], set[str]]:
        """The topics served (source, destination), to read all their limits again."""
        return set(self.routes), set(self.routes.values())

    def apply(self, readings: Readings) -> set[str]:
        """Take readings in; the destination topics whose limit changed."""
        self.asked_source |= readings.asked_source
        self.asked_destination |= readings.asked_destination
        for topic in readings.asked_source:
            self._set(self.source, topic, readings.source.get(topic))
        changed = set()
        for topic in readings.asked_destination:
            if self._set(self.destination, topic, readings.destination.get(topic)):
                changed.add(topic)
        return changed

    @staticmethod
    def _set(known: dict[str, SizeLimit], topic: str, limit: SizeLimit | None) -> bool:
        if known.get(topic) == limit:
            return False
        if limit is None:
            known.pop(topic, None)
        else:
            known[topic] = limit
        return True

    # -- what the clients are made with -----------------------------------------------------------------------

    def producer_sizes(self, config: ConnectorConfig, task_id: int) -> dict[str, int]:
        """`message.max.bytes` and `batch.size` for the served destination topics whose limits are known."""
        limits = [self.destination[t] for t in set(self.routes.values()) if t in self.destination]
        if not limits:
            return {}
        low, high = PRODUCER_MESSAGE_MAX
        largest, smallest = max(limit.bytes for limit in limits), min(limit.bytes for limit in limits)
        batch = int(config.producer_settings(task_id)["batch.size"])
        return {
            "message.max.bytes": min(max(largest, low), high),
            "batch.size": max(1, min(batch, smallest - BATCH_OVERHEAD)),
        }

    def consumer_sizes(self, config: ConnectorConfig) -> dict[str, int]:
        """Fetch sizes for a batch of the largest served source topic's limit (never below librdkafka's own)."""
        limits = [self.source[t] for t in self.routes if t in self.source]
        if not limits:
            return {}
        largest = max(limit.bytes for limit in limits)
        own = config.source_client
        queue = int(own.get("queued.max.messages.kbytes", SHARD_QUEUE_KBYTES)) * 1024
        # librdkafka's fetch.max.bytes when unset: its default capped by the consumer's queue.
        if "fetch.max.bytes" in own:
            fetch = int(own["fetch.max.bytes"])
        else:
            fetch = max(min(FETCH_MAX_DEFAULT, queue), largest)
            if "receive.message.max.bytes" in own:  # the connector's own bound: librdkafka refuses a fetch above it
                fetch = min(fetch, int(own["receive.message.max.bytes"]) - RECEIVE_FRAMING)
        return {
            "max.partition.fetch.bytes": max(PARTITION_FETCH_DEFAULT, largest),
            "fetch.max.bytes": fetch,
            "receive.message.max.bytes": max(RECEIVE_MAX_DEFAULT, fetch + RECEIVE_FRAMING),
        }

    def client_settings(self, config: ConnectorConfig, task_id: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """The consumer's and the producer's settings, sized for the served topics."""
        return (
            config.consumer_settings(self.consumer_sizes(config)),
            config.producer_settings(task_id, self.producer_sizes(config, task_id)),
        )

    def sizes_of(self, config: ConnectorConfig, task_id: int) -> tuple[object, ...]:
        """The size settings the clients would be made with now, as librdkafka applies them (one left unset counts
        as librdkafka's own value): clients made with others no longer fit. So a limit read late at the value the
        clients already have (a source topic at Kafka's default, unread at the start) makes nothing again."""
        consumer, producer = self.client_settings(config, task_id)
        queue = int(config.source_client.get("queued.max.messages.kbytes", SHARD_QUEUE_KBYTES)) * 1024
        fetch = int(consumer.get("fetch.max.bytes", max(min(FETCH_MAX_DEFAULT, queue), LIBRDKAFKA_MESSAGE_MAX)))
        unset = {
            "max.partition.fetch.bytes": PARTITION_FETCH_DEFAULT,
            "fetch.max.bytes": fetch,
            "receive.message.max.bytes": max(RECEIVE_MAX_DEFAULT, fetch + RECEIVE_FRAMING),
            "message.max.bytes": LIBRDKAFKA_MESSAGE_MAX,
        }
        return tuple(consumer.get(k, unset.get(k)) for k in CONSUMER_SIZES) + tuple(
            producer.get(k, unset.get(k)) for k in PRODUCER_SIZES
        )

    def fit(self, state: PartitionState, config: ConnectorConfig) -> None:
        """Measure `state`'s records against its destination topic's limit from now on (not while it is unknown, nor
        when the connector sets the producer's message.max.bytes itself: sizes are then the connector's to decide)."""
        limit = self.destination.get(state.destination_topic)
        if limit is None or "message.max.bytes" in config.producer_client:
            state.sized(limit, NO_SIZE_CHECK)
        else:
            state.sized(limit, max(0, limit.bytes - BATCH_OVERHEAD - HEADER_ALLOWANCE))
