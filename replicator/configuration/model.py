"""`ConnectorConfig`: a connector's validated configuration, with the client settings built from it. Its fields are
typed, so that type checkers and editors see them: the properties declared in `replicator.configuration.properties`
(`PropertyFields`), and what several properties build together. `replicator.configuration.parser` fills it from the
properties as users write them; `replicator.configuration.connector` is the way in (`validate_submission`, `load`).

Secrets (see `replicator.configuration.masking`) and values that came from references never appear in `repr()`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Literal

from pydantic import ConfigDict, Field

from replicator.configuration.masking import mask_properties, mask_settings
from replicator.configuration.properties import Client, PropertyFields, client_setting
from replicator.configuration.secrets import has_reference
from replicator.topics.naming import TopicNamer
from replicator.topics.selection import TopicSelector


class ConnectorConfigError(ValueError):
    """A config was rejected; `errors` lists every problem as (property name, reason)."""

    def __init__(self, errors: list[tuple[str, str]]) -> None:
        self.errors = list(errors)
        super().__init__(str(self))

    def __str__(self) -> str:
        return "\n".join(f"{name}: {reason}" for name, reason in self.errors)


CONNECTION_SETTINGS = frozenset(
    {
        "bootstrap.servers",
        "security.protocol",
        "client.dns.lookup",
        "broker.address.family",
        "client.rack",
        "socket.timeout.ms",
        "socket.keepalive.enable",
        "reconnect.backoff.ms",
        "reconnect.backoff.max.ms",
    }
)


def transactional_id(connector: str, task_id: int) -> str:
    """The task's transactional.id in exactly-once mode: one per task, so a new instance fences the last."""
    return f"mirus-{connector}-{task_id}"


def connection_settings(client: Mapping[str, str]) -> dict[str, str]:
    """What any client of a cluster needs (address, network, `ssl.*`, `sasl.*`), without role-specific settings
    that another kind of client would reject or warn about (a consumer's `fetch.*` in a producer, say)."""
    return {k: v for k, v in client.items() if k in CONNECTION_SETTINGS or k.startswith(("ssl.", "sasl."))}


class ConnectorConfig(PropertyFields):
    """A connector's validated configuration; build it with `validate_submission` or `load`.

    One field per property declared in `PropertyFields` (e.g. `tasks_max`, `offset_flush_interval_ms`: a property's
    name with underscores for dots), plus `source_client` / `destination_client` / `producer_client` (librdkafka
    settings without their prefixes; `auto.offset.reset` of the source is `auto_offset_reset`), `selector`, `namer`
    and `raw`. Clients are created
    from `consumer_settings()`, `producer_settings(task_id)` and `admin_settings(cluster)`.
    """

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    # -- what several properties build together --
    source_client: dict[str, str] = Field(repr=False)
    destination_client: dict[str, str] = Field(repr=False)
    producer_client: dict[str, str] = Field(default_factory=dict, repr=False)
    selector: TopicSelector
    namer: TopicNamer = Field(default_factory=TopicNamer)
    # Mirus semantics of consumer.auto.offset.reset: `latest` (or `largest`) starts new partitions at the end.
    auto_offset_reset: Literal["earliest", "latest"] = "earliest"
    raw: dict[str, object] = Field(default_factory=dict, repr=False)

    # -- topic management and failover --

    @property
    def requires_destination_partition(self) -> bool:
        """Whether a source partition is replicated only into the destination partition with its number.

        True with `enable.partition.matching=true`, and by default while topic creation is on: the platform then
        creates and grows destination topics itself, so a missing partition is waited for (and the reason shown),
        never replaced by the partitioner (which would break partition preservation).
        """
        return (
            self.exactly_once
            or self.enable_partition_matching is True
            or (self.enable_partition_matching is None and self.topic_creation_enable)
        )

    @property
    def exactly_once(self) -> bool:
        """`exactly.once.support` asks for exactly-once (`replicator.engine.transactions`)."""
        return self.exactly_once_support != "disabled"

    @property
    def checkpoint_interval_s(self) -> int:
        """How often group offsets are translated: the shorter of the checkpoint and group-sync intervals in use."""
        intervals = [self.emit_checkpoints_interval_seconds] if self.emit_checkpoints_enabled else []
        intervals += [self.sync_group_offsets_interval_seconds] if self.sync_group_offsets_enabled else []
        return min(intervals, default=self.emit_checkpoints_interval_seconds)

    # -- client settings: built here, once, for every client the platform creates --

    def consumer_settings(self, sized: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The task's source consumer: `assign()` only, offsets in Postgres, never in Kafka.

        `sized`: fetch sizes that follow the source topics' `max.message.bytes` (`replicator.engine.record_limits`);
        the connector's own `consumer.*` values win over them."""
        return {
            "enable.partition.eof": False,
            # Keep the fetch queue full (librdkafka's default backoff, once the queue is full, is a whole second,
            # which starves a consumer that empties it quickly) and fetch again soon after it drained.
            "queued.min.messages": 200000,
            "fetch.queue.backoff.ms": 20,
            "socket.nagle.disable": True,  # small fetch and produce requests leave at once, not after an ACK
            # The broker answers a fetch after at most 3 ms, with whatever arrived by then: a record waits at most
            # that long, and a steady trickle of small appends does not cost a fetch each (a task's CPU, and with it
            # its tail latency, at moderate rates). A newly assigned partition joins the next fetch.
            # Partitions that go quiet move to a consumer fetching as MirrorMaker's does (`source_reader.py`), so an
            # idle task does not ask each source broker ~330 times a second.
            "fetch.wait.max.ms": 3,
            "fetch.min.bytes": 1_000_000,
            **(sized or {}),
            **self.source_client,
            "group.id": f"mirus-{self.name}",  # names our client; confluent-kafka insists on one
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": self.auto_offset_reset,
            **({"isolation.level": "read_committed"} if self.exactly_once else {}),
        }

    def producer_settings(self, task_id: int, sized: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The task's destination producer: defaults, destination connection settings, then `producer.*`.

        `sized`: `message.max.bytes` and `batch.size` that follow the destination topics' `max.message.bytes`
        (`replicator.engine.record_limits`); the connector's own `producer.*` values win over them."""
        settings = {
            # Idempotence keeps each partition's order across retries; acks=all means acknowledged = durable.
            "enable.idempotence": True,
            "acks": "all",
            # A record given up while later ones of its partition are written is a gap, and its retry lands
            # after them: out of order. So, as Kafka Connect does, never give a record up for time (a network
            # cut or a broker restart only delays), and stop the producer at any error that could leave a gap
            # (the task then replaces it and every partition resumes from its first unacknowledged record).
            "message.timeout.ms": 0,
            "enable.gapless.guarantee": True,
            # Never let a produce re-create a deleted destination topic with the broker's default layout.
            "allow.auto.create.topics": False,
            # 5 ms: at low rates a record waits at most that long for companions; at high rates batches fill first.
            "linger.ms": 5,
            "batch.size": 1024 * 1024,
            "batch.num.messages": 10000,
            # Room for ten consume batches; the task reads no more while a batch would not fit (its intake limit),
            # so a slow destination leaves the backlog in Kafka, not in the task's memory; a larger queue catches up
            # no faster.
            "queue.buffering.max.messages": 100_000,
            "socket.nagle.disable": True,
            "client.id": f"mirus-{self.name}-{task_id}",
            **(sized or {}),
            **connection_settings(self.destination_client),
            **self.producer_client,
        }
        if self.exactly_once:
            # A record that times out fails its transaction, which is aborted and written again: no gap can
            # become visible, so librdkafka's default (message.timeout.ms = transaction.timeout.ms) is right.
            settings["transactional.id"] = transactional_id(self.name, task_id)
            for name in ("message.timeout.ms", "enable.gapless.guarantee"):
                if name not in self.producer_client:
                    del settings[name]
        return settings

    @property
    def ordered_acks(self) -> bool:
        """Whether an acknowledgement stands for every earlier record of its destination partition, so one callback
        per run of records suffices: the producer is idempotent (acknowledges in order) and either nothing before
        an acknowledged record can be missing (gapless ordering, no delivery timeout) or a transaction commits only
        whole (exactly-once)."""
        settings = self.producer_settings(0)
        if str(settings.get("enable.idempotence")).lower() != "true":
            return False
        if self.exactly_once:
            return True
        gapless = str(settings.get("enable.gapless.guarantee")).lower() == "true"
        return gapless and str(settings.get("message.timeout.ms")) == "0"

    def admin_settings(self, cluster: Literal["source", "destination"]) -> dict[str, str]:
        """Metadata and admin calls on one of the connector's clusters."""
        return connection_settings(self.source_client if cluster == "source" else self.destination_client)

    def masked_properties(self) -> dict[str, object]:
        """The submitted properties with literal secret values masked (references shown)."""
        return mask_properties(self.raw)

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        # The client dicts hold resolved values: shown masked, secrets and anything from a reference alike.
        yield from super().__repr_args__()
        referenced = {name for name, value in self.raw.items() if has_reference(value)}
        for field, client in (
            ("source_client", Client.SOURCE),
            ("destination_client", Client.DESTINATION),
            ("producer_client", Client.PRODUCER),
        ):
            keys = {client_setting(name)[1] for name in referenced if client_setting(name)[0] == client}
            if client is Client.DESTINATION:  # producer.bootstrap.servers may stand in for the destination's
                keys |= {"bootstrap.servers"} & {client_setting(n)[1] for n in referenced if n.startswith("producer.")}
            yield field, mask_settings(getattr(self, field), keys)
