"""A stop is a stop: SIGINT or SIGTERM ends a `mirus task run` or `mirus worker run` process within 10 s in every
state it can be in — owner, standby, right after a takeover, during the start's look-up at the destination, with the
destination hung or gone — having committed what the destination acknowledged. (Kubernetes and Docker SIGKILL a
process that takes longer; its records are then sent twice.)"""

from __future__ import annotations

import gc
import signal
import time
import weakref
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer

from mirus.faults.brokers import BrokerProcess
from mirus.waiting import wait_until
from mirus_dagster.settings import StackEndpoints
from replicator.clusters import ClusterAdmin
from replicator.engine.task import ReplicationTask, TaskExit
from replicator.state.store import Store
from replicator.topics import provenance
from tests.fixtures.engine_helpers import TaskThread, connector_properties, create_connector
from tests.fixtures.kafka_helpers import Traffic, consume_all, create_topics, produce
from tests.fixtures.processes import STOP_WITHIN_S, ReplicatorProcess

PARTITIONS = 2


def replicating(store: Store, stack: StackEndpoints, name: str, **extra: str) -> Traffic:
    """A connector copying topic `name` (PARTITIONS partitions, task 0), fed 500 records a second."""
    create_topics(stack.source_bootstrap_servers, {name: PARTITIONS})
    create_topics(stack.destination_bootstrap_servers, {name: PARTITIONS})
    create_connector(
        store,
        connector_properties(stack, name, **{"topics.whitelist": name, **extra}),
        {0: [(name, p) for p in range(PARTITIONS)]},
    )
    return Traffic(stack.source_bootstrap_servers, {name: PARTITIONS}, rate=500)


def epoch_of(store: Store, connector: str) -> int:
    lease = store.lease_of(connector, 0)
    return lease.epoch if lease else 0


def assert_stopped_in_time(process: ReplicatorProcess, sig: signal.Signals = signal.SIGINT) -> None:
    took = process.stop(sig)
    assert took < STOP_WITHIN_S, f"{sig.name} took {took:.1f}s to stop the process:\n{process.output()[-3000:]}"
    assert process.process.returncode == 0, process.output()[-3000:]
    # librdkafka's own log lines (`%<level>|...`) may still come from clients being destroyed as the process exits.
    said = [line for line in process.output().splitlines() if line.strip() and not line.startswith("%")]
    assert said and said[-1] == "stopped", process.output()[-3000:]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_owner_stops_at_once_having_committed_what_the_destination_acknowledged(
    store: Store, stack: StackEndpoints, unique: str, tmp_path: Path, sig: signal.Signals
) -> None:
    traffic = replicating(store, stack, unique)
    owner = ReplicatorProcess.task(stack, unique, tmp_path / "owner.log")
    try:
        wait_until(lambda: sum(store.load_offsets(unique).values()) > 500, timeout=60, what="the owner committing")
        assert_stopped_in_time(owner, sig)
    finally:
        written = traffic.stop()
        owner.stop()
    lease = store.lease_of(unique, 0)
    assert lease is not None and lease.state == "STOPPED"
    committed = {p: o for (_, p), o in store.load_offsets(unique).items()}
    # Every record the destination holds is committed: a restart resumes after the last copy, re-sending nothing.
    copied = consume_all(stack.destination_bootstrap_servers, unique, PARTITIONS, expected=sum(committed.values()))
    ends: dict[int, int] = {}
    for record in copied:
        origin = provenance.parse(record.headers)
        assert origin is not None
        ends[origin.source_partition] = max(ends.get(origin.source_partition, 0), origin.source_offset + 1)
    assert ends == committed and len(copied) == sum(committed.values()) <= written


def test_a_standby_stops_at_once_and_the_owner_replicates_on(
    store: Store, stack: StackEndpoints, unique: str, tmp_path: Path
) -> None:
    traffic = replicating(store, stack, unique)
    owner = ReplicatorProcess.task(stack, unique, tmp_path / "owner.log")
    wait_until(lambda: store.load_offsets(unique), timeout=60, what="the owner committing")
    standby = ReplicatorProcess.task(stack, unique, tmp_path / "standby.log")
    try:
        wait_until(lambda: "standing by" in standby.output(), timeout=60, what="the standby standing by")
        assert_stopped_in_time(standby)
        committed = sum(store.load_offsets(unique).values())
        wait_until(lambda: sum(store.load_offsets(unique).values()) > committed, what="the owner committing on")
        assert epoch_of(store, unique) == 1
    finally:
        traffic.stop()
        owner.stop()
        standby.stop()


@pytest.mark.parametrize("delay_s", [0.0, 0.01, 0.05, 0.2])
def test_a_standby_that_just_took_over_stops_at_once(
    store: Store, stack: StackEndpoints, unique: str, tmp_path: Path, delay_s: float
) -> None:
    """The stop lands within `delay_s` of the takeover: while the new owner reads its assignment, claims its
    partitions, looks up its copies and starts its clients (once, a process in this state did not end in 30 s)."""
    traffic = replicating(store, stack, unique)
    owner = ReplicatorProcess.task(stack, unique, tmp_path / "owner.log")
    wait_until(lambda: store.load_offsets(unique), timeout=60, what="the owner committing")
    standby = ReplicatorProcess.task(stack, unique, tmp_path / "standby.log")
    try:
        wait_until(lambda: "standing by" in standby.output(), timeout=60, what="the standby standing by")
        owner.send(signal.SIGKILL)
        owner.process.wait(10)
        wait_until(lambda: epoch_of(store, unique) == 2, timeout=30, interval=0.005, what="the takeover")
        time.sleep(delay_s)  # the state under test is a moment after an event: no condition marks it
        assert_stopped_in_time(standby)
    finally:
        traffic.stop()
        owner.stop()
        standby.stop()


@pytest.mark.parametrize("fault", ["hung", "down"])
def test_an_owner_stops_at_once_when_its_destination_hangs_or_is_gone(
    store: Store,
    stack: StackEndpoints,
    destination_broker: BrokerProcess,
    unique: str,
    tmp_path: Path,
    fault: str,
) -> None:
    endpoints = StackEndpoints(stack.source_bootstrap_servers, destination_broker.bootstrap, stack.database_url)
    traffic = replicating(store, endpoints, unique)
    owner = ReplicatorProcess.task(stack, unique, tmp_path / "owner.log")
    try:
        wait_until(lambda: store.load_offsets(unique), timeout=60, what="the owner committing")
        assert destination_broker.proc is not None
        if fault == "hung":
            destination_broker.proc.send_signal(signal.SIGSTOP)  # connections stay open; nothing is answered
        else:
            destination_broker.stop(signal.SIGKILL)
        time.sleep(1)  # records are in flight to the destination that will not answer: the state under test
        assert_stopped_in_time(owner)
    finally:
        traffic.stop()
        owner.stop()
    lease = store.lease_of(unique, 0)
    assert lease is not None and lease.state == "STOPPED"


def test_a_start_stops_at_once_while_it_looks_up_its_copies_at_the_destination(
    store: Store, stack: StackEndpoints, destination_broker: BrokerProcess, unique: str, tmp_path: Path
) -> None:
    """An exactly-once start reads its destination partitions to their end to find its last copies; the destination
    hangs while it reads (the look-up then waits up to 90 s before it gives up)."""
    endpoints = StackEndpoints(stack.source_bootstrap_servers, destination_broker.bootstrap, stack.database_url)
    create_topics(endpoints.source_bootstrap_servers, {unique: PARTITIONS})
    create_topics(endpoints.destination_bootstrap_servers, {unique: PARTITIONS})
    # Enough at the destination that the look-up is still reading when the broker is stopped.
    value = b"x" * 1000
    produce(
        endpoints.destination_bootstrap_servers,
        ({"topic": unique, "partition": i % PARTITIONS, "value": value} for i in range(100_000)),
    )
    create_connector(
        store,
        connector_properties(endpoints, unique, **{"topics.whitelist": unique, "exactly.once.support": "required"}),
        {0: [(unique, p) for p in range(PARTITIONS)]},
    )
    task = ReplicatorProcess.task(stack, unique, tmp_path / "task.log")
    try:
        looking_up = "looking up the last copies"
        wait_until(lambda: looking_up in task.output(), timeout=60, interval=0.005, what="the look-up")
        assert destination_broker.proc is not None
        destination_broker.proc.send_signal(signal.SIGSTOP)
        time.sleep(1)  # the look-up waits for the hung destination: the state under test
        assert "replicating" not in task.output(), "the look-up ended before the destination hung"
        assert_stopped_in_time(task)
    finally:
        task.stop()
    assert "TransactionError" not in task.output()


def test_workers_hosting_owners_and_standbys_stop_at_once(
    estate_db: tuple[Store, str], stack: StackEndpoints, unique: str, tmp_path: Path
) -> None:
    store, url = estate_db
    names = [f"{unique}-{i}" for i in range(3)]
    traffics = [replicating(store, stack, name, **{"task.standby.runs": "1"}) for name in names]
    own = StackEndpoints(stack.source_bootstrap_servers, stack.destination_bootstrap_servers, url)
    workers = [ReplicatorProcess.worker(own, i, 2, tmp_path / f"worker-{i}.log") for i in range(2)]
    try:
        wait_until(
            lambda: all(store.load_offsets(name) for name in names), timeout=90, what="every connector committing"
        )
        # Each task's standby says so (a standby that took over and was replaced says so again: counted once).
        wait_until(
            lambda: all(any(f"{name}-0: standing by" in w.output() for w in workers) for name in names),
            timeout=90,
            what="a standby for every task",
        )
        for worker in workers:
            assert_stopped_in_time(worker, signal.SIGTERM)
    finally:
        for traffic in traffics:
            traffic.stop()
        for worker in workers:
            worker.stop()
    assert {store.lease_of(name, 0).state for name in names} == {"STOPPED"}


def _closed(client: Producer | Consumer) -> bool:
    """Whether `client` was closed (its librdkafka handle destroyed): a closed client refuses every call. Asked with
    calls that change nothing (the task's thread uses the client meanwhile)."""
    try:
        if isinstance(client, Producer):
            client.purge(in_queue=False, in_flight=False, blocking=False)
        else:
            client.assignment()
    except RuntimeError:
        return True
    return False


def _task_clients(task: ReplicationTask) -> list[Producer | Consumer]:
    producers = [p for p in task.clients.deliveries.producers.all if p is not None]
    return [*producers, *(shard.consumer for tier in task.clients.reader.tiers for shard in tier.shards)]


def test_a_task_closes_its_clients_when_it_makes_them_again_and_when_it_stops(
    store: Store, stack: StackEndpoints, unique: str
) -> None:
    # Issue 38: a task's producers were never closed (only its consumers were): each lived on, its threads waking and
    # reconnecting, until Python's cyclic collector got to it (its error callback is a method of the forwarder that
    # holds it); after a test session, a dozen of them still logged their refused reconnections to brokers long gone.
    traffic = replicating(store, stack, unique)
    runner = TaskThread.start(store, unique)
    try:
        wait_until(lambda: sum(store.load_offsets(unique).values()) > 100, timeout=60, what="the task committing")
        first = _task_clients(runner.task)
        assert first and not any(_closed(client) for client in first)
        store.request_restart(unique)
        wait_until(lambda: any("restarting clients in place" in e for e in runner.events), what="clients made again")
        committed = sum(store.load_offsets(unique).values())
        wait_until(lambda: sum(store.load_offsets(unique).values()) > committed, timeout=60, what="copying again")
        assert all(_closed(client) for client in first)
        second = _task_clients(runner.task)
        assert second and not any(_closed(client) for client in second)
    finally:
        traffic.stop()
        outcome = runner.finish()
    assert outcome is TaskExit.STOPPED
    assert all(_closed(client) for client in second)
    assert all(p is None for p in runner.task.clients.deliveries.producers.all)


def test_an_admin_client_is_destroyed_as_soon_as_it_is_dropped(stack: StackEndpoints) -> None:
    # A ClusterAdmin whose error callback was its own method was a reference cycle: the admin clients the engine makes
    # for one request (cluster ids, metadata, size limits, log offsets) lived on until a full collection.
    admin = ClusterAdmin({"bootstrap.servers": stack.source_bootstrap_servers})
    assert admin.list_topics(timeout=10).cluster_id is not None
    dropped = weakref.ref(admin)
    gc.disable()  # what frees it must be its last reference going, not the collector
    try:
        del admin
        assert dropped() is None
    finally:
        gc.enable()
