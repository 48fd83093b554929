"""The hot path's two promises: a record is forwarded as soon as it arrives, and an offset is never committed past
a record the destination refused. Refusals by the broker (a topic's max.message.bytes) need Apache Kafka: those tests
run on the `apache_kafka` clusters."""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest

from mirus.waiting import wait_until
from mirus_dagster.settings import StackEndpoints
from replicator.engine import deliveries, partitions, source_reader
from replicator.engine.task import TaskExit
from replicator.state.records import PartitionHealth
from replicator.state.store import Store
from replicator.topics import provenance
from tests.fixtures.engine_helpers import TaskThread, connector_properties, create_connector
from tests.fixtures.kafka_helpers import consume_all, create_topics, produce
from tests.fixtures.replica_check import check_replica


def _paused_on(store: Store, connector: str, tp: tuple[str, int]) -> str | None:
    status = store.partition_statuses(connector).get(tp)
    return status.reason if status and status.state == PartitionHealth.PAUSED else None


def _refusal_count(runner: TaskThread, topic: str) -> int:
    """Pauses of partition 0: here, each one a refusal (by the producer or the broker)."""
    return sum(f"paused {topic}[0]: " in e for e in runner.events)


# The connector's own producer sizes win over the limits read from the destination topics: with these, the producer
# sends a record the topic does not take, in batches as large as before the limits were read, and the broker refuses
# them (otherwise the task refuses such a record before sending it, and sizes batches to fit the topic).
BROKER_DECIDES = {"producer.message.max.bytes": "1000000", "producer.batch.size": "1000000"}


def _destination_refusing_above(kafka: StackEndpoints, topic: str, partitions: int, max_bytes: int) -> None:
    """Create `topic` at the destination with `max.message.bytes` (enforced by Apache Kafka, not the embedded
    broker)."""
    create_topics(
        kafka.destination_bootstrap_servers, {topic: partitions}, config={"max.message.bytes": str(max_bytes)}
    )


@pytest.mark.parametrize(
    "producer_settings",
    [{}, {"producer.enable.gapless.guarantee": "false"}],
    ids=["one-acknowledgement-per-run", "gapless-off-one-per-record"],
)
def test_an_offset_is_never_committed_past_a_record_the_producer_refuses(
    stack: StackEndpoints, store: Store, unique: str, producer_settings: dict[str, str]
) -> None:
    # librdkafka refuses a record larger than the producer's `message.max.bytes` before sending it, on any broker.
    # By default offsets 0-4 are produced in the same run as the refused offset 5, without a callback of their own
    # (one acknowledgement stands for a run): they must still be committed, and nothing after them. With gapless
    # ordering off an acknowledgement stands for nothing earlier, so each record carries its own callback.
    create_topics(stack.source_bootstrap_servers, {unique: 2})
    create_topics(stack.destination_bootstrap_servers, {unique: 2})
    values = [b"small-%d" % i for i in range(5)] + [b"x" * 20_000] + [b"after-%d" % i for i in range(4)]
    produce(stack.source_bootstrap_servers, [{"topic": unique, "partition": 0, "value": v} for v in values])
    produce(stack.source_bootstrap_servers, [{"topic": unique, "partition": 1, "value": b"%d" % i} for i in range(10)])
    props = connector_properties(
        stack, unique, **{"topics.whitelist": unique, "producer.message.max.bytes": "10000"}, **producer_settings
    )
    create_connector(store, props, {0: [(unique, 0), (unique, 1)]})

    runner = TaskThread.start(store, unique)
    reason = wait_until(lambda: _paused_on(store, unique, (unique, 0)), what="partition 0 paused by the refusal")
    assert "offset 5" in reason and "MSG_SIZE_TOO_LARGE" in reason
    wait_until(lambda: store.load_offsets(unique).get((unique, 1)) == 10, what="partition 1 keeps flowing")
    wait_until(lambda: store.load_offsets(unique).get((unique, 0)) == 5, what="everything before the refusal committed")
    # The retry (after a 1 s backoff) re-reads offset 5 and is refused again; records after it were read in the same
    # batches and are never committed.
    wait_until(lambda: _refusal_count(runner, unique) >= 2, timeout=30, what="the retry refused again")
    assert store.load_offsets(unique)[(unique, 0)] == 5
    runner.finish()
    assert store.load_offsets(unique)[(unique, 0)] == 5

    copied = consume_all(stack.destination_bootstrap_servers, unique, 2, expected=15)
    offsets = sorted({provenance.parse(r.headers).source_offset for r in copied if r.partition == 0})
    assert offsets == [0, 1, 2, 3, 4]


def test_an_offset_is_never_committed_past_a_record_the_broker_refuses(
    apache_kafka: StackEndpoints, store: Store, unique: str
) -> None:
    # Apache Kafka refuses a batch holding a record above the topic's `max.message.bytes` (MESSAGE_TOO_LARGE):
    # an acknowledgement error in the middle of a partition, while the producer itself accepted the record. The
    # records after it end the run and carry its one callback: their batch must not stand for the refused one.
    create_topics(apache_kafka.source_bootstrap_servers, {unique: 1})
    _destination_refusing_above(apache_kafka, unique, 1, 5000)
    values = [b"small-%d" % i for i in range(5)] + [b"x" * 8000] + [b"after-%d" % i for i in range(4)]
    produce(apache_kafka.source_bootstrap_servers, [{"topic": unique, "value": v} for v in values])
    create_connector(
        store,
        connector_properties(apache_kafka, unique, **{"topics.whitelist": unique, **BROKER_DECIDES}),
        {0: [(unique, 0)]},
    )

    runner = TaskThread.start(store, unique)
    reason = wait_until(lambda: _paused_on(store, unique, (unique, 0)), what="the partition paused by the refusal")
    assert "destination refused" in reason and "max.message.bytes (5,000 when last read)" in reason
    wait_until(lambda: _refusal_count(runner, unique) >= 2, timeout=30, what="the retry refused again")
    runner.finish()
    committed = store.load_offsets(unique).get((unique, 0), 0)
    assert committed <= 5
    # Everything below the committed offset is at the destination (the refused record is not).
    copied = consume_all(apache_kafka.destination_bootstrap_servers, unique, 1, expected=committed)
    assert set(range(committed)) <= {provenance.parse(r.headers).source_offset for r in copied}


def test_a_refused_batch_that_stops_the_producer_pauses_only_its_partition(
    apache_kafka: StackEndpoints, store: Store, unique: str
) -> None:
    # A batch the broker refuses stops a gapless producer with a fatal error, and with it the records of every other
    # partition in flight or being produced at that moment. Only the refused partition may wait (and retry with its
    # backoff, stopping the producer again each time); the others go on at once with the new producer. (The task
    # once ended here instead: confluent-kafka's flush() mishandles a fatal error.)
    refusing, flowing = f"{unique}-small", unique
    create_topics(apache_kafka.source_bootstrap_servers, {refusing: 1, flowing: 1})
    _destination_refusing_above(apache_kafka, refusing, 1, 5000)
    create_topics(apache_kafka.destination_bootstrap_servers, {flowing: 1})
    # Records behind the refused one fail with the stopped producer before its refusal is served: the refusal
    # must still pause the partition with its backoff, not leave it to be retried with every new producer.
    produce(
        apache_kafka.source_bootstrap_servers, [{"topic": refusing, "value": v} for v in [b"x" * 8000] + [b"y"] * 5000]
    )
    records = 50_000
    produce(apache_kafka.source_bootstrap_servers, [{"topic": flowing, "value": b"%d" % i} for i in range(records)])
    create_connector(
        store,
        connector_properties(apache_kafka, unique, **{"topics.whitelist": f"{refusing},{flowing}", **BROKER_DECIDES}),
        {0: [(refusing, 0), (flowing, 0)]},
    )

    runner = TaskThread.start(store, unique)
    wait_until(lambda: any("producer failed fatally" in e for e in runner.events), what="the producer stopped")
    first_failure = time.monotonic()
    wait_until(
        lambda: store.load_offsets(unique).get((flowing, 0)) == records,
        timeout=60,
        what="the other topic replicated in full through the producer replacements",
    )
    assert runner.thread is not None and runner.thread.is_alive(), runner.events[-5:]
    # Paused with its reason between its retries (each resume is refused again at once).
    wait_until(
        lambda: "offset 0" in (_paused_on(store, unique, (refusing, 0)) or ""),
        timeout=60,
        what="the refused partition shown paused at offset 0",
    )
    # New producers come with the refused partition's retries (backoff 1 s, 2 s, 4 s ...), not one per loop (a loop
    # would make hundreds). Bounded loosely by the backoffs that had run out by now: the records behind the refused
    # one may stop a producer once more before the refusal is served, and the first commit of the partition starts
    # its backoff over.
    retries_due = itertools.accumulate(partitions.RETRY_BACKOFF_S + (partitions.RETRY_BACKOFF_S[-1],) * 10)
    allowed = 2 + 2 * sum(1 for due in retries_due if due <= time.monotonic() - first_failure + 0.5)
    assert sum("producer failed fatally" in e for e in runner.events) <= allowed, runner.events[-10:]
    assert not any(f"paused {flowing}[0]" in e for e in runner.events), runner.events
    assert runner.finish() is TaskExit.STOPPED
    assert store.load_offsets(unique).get((refusing, 0), 0) == 0  # never committed past the refused record
    # Each producer replacement re-sends what the failed one left unacknowledged: duplicates, nothing lost.
    check_replica(
        apache_kafka.source_bootstrap_servers,
        flowing,
        apache_kafka.destination_bootstrap_servers,
        partitions=1,
        written=records,
    ).assert_at_least_once()


def test_a_full_local_producer_queue_delays_records_but_loses_or_reorders_none(
    stack: StackEndpoints, store: Store, unique: str
) -> None:
    # A producer queue of 20 records against batches of hundreds: produce() raises BufferError again and again in the
    # middle of runs; the task serves acknowledgements and produces the same record again.
    create_topics(stack.source_bootstrap_servers, {unique: 2})
    create_topics(stack.destination_bootstrap_servers, {unique: 2})
    sent = [{"topic": unique, "partition": i % 2, "value": b"%d" % i} for i in range(2000)]
    produce(stack.source_bootstrap_servers, sent)
    props = connector_properties(
        stack, unique, **{"topics.whitelist": unique, "producer.queue.buffering.max.messages": "20"}
    )
    create_connector(store, props, {0: [(unique, 0), (unique, 1)]})

    runner = TaskThread.start(store, unique)
    wait_until(
        lambda: store.load_offsets(unique) == {(unique, 0): 1000, (unique, 1): 1000},
        timeout=60,
        what="every offset committed",
    )
    runner.finish()
    replica = check_replica(
        stack.source_bootstrap_servers, unique, stack.destination_bootstrap_servers, partitions=2, written=len(sent)
    )
    replica.assert_exactly_once()  # one task that never restarted: not even a duplicate
    assert not any("paused" in e for e in runner.events), runner.events


class _RecordingConsumer(source_reader.Consumer):
    """The real consumer, noting each `consume` call's request and what it returned."""

    log: list[tuple[Any, ...]]

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]:
        msgs = super().consume(num_messages, timeout)
        values = [m.value() for m in msgs if m.error() is None]
        if values:
            self.log.append(("consume", num_messages, timeout, values))
        return msgs


class _RecordingProducer(deliveries.Producer):
    log: list[tuple[Any, ...]]

    def produce(self, topic: str, value: Any = None, *args: Any, **kwargs: Any) -> None:
        super().produce(topic, value, *args, **kwargs)
        self.log.append(("produce", value))


def test_a_single_record_on_an_idle_source_is_forwarded_without_waiting_for_a_batch(
    stack: StackEndpoints, store: Store, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    log: list[tuple[Any, ...]] = []
    monkeypatch.setattr(_RecordingConsumer, "log", log, raising=False)
    monkeypatch.setattr(_RecordingProducer, "log", log, raising=False)
    monkeypatch.setattr(source_reader, "Consumer", _RecordingConsumer)
    monkeypatch.setattr(deliveries, "Producer", _RecordingProducer)
    create_topics(stack.source_bootstrap_servers, {unique: 1})
    create_topics(stack.destination_bootstrap_servers, {unique: 1})
    create_connector(store, connector_properties(stack, unique, **{"topics.whitelist": unique}), {0: [(unique, 0)]})
    runner = TaskThread.start(store, unique)
    wait_until(lambda: any(e.startswith("replicating") for e in runner.events), what="the task replicating")

    produce(stack.source_bootstrap_servers, [{"topic": unique, "value": b"lonely"}])
    assert [r.value for r in consume_all(stack.destination_bootstrap_servers, unique, 1, expected=1)] == [b"lonely"]
    runner.finish()

    got = next(i for i, e in enumerate(log) if e[0] == "consume" and b"lonely" in e[3])
    _, asked, waited, returned = log[got]
    # librdkafka's consume(n, t) returns once n records are there or t has passed: the call that delivered the
    # record either asked for no more than it got or did not wait at all...
    assert asked == len(returned) or waited == 0, log[got]
    # ...and the record was produced before the engine asked the source for anything more.
    assert log[got + 1] == ("produce", b"lonely")
