"""Sensors, jobs and runs on a real Dagster instance with real clusters and Postgres (runs execute in-process)."""

import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import dagster as dg
import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient
from sqlalchemy import Engine

from mirus_dagster.constants import CONNECTOR_PARTITIONS, CONNECTORS_ASSET, TAG_CONNECTOR, TAG_REASON, TAG_TASK
from mirus_dagster.definitions import admin_jobs, kafka_monitor, task_supervisor
from mirus_dagster.jobs import replicator
from mirus_dagster.resources import SupervisorPolicy
from mirus_dagster.stack import StackEndpoints
from replicator.store import Store
from sensors.decisions import (
    TaskRunHistory,
    requested_restart,
    restart_backoff_s,
    restart_decision,
    start_decision,
)
from sensors.monitor import MonitorCursor
from tests.engine_helpers import connector_properties
from tests.kafka_helpers import consume_all, create_topics, produce, wait_for

JOBS = {job.name: job for job in admin_jobs}

# -- decisions (plain functions) ---------------------------------------------------------------------------

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def history(**kw: object) -> TaskRunHistory:
    base = {"live": False, "live_started_at": None, "latest_status": None, "latest_ended_at": None,
            "consecutive_failures": 0}  # fmt: skip
    return TaskRunHistory(**{**base, **kw})  # type: ignore[arg-type]


def test_the_monitor_starts_idle_tasks_and_leaves_failures_to_the_supervisor() -> None:
    assert start_decision(history()).launch
    assert start_decision(history(latest_status="SUCCESS")).launch
    assert start_decision(history(latest_status="CANCELED")).launch
    assert not start_decision(history(live=True)).launch
    assert not start_decision(history(latest_status="FAILURE", consecutive_failures=1)).launch


def test_the_supervisor_backs_off_doubling_up_to_a_cap() -> None:
    assert [restart_backoff_s(n, 1.0, 60.0) for n in (1, 2, 3, 4, 8, 20)] == [0, 1, 2, 4, 60, 60]
    policy = {"lease_timeout_s": 30.0, "initial_backoff_s": 1.0, "max_backoff_s": 60.0}
    failed = history(latest_status="FAILURE", latest_ended_at=NOW, consecutive_failures=3)
    assert not restart_decision(failed, None, NOW + timedelta(seconds=1), **policy).launch
    assert restart_decision(failed, None, NOW + timedelta(seconds=2), **policy).launch
    once = history(latest_status="FAILURE", latest_ended_at=NOW, consecutive_failures=1)
    assert restart_decision(once, None, NOW, **policy).launch
    assert not restart_decision(history(latest_status="SUCCESS", latest_ended_at=NOW), None, NOW, **policy).launch


def test_an_operator_restart_brings_a_failed_task_back_at_once() -> None:
    failed = history(latest_status="FAILURE", latest_ended_at=NOW, consecutive_failures=5)  # deep in backoff
    later = NOW + timedelta(seconds=1)
    assert requested_restart(failed, later)
    assert not requested_restart(failed, NOW - timedelta(seconds=1))  # asked before the run failed
    assert not requested_restart(failed, None)
    assert not requested_restart(history(live=True, latest_status="FAILURE", latest_ended_at=NOW), later)
    assert not requested_restart(history(latest_status="SUCCESS", latest_ended_at=NOW), later)


def test_the_supervisor_replaces_a_live_run_that_stopped_heartbeating() -> None:
    policy = {"lease_timeout_s": 30.0, "initial_backoff_s": 1.0, "max_backoff_s": 60.0}
    live = history(live=True, live_started_at=NOW)
    # A fresh run has not claimed its lease yet: the old heartbeat must not condemn it.
    assert not restart_decision(live, NOW - timedelta(minutes=5), NOW + timedelta(seconds=10), **policy).launch
    decision = restart_decision(live, NOW + timedelta(seconds=5), NOW + timedelta(seconds=40), **policy)
    assert decision.launch and decision.replace_live_run


# -- the platform on a real Dagster instance ---------------------------------------------------------------


def put(instance: dg.DagsterInstance, resources: dict, properties: dict) -> dg.ExecuteInProcessResult:
    return JOBS["put_connector"].execute_in_process(
        run_config={"ops": {"store_connector": {"config": {"properties": properties}}}},
        instance=instance, resources=resources, raise_on_error=False,
    )  # fmt: skip


def admin(instance: dg.DagsterInstance, resources: dict, action: str, name: str) -> dg.ExecuteInProcessResult:
    return JOBS[f"{action}_connector"].execute_in_process(
        run_config={"ops": {f"{action}_connector_op": {"config": {"name": name}}}},
        instance=instance, resources=resources, raise_on_error=False,
    )  # fmt: skip


def evaluate(sensor: dg.SensorDefinition, instance: dg.DagsterInstance, resources: dict, cursor: str | None):  # type: ignore[no-untyped-def]
    context = dg.build_sensor_context(instance=instance, cursor=cursor, resources=resources)
    return sensor(context)


def requests_for(result: dg.SensorResult, connector: str) -> list[dg.RunRequest]:
    """This test's run requests: connectors of other tests share the database."""
    return [r for r in result.run_requests if r.tags[TAG_CONNECTOR] == connector]


class InProcessRun:
    """A replicator run executed in-process in a thread, as the run launcher would execute it."""

    def __init__(self, instance: dg.DagsterInstance, resources: dict, request: dg.RunRequest) -> None:
        self.result: dg.ExecuteInProcessResult | None = None
        self.request = request
        self.thread = threading.Thread(target=self._run, args=(instance, resources), daemon=True)
        self.thread.start()

    def _run(self, instance: dg.DagsterInstance, resources: dict) -> None:
        self.result = replicator.execute_in_process(
            run_config=self.request.run_config, instance=instance, resources=resources, tags=self.request.tags,
            raise_on_error=False,
        )  # fmt: skip

    def join(self, timeout: float = 60) -> dg.ExecuteInProcessResult:
        self.thread.join(timeout)
        assert not self.thread.is_alive() and self.result is not None, "the replicator run did not end"
        return self.result


def test_a_rejected_config_fails_the_run_and_changes_nothing(
    instance: dg.DagsterInstance, resources: dict, stack: StackEndpoints, db_engine: Engine, unique: str
) -> None:
    store = Store(db_engine)
    good = connector_properties(stack, unique, **{"topics.whitelist": unique})
    assert put(instance, resources, good).success

    bad = {**good, "tasks.max": "zero", "topics.regex": "("}
    result = put(instance, resources, bad)

    assert not result.success
    failure = result.get_step_failure_events()[0].event_specific_data.error.message  # type: ignore[union-attr]
    assert "tasks.max" in failure and "topics.regex" in failure and "nothing was stored" in failure
    record = store.get_connector(unique)
    assert record.version == 1 and record.properties == good


def test_a_literal_secret_is_refused_from_the_launchpad(
    instance: dg.DagsterInstance, resources: dict, stack: StackEndpoints, db_engine: Engine, unique: str
) -> None:
    properties = connector_properties(stack, unique, **{"topics.whitelist": unique, "consumer.sasl.password": "pw1"})

    result = put(instance, resources, properties)

    assert not result.success
    failure = result.get_step_failure_events()[0].event_specific_data.error.message  # type: ignore[union-attr]
    assert "consumer.sasl.password" in failure and "${env:NAME}" in failure and "pw1" not in failure
    assert unique not in [c.name for c in Store(db_engine).list_connectors()]


def test_add_connector_then_sensor_runs_replicate_and_pause_stops_them(
    instance: dg.DagsterInstance,
    resources: dict,
    stack: StackEndpoints,
    db_engine: Engine,
    unique: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TEST_SOURCE_PASSWORD", "hunter2-secret")
    store = Store(db_engine)
    first, second = f"{unique}-a", f"{unique}-b"
    create_topics(stack.source_bootstrap_servers, {first: 3})
    create_topics(stack.destination_bootstrap_servers, {f"{first}.copy": 3})
    produce(stack.source_bootstrap_servers, [{"topic": first, "partition": i % 3, "key": b"%d" % i,
                                              "value": b"v%d" % i} for i in range(90)])  # fmt: skip
    properties = connector_properties(stack, unique, **{
        "tasks.max": "2", "topics.regex": f"{unique}-.*", "destination.topic.name.suffix": ".copy",
        "monitor.poll.wait.ms": "100", "consumer.sasl.password": "${env:TEST_SOURCE_PASSWORD}",
        "consumer.security.protocol": "PLAINTEXT",
    })  # fmt: skip
    assert put(instance, resources, properties).success
    # The connectors asset shows the connector; the secret appears only as its reference.
    materialization = instance.get_latest_materialization_event(dg.AssetKey(CONNECTORS_ASSET)).asset_materialization
    assert unique in str(materialization.metadata["connectors"].value)
    shown = str(materialization.metadata)
    assert "hunter2-secret" not in shown and "${env:TEST_SOURCE_PASSWORD}" in shown
    assert unique in instance.get_dynamic_partitions(CONNECTOR_PARTITIONS)

    result = evaluate(kafka_monitor, instance, resources, None)
    requests = requests_for(result, unique)
    assert sorted((r.tags[TAG_CONNECTOR], r.tags[TAG_TASK]) for r in requests) == [(unique, "0"), (unique, "1")]
    runs = [InProcessRun(instance, resources, r) for r in requests]
    copied = consume_all(stack.destination_bootstrap_servers, f"{first}.copy", 3, expected=90)
    assert sorted(r.value for r in copied) == sorted(b"v%d" % i for i in range(90))

    # Runs are live now: the monitor requests nothing more.
    live = dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED], tags={TAG_CONNECTOR: unique})
    wait_for(lambda: len(instance.get_runs(live)) == 2)
    assert requests_for(evaluate(kafka_monitor, instance, resources, result.cursor), unique) == []

    # A topic created at the source is assigned and replicated by the running tasks, without a restart.
    create_topics(stack.destination_bootstrap_servers, {f"{second}.copy": 1})
    create_topics(stack.source_bootstrap_servers, {second: 1})
    produce(stack.source_bootstrap_servers, [{"topic": second, "value": b"new"}])
    cursor = result.cursor
    generation = store.get_connector(unique).assignment_generation
    wait_for(lambda: evaluate(kafka_monitor, instance, resources, cursor) and
             store.get_connector(unique).assignment_generation > generation, what="a new generation")  # fmt: skip
    assert [r.value for r in consume_all(stack.destination_bootstrap_servers, f"{second}.copy", 1, 1)] == [b"new"]

    assert admin(instance, resources, "pause", unique).success
    for run in runs:
        assert run.join().success
    assert requests_for(evaluate(kafka_monitor, instance, resources, cursor), unique) == []  # paused
    assert admin(instance, resources, "resume", unique).success
    assert len(requests_for(evaluate(kafka_monitor, instance, resources, cursor), unique)) == 2
    assert admin(instance, resources, "delete", unique).success
    assert unique not in instance.get_dynamic_partitions(CONNECTOR_PARTITIONS)
    assert admin(instance, resources, "pause", unique).success is False  # unknown now: a clear failure


def test_unreachable_source_backs_off_without_affecting_other_connectors(
    instance: dg.DagsterInstance, resources: dict, stack: StackEndpoints, db_engine: Engine, unique: str
) -> None:
    healthy, broken = f"{unique}-ok", f"{unique}-down"
    create_topics(stack.source_bootstrap_servers, {healthy: 1})
    create_topics(stack.destination_bootstrap_servers, {healthy: 1})
    assert put(instance, resources, connector_properties(stack, healthy, **{"topics.whitelist": healthy})).success
    unreachable = connector_properties(stack, broken, **{"topics.whitelist": "x"})
    unreachable["consumer.bootstrap.servers"] = "127.0.0.1:1"  # nothing listens there
    assert put(instance, resources, unreachable).success

    result = evaluate(kafka_monitor, instance, resources, None)

    assert [r.tags[TAG_CONNECTOR] for r in requests_for(result, healthy) + requests_for(result, broken)] == [healthy]
    snapshot = Store(db_engine).latest_snapshot(broken, "source")
    assert snapshot is not None and "source cluster metadata unavailable" in snapshot.error
    assert '"failures":1' in result.cursor
    # The reason is visible in the UI: the connectors asset lists it.
    shown = next(e for e in result.asset_events if e.asset_key == dg.AssetKey(CONNECTORS_ASSET))
    assert "source metadata: source cluster metadata unavailable" in str(shown.metadata["connectors"].value)
    for name in (healthy, broken):
        admin(instance, resources, "delete", name)


def test_the_supervisor_restarts_a_failed_task(
    instance: dg.DagsterInstance, resources: dict, stack: StackEndpoints, db_engine: Engine, unique: str
) -> None:
    store = Store(db_engine)
    create_topics(stack.source_bootstrap_servers, {unique: 1})
    create_topics(stack.destination_bootstrap_servers, {unique: 1})
    properties = connector_properties(stack, unique, **{"topics.whitelist": unique})
    assert put(instance, resources, properties).success
    request = requests_for(evaluate(kafka_monitor, instance, resources, None), unique)[0]
    # A real failure: the connector disappears under the run before it claims its task.
    assert admin(instance, resources, "delete", unique).success
    assert not InProcessRun(instance, resources, request).join().success
    assert put(instance, resources, properties).success
    # Assignment again (a monitor tick can miss a slow broker: it is retried); the failed run is left alone.
    wait_for(
        lambda: evaluate(kafka_monitor, instance, resources, None) and store.read_assignment(unique),
        what="the task assigned again",
    )  # fmt: skip

    restart = wait_for(
        lambda: requests_for(evaluate(task_supervisor, instance, resources, None), unique),
        timeout=10, what="a restart after the first backoff",
    )  # fmt: skip
    assert restart[0].tags[TAG_TASK] == "0" and "restart" in restart[0].tags[TAG_REASON]
    assert store.lease_of(unique, 0).restart_attempts == 1
    disabled = {**resources, "supervisor": SupervisorPolicy(auto_restart=False)}
    assert isinstance(evaluate(task_supervisor, instance, disabled, None), dg.SkipReason)
    # An operator's restart (REST API, CLI or job) brings a failed task back even with automatic restarts off.
    assert admin(instance, resources, "restart", unique).success
    requested = requests_for(evaluate(task_supervisor, instance, disabled, None), unique)
    assert [r.tags[TAG_REASON] for r in requested] == ["restart: an operator requested a restart"]
    admin(instance, resources, "delete", unique)


@pytest.fixture
def kafka_clients(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The kind of every Kafka client the platform's code creates from now on (the clients still work), marked
    "(no brokers)" when created without bootstrap servers: librdkafka judging settings, not a client at work."""
    created: list[str] = []
    for kind in (Consumer, Producer, AdminClient):

        def counting(*args: Any, _kind: type = kind, **kwargs: Any) -> Any:
            settings = args[0] if args else kwargs
            created.append(_kind.__name__ + ("" if "bootstrap.servers" in settings else " (no brokers)"))
            return _kind(*args, **kwargs)

        for module in list(sys.modules.values()):
            name = getattr(module, "__name__", "")
            if (
                name.startswith(("replicator", "mirus_dagster", "sensors", "assets"))
                and vars(module).get(kind.__name__) is kind
            ):
                monkeypatch.setattr(module, kind.__name__, counting)
    return created


def test_a_sensor_tick_creates_kafka_clients_only_to_poll_metadata(
    instance: dg.DagsterInstance, resources: dict, stack: StackEndpoints, unique: str, kafka_clients: list[str]
) -> None:
    create_topics(stack.source_bootstrap_servers, {unique: 1})
    create_topics(stack.destination_bootstrap_servers, {unique: 1})
    assert put(instance, resources, connector_properties(stack, unique, **{"topics.whitelist": unique})).success
    assert "Consumer (no brokers)" in kafka_clients  # the submission checks judged the client settings
    kafka_clients.clear()

    polled = evaluate(kafka_monitor, instance, resources, None)
    assert requests_for(polled, unique)
    # Clients at work only: metadata read with admin clients, heartbeats written (replicator.heartbeats) and,
    # for connectors with consumer groups, destination partitions read for offset translation. The stored configs
    # are not judged again.
    assert "AdminClient" in kafka_clients and not [c for c in kafka_clients if c.endswith("(no brokers)")]
    kafka_clients.clear()

    cursor = MonitorCursor.model_validate_json(polled.cursor)
    for poll in cursor.polls.values():
        poll.next_poll_at = time.time() + 3600  # no connector is due: the tick only starts runs
    assert requests_for(evaluate(kafka_monitor, instance, resources, cursor.model_dump_json()), unique)
    evaluate(task_supervisor, instance, resources, None)
    assert kafka_clients == []
    admin(instance, resources, "delete", unique)
