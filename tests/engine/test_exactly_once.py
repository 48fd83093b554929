"""Exactly-once mode (`exactly.once.support=required`) against real clusters and Postgres.

Records that an aborted transaction wrote must stay invisible to `read_committed` readers. The embedded broker
(Tansu 0.6) does not do that (measured: it returns aborted records to read_committed fetches), so the tests that
depend on it run on Apache Kafka (the session's `apache_kafka` clusters); the others run
on the session's clusters.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, ConfigResource
from sqlalchemy import text

from mirus.waiting import wait_until
from mirus_dagster.settings import StackEndpoints
from replicator.clusters import cluster_id
from replicator.configuration.connector import transactional_id
from replicator.engine.partitions import RETRY_BACKOFF_S
from replicator.engine.task import CommitWatchdogError, ReplicationTask, TaskExit
from replicator.state.store import Store
from replicator.topics import provenance
from tests.fixtures.engine_helpers import TaskThread, connector_properties, create_connector, private_database
from tests.fixtures.kafka_helpers import consume_all, create_topics, produce
from tests.fixtures.replica_check import check_replica

EXACTLY_ONCE = {"exactly.once.support": "required"}


def _exactly(endpoints: StackEndpoints, topic: str, partitions: int, written: int) -> None:
    """Every source record once at the destination, in order, as a read_committed reader sees it."""
    check_replica(
        endpoints.source_bootstrap_servers,
        topic,
        endpoints.destination_bootstrap_servers,
        partitions=partitions,
        written=written,
    ).assert_exactly_once()


def _two_partitions(stack: StackEndpoints, store: Store, unique: str, records: int, **extra: str) -> None:
    """Two-partition topics on both clusters, `records` source records, an exactly-once connector on task 0."""
    create_topics(stack.source_bootstrap_servers, {unique: 2})
    create_topics(stack.destination_bootstrap_servers, {unique: 2})
    _produce(stack, unique, b"a", records)
    create_connector(
        store,
        connector_properties(stack, unique, **{"topics.whitelist": unique, **EXACTLY_ONCE, **extra}),
        {0: [(unique, 0), (unique, 1)]},
    )


def _produce(stack: StackEndpoints, topic: str, prefix: bytes, records: int) -> None:
    produce(
        stack.source_bootstrap_servers,
        [{"topic": topic, "partition": i % 2, "value": prefix + b"%d" % i} for i in range(records)],
    )


def test_records_are_written_once_and_a_restart_resumes_exactly(
    stack: StackEndpoints, store: Store, unique: str
) -> None:
    _two_partitions(stack, store, unique, 200)
    first = TaskThread.start(store, unique)
    consume_all(stack.destination_bootstrap_servers, unique, 2, expected=200)
    assert first.finish() is TaskExit.STOPPED
    _produce(stack, unique, b"b", 100)
    second = TaskThread.start(store, unique)
    consume_all(stack.destination_bootstrap_servers, unique, 2, expected=300)
    second.finish()
    _exactly(stack, unique, 2, 300)
    offsets = store.load_offsets(unique)
    ends = store.load_destination_offsets(unique, offsets)
    stored = sorted((offsets[tp], ends.get(tp)) for tp in offsets)
    # Postgres holds the next source offset and where the committed copies end (commit markers count as offsets).
    assert [o for o, _d in stored] == [150, 150] and all(d is not None and d >= 150 for _o, d in stored)


def test_a_second_instance_fences_the_first_through_its_transactional_id(
    stack: StackEndpoints, store: Store, unique: str
) -> None:
    _two_partitions(stack, store, unique, 100)
    first = TaskThread.start(store, unique, owner="first")
    wait_until(lambda: sum(store.load_offsets(unique).values()) == 100, what="the first instance replicating")
    second = TaskThread.start(store, unique, owner="second")
    assert first.join() is TaskExit.FENCED
    _produce(stack, unique, b"b", 50)
    wait_until(lambda: sum(store.load_offsets(unique).values()) == 150, what="the second instance replicating")
    assert second.finish() is TaskExit.STOPPED
    _exactly(stack, unique, 2, 150)


def test_a_warm_standby_leaves_the_owners_transactions_alone_until_it_takes_over(
    stack: StackEndpoints, store: Store, unique: str
) -> None:
    _two_partitions(stack, store, unique, 100)
    owner = TaskThread.start(store, unique, owner="owner", owned=True)
    wait_until(lambda: sum(store.load_offsets(unique).values()) == 100, what="the owner replicating")
    standby = TaskThread.start(store, unique, owner="standby", owned=True)
    wait_until(lambda: any(e.startswith("standing by") for e in standby.events), what="the standby standing by")

    # Its clients are ready, but its producer has not initialised the transactional.id the owner writes with.
    _produce(stack, unique, b"b", 50)
    wait_until(lambda: sum(store.load_offsets(unique).values()) == 150, what="the owner replicating beside it")
    assert owner.outcome is None and not [e for e in owner.events if "fenced" in e], owner.events[-3:]
    assert owner.finish() is TaskExit.STOPPED
    wait_until(lambda: any(e.startswith("took over") for e in standby.events), what="the standby taking over")
    _produce(stack, unique, b"c", 50)
    wait_until(lambda: sum(store.load_offsets(unique).values()) == 200, what="the standby replicating")
    assert standby.finish() is TaskExit.STOPPED
    _exactly(stack, unique, 2, 200)


def test_a_task_that_died_after_its_transaction_but_before_its_offsets_resumes_from_the_destination(
    stack: StackEndpoints, unique: str
) -> None:
    # The state a crash between the destination commit and the Postgres commit leaves, produced for real: the
    # offsets table of a private database disappears, so transactions keep committing while offset commits fail,
    # until the commit watchdog ends the task.
    engine = private_database(stack, unique)
    store = Store(engine)
    create_topics(stack.source_bootstrap_servers, {unique: 1})
    create_topics(stack.destination_bootstrap_servers, {unique: 1})
    props = connector_properties(
        stack, unique, **{"topics.whitelist": unique, "commit.failure.restart.ms": "1500", **EXACTLY_ONCE}
    )
    create_connector(store, props, {0: [(unique, 0)]})
    first = TaskThread.start(store, unique)
    produce(stack.source_bootstrap_servers, [{"topic": unique, "value": b"%d" % i} for i in range(10)])
    wait_until(lambda: store.load_offsets(unique) == {(unique, 0): 10}, what="first commit")
    with engine.begin() as conn:
        conn.execute(text("ALTER TABLE offsets RENAME TO offsets_gone"))
    produce(stack.source_bootstrap_servers, [{"topic": unique, "value": b"%d" % i} for i in range(10, 60)])
    with pytest.raises(CommitWatchdogError):
        first.join(timeout=30)
    consume_all(stack.destination_bootstrap_servers, unique, 1, expected=60)  # committed at the destination
    with engine.begin() as conn:
        conn.execute(text("ALTER TABLE offsets_gone RENAME TO offsets"))
    assert store.load_offsets(unique) == {(unique, 0): 10}  # Postgres is behind the destination

    produce(stack.source_bootstrap_servers, [{"topic": unique, "value": b"%d" % i} for i in range(60, 80)])
    second = TaskThread.start(store, unique)
    wait_until(lambda: store.load_offsets(unique) == {(unique, 0): 80}, what="the second instance replicating")
    second.finish()
    assert any("resumes at 60 after its last copy at the destination" in e for e in second.events), second.events
    _exactly(stack, unique, 1, 80)
    engine.dispose()


def test_a_partition_moves_between_tasks_only_after_its_transaction_committed(
    stack: StackEndpoints, store: Store, unique: str
) -> None:
    _two_partitions(stack, store, unique, 200, **{"tasks.max": "2"})
    zero = TaskThread.start(store, unique, 0)
    wait_until(lambda: sum(store.load_offsets(unique).values()) == 200, what="task 0 replicating")
    store.write_assignment(unique, {0: [(unique, 0)], 1: [(unique, 1)]})
    one = TaskThread.start(store, unique, 1)  # takes the partition once task 0 committed and released it
    wait_until(lambda: any(e.startswith("replicating 1 partition") for e in one.events), what="the hand-over")
    _produce(stack, unique, b"b", 100)
    wait_until(lambda: sum(store.load_offsets(unique).values()) == 300, what="both tasks replicating")
    zero.finish()
    one.finish()
    assert any(e.startswith("released 1 partition") for e in zero.events), zero.events
    _exactly(stack, unique, 2, 300)


def test_a_silent_owner_is_fenced_and_its_open_transaction_never_shows(
    apache_kafka: StackEndpoints, store: Store, unique: str
) -> None:
    create_topics(apache_kafka.source_bootstrap_servers, {unique: 1})
    create_topics(apache_kafka.destination_bootstrap_servers, {unique: 1})
    produce(apache_kafka.source_bootstrap_servers, [{"topic": unique, "value": b"%d" % i} for i in range(50)])
    props = connector_properties(
        apache_kafka,
        unique,
        **{
            "topics.whitelist": unique,
            "tasks.max": "2",
            "task.heartbeat.interval.ms": "200",
            "task.lease.timeout.ms": "1000",
            **EXACTLY_ONCE,
        },
    )
    create_connector(store, props, {0: [(unique, 0)], 1: []})
    # Task 0 owned the partition and went silent mid-transaction: its copies of offsets 0-9 are written, not
    # committed (its process hangs; its lease stops heartbeating).
    lease = store.claim_task(unique, 0, "silent")
    store.claim_partitions(lease, [(unique, 0)], stale_after=timedelta(seconds=30))
    source_cluster = cluster_id(
        AdminClient({"bootstrap.servers": apache_kafka.source_bootstrap_servers}), "source", "x"
    )
    silent = Producer(
        {
            "bootstrap.servers": apache_kafka.destination_bootstrap_servers,
            "transactional.id": transactional_id(unique, 0),
        }
    )
    silent.init_transactions(30)
    silent.begin_transaction()
    for offset in range(10):
        copy_of = provenance.source_prefix(source_cluster, unique, 0) + b"%d" % offset
        headers = [(provenance.ORIGIN, source_cluster.encode()), (provenance.SOURCE, copy_of)]
        silent.produce(unique, b"%d" % offset, partition=0, headers=headers)
    assert silent.flush(30) == 0

    store.write_assignment(unique, {0: [], 1: [(unique, 0)]})
    task = TaskThread.start(store, unique, 1)
    # Without fencing, the open transaction would hold read_committed readers back for transaction.timeout.ms (60 s).
    wait_until(lambda: store.load_offsets(unique) == {(unique, 0): 50}, timeout=30, what="the new owner replicating")
    task.finish()
    assert any("fenced silent task 0" in e for e in task.events), task.events
    with pytest.raises(KafkaException, match=r"PRODUCER_FENCED|fenced"):
        silent.commit_transaction(10)
    _exactly(apache_kafka, unique, 1, 50)


def test_an_aborted_transaction_is_hidden_and_its_records_written_again(
    apache_kafka: StackEndpoints, store: Store, unique: str
) -> None:
    create_topics(apache_kafka.source_bootstrap_servers, {unique: 2})
    create_topics(apache_kafka.destination_bootstrap_servers, {unique: 2}, {"max.message.bytes": "512"})
    # The connector's own sizes win over the destination's limit (which would make the task write one record per
    # batch, each of which fits): batches of several records reach the broker, which refuses them.
    own_sizes = {"producer.message.max.bytes": "1000000", "producer.batch.size": "1000000"}
    create_connector(
        store,
        connector_properties(apache_kafka, unique, **{"topics.whitelist": unique, **EXACTLY_ONCE, **own_sizes}),
        {0: [(unique, 0), (unique, 1)]},
    )
    task = TaskThread.start(store, unique)
    produce(
        apache_kafka.source_bootstrap_servers,
        [{"topic": unique, "partition": i % 2, "value": b"v%d-" % i + b"x" * 200} for i in range(100)],
    )
    # The destination refuses the batches: the transaction is aborted and the partitions rewound, again and again.
    wait_until(lambda: any(e.startswith("transaction aborted") for e in task.events), what="an abort")
    admin = AdminClient({"bootstrap.servers": apache_kafka.destination_bootstrap_servers})
    resource = ConfigResource(ConfigResource.Type.TOPIC, unique, set_config={"max.message.bytes": "1000012"})
    for future in admin.alter_configs([resource]).values():
        future.result(timeout=30)
    # Each refused partition retries on its backoff, which grows while the limit is still being raised (Kafka 1.0
    # applies a topic's new config through ZooKeeper): up to RETRY_BACKOFF_S[-1] between two tries.
    wait_until(
        lambda: sum(store.load_offsets(unique).values()) == 100,
        timeout=2 * RETRY_BACKOFF_S[-1],
        what="replication after the abort",
    )
    task.finish()
    _exactly(apache_kafka, unique, 2, 100)


def test_a_producer_replaced_after_a_commit_whose_answer_was_lost_writes_nothing_twice(
    apache_kafka: StackEndpoints, store: Store, unique: str
) -> None:
    """A transaction's commit lands at the destination, but its answer never reaches the task (a commit that timed
    out and then failed, or an abort refused while that commit went on), and the task's producer fails: the new
    producer must not write that transaction's records again. The task's loop is driven here turn by turn, so
    that the commit can happen outside the committer (its answer lost, as it is to a task whose link dropped it);
    the producer's failure is a KafkaError made here: librdkafka raises fatal errors only on broker states a test
    cannot bring about on demand."""
    stack = apache_kafka
    _two_partitions(stack, store, unique, 100)
    events: list[str] = []
    task = ReplicationTask(store, unique, 0, "test", on_event=events.append)
    task.lease = store.claim_task(unique, 0, "test")
    task.owning = True  # as `run` does: the committer's transactions start with the clients
    task.refresh(force=True)  # clients, partitions, first transaction

    def forwarded() -> bool:
        task.forwarder.poll_once()
        return sum(state.next_offset or 0 for state in task.book.states.values()) == 100

    # Forwarded in the open transaction (the committer's turn, which would commit it, skipped).
    wait_until(forwarded, timeout=60, interval=0, what="100 records forwarded")
    # Committed at the destination; the committer never learns it.
    task.clients.deliveries.producer.commit_transaction(30)
    task.committer.producer_failed(KafkaError(KafkaError._FATAL, "the producer failed", fatal=True))
    assert sum("resumes at 50 after its last committed copy" in e for e in events) == 2, events

    _produce(stack, unique, b"b", 40)  # and replication goes on with the new producer

    def turn() -> bool:
        task.forwarder.poll_once()
        task.committer.tick(time.monotonic())
        return sum(store.load_offsets(unique).values()) == 140

    wait_until(turn, timeout=60, interval=0, what="140 records committed")
    task.close_clients()
    task.background.shutdown()
    _exactly(stack, unique, 2, 140)
