"""The platform as an operator runs it: a real `dagster dev` process on the code location, driven over GraphQL.

The slow real-process tests (about two and a half minutes together). One `dagster dev` serves the whole module (the
`platform` fixture adds a connector with the `put_connector` job); each scenario is its own test, in order, so a
failing one does not hide the others. Only the GraphQL API is used to act on the platform.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import dagster as dg
import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition
from dagster._core.instance.ref import InstanceRef
from sqlalchemy import Engine

from mirus.local.devserver import DagsterDev, RunInfo, dagster_dev
from mirus.waiting import wait_until
from mirus_dagster.constants import (
    CONNECTORS_ASSET,
    ENV_ALERT_WEBHOOK_URL,
    ENV_REPORT_SCHEDULE,
    KIND_REPLICATOR,
    PUT_CONNECTOR_JOB,
    REPLICATOR_JOB,
    RUN_STARTER_SENSOR,
    STORE_CONNECTOR_OP,
    SUPERVISOR_SENSOR,
    TAG_CONNECTOR,
    TAG_KIND,
    TAG_REASON,
    TAG_SENSOR,
    TAG_TASK,
    WATCHER_JOB,
    admin_job_name,
    admin_op_name,
)
from mirus_dagster.run_launchers import K8S_CONFIG_TAG
from mirus_dagster.settings import StackEndpoints
from replicator.assignment import SourcePartition
from replicator.discovery.heartbeats import HEARTBEATS_TOPIC
from replicator.state.records import ConnectorState
from replicator.state.store import Store
from replicator.topics import provenance
from tests.fixtures.engine_helpers import connector_properties
from tests.fixtures.kafka_helpers import Traffic, create_topics, produce
from tests.fixtures.replica_check import check_replica

LIVE = {"QUEUED", "NOT_STARTED", "STARTING", "STARTED", "CANCELING"}


def record(topic: str, partition: int, i: int, phase: str) -> dict:
    """Producer.produce() arguments: a key, a value and user headers that must arrive unchanged."""
    return {
        "topic": topic,
        "partition": partition,
        "key": f"{phase}-k{i}".encode(),
        "value": f"{phase}-v{i}".encode(),
        "headers": [("phase", phase.encode()), ("seq", str(i).encode())],
    }


def assert_copied(stack: StackEndpoints, topic: str, partitions: int, count: int) -> None:
    """Every source record once at the destination, in the same partition and order, unchanged."""
    check_replica(
        stack.source_bootstrap_servers, topic, stack.destination_bootstrap_servers, partitions=partitions, written=count
    ).assert_exactly_once()


class Replicated:
    """Reads the destination as it fills: per source partition, the next source offset seen there (provenance)."""

    def __init__(self, bootstrap: str, topics: Mapping[str, int]) -> None:
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "tests-dagster-dev",
                "enable.auto.commit": False,
                "enable.partition.eof": False,
            }
        )
        self.consumer.assign([TopicPartition(t, p, 0) for t, n in topics.items() for p in range(n)])
        self.next: dict[SourcePartition, int] = {}

    def update(self) -> dict[SourcePartition, int]:
        # Traffic may still be flowing: read for at most a second, or a fast broker never lets this return.
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline and (batch := self.consumer.consume(1000, 0.2)):
            for msg in batch:
                if msg.error():
                    raise KafkaException(msg.error())
                origin = provenance.parse(msg.headers())
                assert origin is not None, f"a copy without provenance in {msg.topic()}[{msg.partition()}]"
                tp = (origin.source_topic, origin.source_partition)
                self.next[tp] = max(self.next.get(tp, 0), origin.source_offset + 1)
        return self.next

    def beyond(self, point: Mapping[SourcePartition, int], partitions: Iterable[SourcePartition]) -> bool:
        """Whether, for each partition, a record with a source offset above `point` (per partition) has arrived."""
        seen = self.update()
        return all(seen.get(tp, 0) > point.get(tp, -1) + 1 for tp in partitions)

    def close(self) -> None:
        self.consumer.close()


@contextmanager
def traffic_through(
    platform: Platform, task: int, phase: str
) -> Iterator[tuple[Replicated, Traffic, list[SourcePartition]]]:
    """Traffic into every topic of the connector, already reaching the destination through `task`'s partitions
    when the block starts; yields a reader of the destination, the traffic and `task`'s partitions."""
    # The flow also carries its source's heartbeats (replicator.discovery.heartbeats); the traffic is in the topics
    # only.
    partitions = [tp for tp in platform.store.read_assignment(platform.name)[task] if tp[0] != HEARTBEATS_TOPIC]
    replicated = Replicated(platform.stack.destination_bootstrap_servers, platform.topics)
    try:
        copied = {tp: n - 1 for tp, n in replicated.update().items()}
        traffic = Traffic(
            platform.stack.source_bootstrap_servers, platform.topics, rate=200, record=partial(record, phase=phase)
        )
        try:
            wait_until(lambda: replicated.beyond(copied, partitions), 60, what=f"traffic flowing through task {task}")
            yield replicated, traffic, partitions
        finally:
            traffic.stop()
    finally:
        replicated.close()


def live_runs_by_task(dev: DagsterDev, connector: str) -> dict[int, list[RunInfo]]:
    """Started replicator runs per task: its owner and its warm standby."""
    runs: dict[int, list[RunInfo]] = {}
    for r in dev.runs({TAG_CONNECTOR: connector}, job_name=REPLICATOR_JOB):
        if r.status == "STARTED":
            runs.setdefault(int(r.tags[TAG_TASK]), []).append(r)
    return runs


def ended_runs(dev: DagsterDev, connector: str) -> list[tuple[str, str, list[str]]]:
    """Each ended replicator run of `connector`: its status, the sensor that started it and its last messages."""
    ended = [r for r in dev.runs({TAG_CONNECTOR: connector}, job_name=REPLICATOR_JOB) if r.status not in LIVE]
    return [(r.status, r.tags.get(TAG_SENSOR, ""), dev.run_messages(r.run_id)[-5:]) for r in ended]


def owner_and_standby(platform: Platform, task: int) -> tuple[RunInfo, RunInfo]:
    """The run owning `task` (its lease names the run) and the run standing by, once both are started."""

    def found() -> tuple[RunInfo, RunInfo] | None:
        runs = live_runs_by_task(platform.dev, platform.name).get(task, [])
        lease = platform.store.lease_of(platform.name, task)
        owner = [r for r in runs if lease and lease.owner and lease.owner.endswith(r.run_id)]
        others = [r for r in runs if r not in owner]
        return (owner[0], others[0]) if owner and len(others) == 1 else None

    return platform.dev.until(found, 90, f"an owner and a standby run of task {task}")


def wait_for_new_run(dev: DagsterDev, connector: str, task: int, previous: set[str]) -> RunInfo:
    """The task's next replicator run once it is STARTED (a run id not in `previous`, same `mirus/task` tag)."""
    (run,) = dev.wait_for_runs(
        {TAG_CONNECTOR: connector, TAG_TASK: str(task)},
        statuses={"STARTED"},
        where=lambda r: r.run_id not in previous,
        job_name=REPLICATOR_JOB,
        timeout=90,
        what=f"a new started run of task {connector}-{task}",
    )
    return run


def assert_replicated(stack: StackEndpoints, topics: Mapping[str, int], traffic: Traffic) -> int:
    """Every record the (stopped) traffic and those before it wrote is at the destination, unchanged and in order
    (at-least-once: replays allowed). Returns how many records the topics hold."""
    total = 0
    for topic, partitions in topics.items():
        written = sum(traffic.acked[(topic, p)] + 1 for p in range(partitions))  # offsets from 0, all acknowledged
        check_replica(
            stack.source_bootstrap_servers,
            topic,
            stack.destination_bootstrap_servers,
            partitions=partitions,
            written=written,
            timeout=90,
        ).assert_at_least_once()
        total += written
    return total


class WebhookReceiver:
    """An incoming webhook on a local port: keeps the JSON body of every POST it is sent."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        bodies = self.bodies

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(204)
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:  # the test output stays quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hooks/mirus"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Platform:
    """`dagster dev` with one connector `name` replicating `topics` (topic -> partitions) over two tasks."""

    dev: DagsterDev
    stack: StackEndpoints
    store: Store
    name: str
    topics: dict[str, int]
    webhook: WebhookReceiver


@pytest.fixture(scope="module")
def platform(stack: StackEndpoints, db_engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Platform]:
    """The connector is added over GraphQL with the `put_connector` job, once for every test of this module, and
    deleted from the store once `dagster dev` stopped: workers and monitors of later modules host every stored
    connector."""
    name = f"dagster-dev-{uuid.uuid4().hex[:8]}"
    topics = {f"{name}-a": 3, f"{name}-b": 2}
    create_topics(stack.destination_bootstrap_servers, topics)
    create_topics(stack.source_bootstrap_servers, topics)
    produce(
        stack.source_bootstrap_servers, [record(t, i % n, i, "initial") for t, n in topics.items() for i in range(30)]
    )
    webhook = WebhookReceiver()
    # Report runs (Spark) would only compete for the CPU these scenarios measure.
    env = {**stack.as_env(), ENV_REPORT_SCHEDULE: "stopped", ENV_ALERT_WEBHOOK_URL: webhook.url}
    with dagster_dev(env, tmp_path_factory.mktemp("dagster-dev")) as dev:
        properties = connector_properties(
            stack, name, **{"topics.regex": f"{name}-.*", "tasks.max": "2", "monitor.poll.wait.ms": "1000"}
        )
        put = dev.client.submit_job_execution(
            PUT_CONNECTOR_JOB, run_config={"ops": {STORE_CONNECTOR_OP: {"config": {"properties": properties}}}}
        )
        dev.wait_for_status(put, {"SUCCESS"}, timeout=120)
        try:
            yield Platform(dev, stack, Store(db_engine), name, topics, webhook)
        finally:
            webhook.close()
    Store(db_engine).delete_connector(name)


def test_the_monitor_starts_an_owner_and_a_standby_per_task_and_records_are_replicated(platform: Platform) -> None:
    dev, name = platform.dev, platform.name
    started = dev.until(
        lambda: (
            (runs := live_runs_by_task(dev, name)).keys() == {0, 1} and all(len(r) == 2 for r in runs.values()) and runs
        ),
        90,
        "two runs for each of tasks 0 and 1",
    )
    for run in (r for runs in started.values() for r in runs):
        assert run.tags[TAG_SENSOR] == RUN_STARTER_SENSOR, f"{run.tags.get(TAG_REASON)}; {ended_runs(dev, name)}"
        assert run.tags[TAG_KIND] == KIND_REPLICATOR, run.tags
        assert K8S_CONFIG_TAG not in run.tags, "a Kubernetes tag on a run no Kubernetes launcher starts"
    (watcher,) = dev.wait_for_runs(job_name=WATCHER_JOB, statuses={"STARTED"}, timeout=60)
    assert watcher.tags[TAG_SENSOR] == RUN_STARTER_SENSOR
    for topic, partitions in platform.topics.items():
        assert_copied(platform.stack, topic, partitions, 30)


def test_a_topic_created_later_is_replicated_without_any_action(platform: Platform) -> None:
    stack, name = platform.stack, platform.name
    late = {f"{name}-c": 2}
    create_topics(stack.destination_bootstrap_servers, late)
    create_topics(stack.source_bootstrap_servers, late)
    platform.topics |= late
    produce(stack.source_bootstrap_servers, [record(t, i % n, i, "late") for t, n in late.items() for i in range(20)])
    assert_copied(stack, f"{name}-c", 2, 20)
    assignment = platform.store.read_assignment(name)
    assert sorted(tp for tps in assignment.values() for tp in tps) == sorted(
        [(t, p) for t, n in platform.topics.items() for p in range(n)] + [(HEARTBEATS_TOPIC, 0)]
    )
    runs = live_runs_by_task(platform.dev, name)
    assert runs.keys() == {0, 1} and all(len(r) == 2 for r in runs.values()), "a new topic must not need new runs"


def test_a_run_killed_with_sigkill_is_taken_over_by_its_standby_and_replaced_without_loss(
    platform: Platform,
) -> None:
    dev, name = platform.dev, platform.name
    victim, standby = owner_and_standby(platform, 0)
    with traffic_through(platform, 0, "kill") as (replicated, traffic, partitions):
        kill_point = traffic.snapshot()
        dev.kill_run_worker(victim.run_id)
        wait_until(
            lambda: replicated.beyond(kill_point, partitions),
            60,
            what="records produced after the kill to be replicated by the standby",
        )
        lease = platform.store.lease_of(name, 0)
        assert lease is not None and lease.owner is not None and lease.owner.endswith(standby.run_id)
        dev.wait_for_status(victim.run_id, {"FAILURE"}, timeout=60)
        restarted = wait_for_new_run(dev, name, 0, {victim.run_id, standby.run_id})
        assert restarted.tags[TAG_SENSOR] == SUPERVISOR_SENSOR, restarted.tags
        # At once whichever rule the supervisor's tick saw first (sensors/decisions.py): a first failure has no
        # backoff, the standby replicating rules one out, and so does a victim that replicated until it was killed.
        reason = restarted.tags[TAG_REASON]
        assert reason.startswith(
            (
                "restart: failed 1 ",
                "restart: standby missing (the task replicates)",
                "restart: the failed run was replicating until it ended",
            )
        ), reason
    written = assert_replicated(platform.stack, platform.topics, traffic)
    assert written > sum(platform.topics.values()) * 10, written


def test_a_failed_run_is_posted_to_the_webhook_and_shown_on_the_connectors_asset(platform: Platform) -> None:
    """The run killed above ended FAILURE: the run-failure sensor posts it and records the connectors asset."""
    dev, name = platform.dev, platform.name
    failed = {r.run_id for r in dev.runs({TAG_CONNECTOR: name}, job_name=REPLICATOR_JOB, statuses=["FAILURE"])}
    assert failed, "no failed replicator run (the SIGKILL scenario above makes one)"
    posted = dev.until(
        lambda: [b for b in platform.webhook.bodies if b["run_id"] in failed],
        60,
        "the failed run posted to the webhook",
    )
    body = posted[0]
    assert body["job"] == REPLICATOR_JOB and body["connector"] == name and body["task"] == 0, body
    assert body["text"].startswith(f"mirus: replicator run {body['run_id'][:8]} ({name}-0) failed: "), body
    with dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(dev.home))) as instance:

        def shown() -> str | None:
            event = instance.get_latest_materialization_event(dg.AssetKey(CONNECTORS_ASSET))
            assert event is not None and event.asset_materialization is not None
            table = str(event.asset_materialization.metadata["connectors"].value)
            return (
                table
                if f"run [{body['run_id'][:8]}](/runs/{body['run_id']}) of replicator task 0 failed" in table
                else None
            )

        dev.until(shown, 60, "the failed run among the connector's problems on the connectors asset")


def test_a_terminated_run_commits_ends_canceled_and_is_started_again(platform: Platform) -> None:
    dev, name = platform.dev, platform.name
    victim, standby = owner_and_standby(platform, 1)
    with traffic_through(platform, 1, "terminate") as (replicated, traffic, partitions):
        before = dict(replicated.update())
        dev.client.terminate_run(victim.run_id)
        dev.wait_for_status(victim.run_id, {"CANCELED"}, timeout=60)
        committed = platform.store.load_offsets(name, partitions)
        short = {tp: (committed.get(tp), before[tp]) for tp in partitions if committed.get(tp, -1) < before[tp]}
        assert not short, f"committed offsets below what was replicated before termination: {short}"
        final = f"{name}-1: stopped:"  # the task's last event, written after its final flush and commit
        assert any(m.startswith(final) for m in dev.run_messages(victim.run_id)), "no final task event"
        resumed = wait_for_new_run(dev, name, 1, {victim.run_id, standby.run_id})
        assert resumed.tags[TAG_SENSOR] == RUN_STARTER_SENSOR, resumed.tags
        assert resumed.tags[TAG_REASON] == "assigned, last run canceled", resumed.tags
        resume_point = traffic.snapshot()
        wait_until(
            lambda: replicated.beyond(resume_point, partitions),
            60,
            what="records produced after the termination to be replicated by the standby",
        )
    assert_replicated(platform.stack, platform.topics, traffic)


def test_pause_ends_every_replicator_run_and_none_starts_while_paused(platform: Platform) -> None:
    dev, name = platform.dev, platform.name
    running = dev.until(
        lambda: (
            (runs := live_runs_by_task(dev, name)).keys() == {0, 1}
            and all(len(r) == 2 for r in runs.values())
            and {r.run_id: r for rs in runs.values() for r in rs}
        ),
        90,
        "owner and standby runs of both tasks",
    )
    pause = dev.client.submit_job_execution(
        admin_job_name("pause"), run_config={"ops": {admin_op_name("pause"): {"config": {"name": name}}}}
    )
    dev.wait_for_status(pause, {"SUCCESS"}, timeout=120)
    for run in running.values():
        dev.wait_for_status(run.run_id, {"SUCCESS"}, timeout=60)
    after_pause = {r.run_id for r in dev.runs({TAG_CONNECTOR: name}, job_name=REPLICATOR_JOB)}
    paused_at = max(dev.run(r.run_id).end_time or 0.0 for r in running.values())
    dev.until(
        lambda: all(len(dev.sensor_ticks(s, after=paused_at)) >= 3 for s in (RUN_STARTER_SENSOR, SUPERVISOR_SENSOR)),
        60,
        "three ticks of each sensor after the pause",
    )
    runs = dev.runs({TAG_CONNECTOR: name}, job_name=REPLICATOR_JOB)
    assert {r.run_id for r in runs} == after_pause, "a replicator run was started while the connector is paused"
    assert not [r for r in runs if r.status in LIVE]
    head = platform.store.connector_head(name)
    assert head is not None and head.state == ConnectorState.PAUSED


def test_a_connector_deleted_just_after_a_restart_ends_its_runs_without_a_failure(platform: Platform) -> None:
    """An operator's restart then delete: every run of the connector ends SUCCESS saying why, none red; so does a
    run that starts after the deletion (as one the monitor requested a moment before it would)."""
    dev, stack = platform.dev, platform.stack
    name = f"deleted-{uuid.uuid4().hex[:8]}"
    topics = {f"{name}-t": 2}
    create_topics(stack.destination_bootstrap_servers, topics)
    create_topics(stack.source_bootstrap_servers, topics)
    produce(stack.source_bootstrap_servers, [record(f"{name}-t", i % 2, i, "deleted") for i in range(20)])
    properties = connector_properties(stack, name, **{"topics.regex": f"{name}-.*", "tasks.max": "1"})
    put = dev.client.submit_job_execution(
        PUT_CONNECTOR_JOB, run_config={"ops": {STORE_CONNECTOR_OP: {"config": {"properties": properties}}}}
    )
    dev.wait_for_status(put, {"SUCCESS"}, timeout=120)
    dev.wait_for_runs({TAG_CONNECTOR: name}, statuses={"STARTED"}, count=2, job_name=REPLICATOR_JOB, timeout=90)
    assert_copied(stack, f"{name}-t", 2, 20)
    for action in ("restart", "delete"):
        admin = dev.client.submit_job_execution(
            admin_job_name(action), run_config={"ops": {admin_op_name(action): {"config": {"name": name}}}}
        )
        dev.wait_for_status(admin, {"SUCCESS"}, timeout=120)
    late = dev.client.submit_job_execution(
        REPLICATOR_JOB,
        run_config={"ops": {"replicate": {"config": {"connector": name, "task_id": 0}}}},
        tags={TAG_CONNECTOR: name, TAG_TASK: "0", TAG_KIND: KIND_REPLICATOR},
    )
    runs = dev.until(
        lambda: (
            (found := dev.runs({TAG_CONNECTOR: name}, job_name=REPLICATOR_JOB))
            and late in {r.run_id for r in found}
            and not [r for r in found if r.status in LIVE]
            and found
        ),
        90,
        "every replicator run of the deleted connector to end",
    )
    assert {r.status for r in runs} == {"SUCCESS"}, [(r.run_id, r.status) for r in runs]
    for run in runs:
        messages = dev.run_messages(run.run_id)
        task_events = [m for m in messages if f"{name}-0" in m]
        assert any(m.endswith(f"{name}-0 ended: connector deleted") for m in task_events), (run.run_id, task_events)
    assert not [b for b in platform.webhook.bodies if b["connector"] == name]


def test_dagster_dev_shuts_down_cleanly(platform: Platform) -> None:
    # The fixture shuts down too (on any failure above); this checks how it goes.
    shutdown = platform.dev.shutdown()
    assert shutdown.clean, f"SIGKILL was needed for: {shutdown.killed}"
    assert shutdown.exit_code == 0, shutdown
