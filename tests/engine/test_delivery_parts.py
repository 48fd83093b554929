"""The record path's parts on their own, each built from its collaborators as `ReplicationTask.rebuild` builds it (a
partition book, the clients on the session's clusters, the store; no task, `wire_parts`): the deliveries'
acknowledgements, what each mode's committer decides with `DeliveryFailures` for a refused record and a failed
producer, the forwarder's batch, and a partition whose destination topic is missing."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from functools import partial

import pytest
from confluent_kafka import KafkaError, TopicPartition

from mirus_dagster.settings import StackEndpoints
from replicator.engine.deliveries import Refusal
from replicator.engine.forwarder import Forwarder
from replicator.engine.partitions import AWAITING_NEW_PRODUCER, InFlight, PartitionState
from replicator.engine.throttle import ThrottleShare
from replicator.engine.transactions import TransactionalCommitter
from replicator.state.records import OPERATOR_PAUSE, PartitionHealth
from replicator.state.store import Store
from replicator.topics import provenance
from tests.fixtures.engine_helpers import Parts, connector_properties, create_connector, wire_parts
from tests.fixtures.kafka_helpers import cluster_id, consume_all, create_topics, produce


@pytest.fixture
def parts(stack: StackEndpoints, store: Store, unique: str, request: pytest.FixtureRequest) -> Iterator[Parts]:
    """Two source partitions of `unique`, owned and routed to the destination topic of the same name; at least once
    unless the test asks for exactly once (`indirect` parametrization)."""
    exactly_once = bool(getattr(request, "param", False))
    create_topics(stack.source_bootstrap_servers, {unique: 2})
    create_topics(stack.destination_bootstrap_servers, {unique: 2})
    extra = {"exactly.once.support": "required"} if exactly_once else {}
    create_connector(
        store,
        connector_properties(stack, unique, **{"topics.whitelist": unique, **extra}),
        {0: [(unique, 0), (unique, 1)]},
    )
    parts = wire_parts(store, unique, ("source-cluster", cluster_id(stack.destination_bootstrap_servers)))
    parts.reader.assign([TopicPartition(unique, p, 0) for p in range(2)])
    for p in range(2):
        state = PartitionState((unique, p), 0, unique, "source-cluster")
        parts.book.add(state)
        parts.deliveries.route(state, p, 2)
    try:
        yield parts
    finally:
        parts.close()


def _refuse(parts: Parts, state: PartitionState, offset: int, code: int) -> None:
    """The destination's answer to a run of `state` from `offset`: refused with `code`, kept as data."""
    parts.deliveries.refuse(Refusal(state, offset, KafkaError(code)))


def _produce_run(parts: Parts, state: PartitionState, values: list[bytes], callback: bool = True) -> InFlight:
    """Produce `values` as one run of `state`, as the forwarder does: only the last record carries the callback."""
    first = state.next_offset or 0
    run = state.open(first)
    for i, value in enumerate(values):
        last = callback and i == len(values) - 1
        ack = partial(parts.deliveries.acknowledged, state, run) if last else None
        state.produce(state.destination_topic, value, None, state.destination_partition, ack, None, 0, None)
        run.add(first + i, len(value), 0)
    if callback:
        state.sent(run)
    else:
        state.cut(run)
    return run


def test_one_acknowledgement_stands_for_a_run_and_a_run_cut_short_is_acknowledged_once_all_was_delivered(
    parts: Parts, unique: str
) -> None:
    state = parts.state(0)
    _produce_run(parts, state, [b"a", b"b", b"c"])
    parts.deliveries.drain(30)
    assert state.first_unacknowledged() == 3 and not state.pending and state.in_flight == 0
    assert state.next_destination_offset == 3, "where the next copy goes at the destination"
    assert parts.metrics.counters_for(unique).records == 3
    _produce_run(parts, state, [b"d", b"e"], callback=False)  # cut short: no record carries its callback
    assert state.first_unacknowledged() == 3
    parts.deliveries.drain(30)
    assert state.first_unacknowledged() == 5 and not state.pending and not parts.deliveries.cut_runs
    assert parts.metrics.counters_for(unique).records == 5


def test_a_refused_record_pauses_its_partition_alone_from_the_refused_offset(
    parts: Parts, store: Store, unique: str
) -> None:
    refused, other = parts.state(0), parts.state(1)
    refused.skipped(9)
    other.skipped(9)
    err = KafkaError(KafkaError.INVALID_RECORD)
    _refuse(parts, refused, 7, KafkaError.INVALID_RECORD)
    assert refused.paused_reason is not None and refused.tp not in parts.book.paused, "skipped until decided"
    parts.committer.settle()
    assert refused.first_unacknowledged() == 7, "re-read from the refused offset"
    assert parts.book.paused == {refused.tp: refused} and refused.tp in parts.reader.paused
    assert refused.paused_reason == f"destination refused offset 7: {err.str()} (INVALID_RECORD)"
    status = store.partition_statuses(unique)[refused.tp]
    assert (status.state, status.reason) == (PartitionHealth.PAUSED, refused.paused_reason)
    assert other.paused_reason is None and other.first_unacknowledged() == 10
    assert parts.deliveries.failure is None, "the producer goes on"


def test_a_failed_producer_pauses_no_partition_and_its_replacement_reads_the_others_again(
    parts: Parts, unique: str
) -> None:
    refused, failed = parts.state(0), parts.state(1)
    refused.skipped(9)
    failed.skipped(9)
    _refuse(parts, refused, 4, KafkaError.INVALID_RECORD)
    # A purged record was not refused: it neither pauses its partition for long nor fails the producer again.
    _refuse(parts, failed, 9, KafkaError._PURGE_QUEUE)
    parts.committer.settle()
    assert parts.deliveries.failure is None and failed.paused_reason is AWAITING_NEW_PRODUCER
    assert failed.refused_from is None and failed.tp not in parts.book.paused
    _refuse(parts, failed, 6, KafkaError.UNKNOWN_PRODUCER_ID)
    old = parts.deliveries.producers.all[0]
    parts.committer.settle()  # the producer failed: replaced, once
    assert parts.deliveries.producers.all[0] is not old, "a new producer"
    assert parts.deliveries.failure is None and not parts.deliveries.refusals
    assert failed.paused_reason is None and failed.next_offset == 6, "read again from its first unacknowledged record"
    assert refused.paused_reason is not None, "the refused one waits for its backoff"
    assert refused.first_unacknowledged() == 4
    assert parts.events[-2:] == [
        'producer failed fatally (KafkaError{code=UNKNOWN_PRODUCER_ID,val=59,str="Broker: Unknown Producer Id"}); '
        "recreating it",
        "new producer: 1 partition(s) read again from their first unacknowledged offset",
    ]
    _produce_run(parts, failed, [b"again"])  # the partition writes through the new producer
    parts.deliveries.drain(30)
    assert failed.first_unacknowledged() == 7


@pytest.mark.parametrize("parts", [True], indirect=True, ids=["exactly-once"])
def test_exactly_once_a_refusal_aborts_the_transaction_and_an_aborts_purge_is_no_refusal(parts: Parts) -> None:
    committer = parts.committer
    assert isinstance(committer, TransactionalCommitter)
    purged, refused = parts.state(0), parts.state(1)
    # An abort purges what the transaction held: those records are written again after the rewind.
    _refuse(parts, purged, 3, KafkaError._PURGE_INFLIGHT)
    committer.settle()
    assert purged.refused_from is None and purged.paused_reason is None and committer.abort_reason is None
    _refuse(parts, refused, 5, KafkaError.INVALID_RECORD)
    committer.settle()
    assert committer.abort_reason == f"{refused.topic}[1] offset 5: INVALID_RECORD"
    assert refused.tp in parts.book.paused


def test_the_forwarder_copies_a_batch_in_order_with_provenance_and_skips_copies_of_the_destinations_records(
    parts: Parts, stack: StackEndpoints, unique: str
) -> None:
    destination = cluster_id(stack.destination_bootstrap_servers)
    records = [{"topic": unique, "partition": 0, "value": b"%d" % i, "key": b"k"} for i in range(5)]
    records.insert(
        2, {"topic": unique, "partition": 0, "value": b"cycle", "headers": [(provenance.ORIGIN, destination)]}
    )
    produce(stack.source_bootstrap_servers, records)
    forwarder = Forwarder(
        parts.clients,
        parts.book,
        parts.committer,
        source_error=parts.pauses.source_error,
        head_changed=threading.Event(),
        throttle=ThrottleShare(),
    )
    state = parts.state(0)
    for _ in range(50):
        forwarder.poll_once()
        if state.first_unacknowledged() == 6 and not len(parts.deliveries):
            break
    assert state.first_unacknowledged() == 6, "the five records and the one skipped"
    copied = consume_all(stack.destination_bootstrap_servers, unique, 2, expected=5)
    assert [r.value for r in copied] == [b"%d" % i for i in range(5)]
    assert [(r.partition, r.key) for r in copied] == [(0, b"k")] * 5
    assert dict(copied[3].headers)[provenance.SOURCE] == state.source_prefix + b"4"


def test_a_partition_whose_destination_topic_is_missing_pauses_until_metadata_names_it(
    parts: Parts, stack: StackEndpoints, unique: str
) -> None:
    missing = PartitionState((unique, 5), 0, f"{unique}-missing", "source-cluster")
    parts.book.add(missing)
    parts.destinations.check([missing.tp])
    assert missing.paused_reason == f"destination topic '{unique}-missing' does not exist"
    assert not missing.routed
    create_topics(stack.destination_bootstrap_servers, {f"{unique}-missing": 6})
    parts.book.unpause(missing)
    parts.destinations.check([missing.tp])
    assert missing.routed and missing.destination_partition == 5 and missing.paused_reason is None


def test_an_operators_hold_stops_a_partition_until_released_and_its_retry_then_comes_at_once(
    parts: Parts, unique: str
) -> None:
    pauses, state = parts.pauses, parts.state(0)
    pauses.follow_pauses({state.tp: "maintenance"})
    assert state.paused_reason == f"{OPERATOR_PAUSE}: maintenance"
    assert state.tp in parts.book.paused and state.tp in parts.reader.paused
    assert parts.book.due_for_retry(1e12) == [], "never retried by time"
    pauses.follow_pauses({})
    assert pauses.held == {} and parts.book.due_for_retry(0.0) == [state], "retried at the follower's next tick"
    assert parts.state(1).paused_reason is None
