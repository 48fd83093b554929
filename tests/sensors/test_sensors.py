"""The sensors (`sensors/`): their decisions as plain functions, the failure webhook, and the monitor and the
supervisor on a real Dagster instance with real clusters and Postgres (the runs they request execute in-process)."""

import socket
import sys
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, TypedDict, Unpack

import dagster as dg
import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient
from sqlalchemy import Engine

from mirus.waiting import wait_until
from mirus_dagster.constants import (
    CONNECTOR_PARTITIONS,
    CONNECTORS_ASSET,
    TAG_CONNECTOR,
    TAG_REASON,
    TAG_TASK,
    WATCHER_JOB,
)
from mirus_dagster.dagster_resources import FailureWebhook, SupervisorPolicy
from mirus_dagster.definitions import run_starter, task_supervisor
from mirus_dagster.settings import StackEndpoints
from replicator.discovery.watcher import MetadataWatcher
from replicator.state.store import Store
from sensors.decisions import (
    HEALTHY_RUN_S,
    REPLICATING_RUN_S,
    TaskRunHistory,
    failure_streak,
    requested_restart,
    restart_backoff_s,
    restart_decision,
    start_decision,
)
from sensors.run_failure_alerts import post_webhook
from sensors.task_runs import PRIORITY_TAG, STANDBY_PRIORITY, task_run_requests
from tests.fixtures.dagster_runs import (
    InProcessRun,
    a_requested_run,
    admin,
    evaluate,
    evaluated,
    put,
    requests_for,
    watch,
    watched,
)
from tests.fixtures.engine_helpers import connector_properties
from tests.fixtures.kafka_helpers import consume_all, create_topics, produce

# -- failure alerts ----------------------------------------------------------------------------------------


def test_a_webhook_that_cannot_be_reached_is_reported_without_its_url() -> None:
    """The run-failure sensor logs why a post failed; the URL, which often holds a token, is never part of it."""
    with socket.socket() as closed:  # a port nobody listens on: bound, then released
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    url = f"http://127.0.0.1:{port}/hooks/T0KEN-s3cret"
    problem = post_webhook(FailureWebhook(url=url, timeout_s=2), {"text": "mirus: a run failed"})
    assert problem == "the webhook could not be reached (ConnectionRefusedError)"
    assert post_webhook(FailureWebhook(), {"text": "unset: nothing is posted"}) is None


# -- decisions (plain functions) ---------------------------------------------------------------------------

NOW = datetime(2026, 1, 1, tzinfo=UTC)


class HistoryFields(TypedDict, total=False):
    live_runs: int
    live_started_at: datetime | None
    latest_status: str | None
    latest_ended_at: datetime | None
    consecutive_failures: int
    latest_lived_s: float | None


def history(**kw: Unpack[HistoryFields]) -> TaskRunHistory:
    base = TaskRunHistory(
        live_runs=0, live_started_at=None, latest_status=None, latest_ended_at=None, consecutive_failures=0
    )
    return replace(base, **kw)


def test_the_monitor_starts_idle_tasks_and_leaves_failures_to_the_supervisor() -> None:
    assert start_decision(history()).launch
    assert start_decision(history(latest_status="SUCCESS")).launch
    assert start_decision(history(latest_status="CANCELED")).launch
    assert not start_decision(history(live_runs=1)).launch
    assert not start_decision(history(latest_status="FAILURE", consecutive_failures=1)).launch
    # With a warm standby a task wants two runs: the owner and the standby.
    assert start_decision(history(), wanted=2).runs == 2
    assert start_decision(history(live_runs=1, latest_status="SUCCESS"), wanted=2).runs == 1
    assert not start_decision(history(live_runs=2), wanted=2).launch


def test_standby_runs_queue_after_every_tasks_first_run() -> None:
    # Under the run queue's replicator limit, a task must never wait behind another task's standby.
    def priorities(runs: int, live: int) -> list[str | None]:
        return [r.tags.get(PRIORITY_TAG) for r in task_run_requests("c", 0, "why", runs, live)]

    assert priorities(2, 0) == [None, STANDBY_PRIORITY]  # the first run is the owner's: default priority
    assert priorities(1, 1) == [STANDBY_PRIORITY]  # a live run owns the task: the new one is a standby
    assert int(STANDBY_PRIORITY) < 0


def test_the_supervisor_replaces_a_crashed_run_while_its_standby_replicates() -> None:
    policy = {"lease_timeout_s": 30.0, "initial_backoff_s": 1.0, "max_backoff_s": 60.0}
    crashed = history(
        live_runs=1, live_started_at=NOW, latest_status="FAILURE", latest_ended_at=NOW, consecutive_failures=1
    )
    decision = restart_decision(crashed, NOW, NOW, wanted=2, **policy)
    assert decision.launch and decision.runs == 1 and not decision.replace_live_run
    assert not restart_decision(crashed, NOW, NOW, wanted=1, **policy).launch
    # Killed again and again: each time the standby took over and replicates, so no backoff builds up.
    again = history(
        live_runs=1, live_started_at=NOW, latest_status="FAILURE", latest_ended_at=NOW, consecutive_failures=6
    )
    later = NOW + timedelta(seconds=1)
    assert restart_decision(again, later, later, wanted=2, **policy).launch
    assert not restart_decision(again, NOW - timedelta(seconds=1), later, wanted=2, **policy).launch  # still down


def test_the_supervisor_backs_off_doubling_up_to_a_cap() -> None:
    assert [restart_backoff_s(n, 1.0, 60.0) for n in (1, 2, 3, 4, 8, 20)] == [0, 1, 2, 4, 60, 60]
    policy = {"lease_timeout_s": 30.0, "initial_backoff_s": 1.0, "max_backoff_s": 60.0}
    failed = history(latest_status="FAILURE", latest_ended_at=NOW, consecutive_failures=3)
    assert not restart_decision(failed, None, NOW + timedelta(seconds=1), **policy).launch
    assert restart_decision(failed, None, NOW + timedelta(seconds=2), **policy).launch
    once = history(latest_status="FAILURE", latest_ended_at=NOW, consecutive_failures=1)
    assert restart_decision(once, None, NOW, **policy).launch
    assert not restart_decision(history(latest_status="SUCCESS", latest_ended_at=NOW), None, NOW, **policy).launch


def test_a_crash_after_healthy_replication_restarts_at_once_however_many_came_before() -> None:
    healthy, crash = HEALTHY_RUN_S + 1, 2.0
    # Killed again and again, each time after replicating for a while: every replacement starts at once.
    assert failure_streak([("FAILURE", healthy)] * 5) == 1
    assert restart_backoff_s(failure_streak([("FAILURE", healthy)] * 5), 1.0, 60.0) == 0
    # A crash loop (each run dies soon after it started) backs off, until a healthy run or a success ends it.
    assert failure_streak([("FAILURE", crash)] * 3 + [("FAILURE", healthy), ("FAILURE", crash)]) == 4
    assert failure_streak([("FAILURE", crash), ("FAILURE", None), ("SUCCESS", crash), ("FAILURE", crash)]) == 2
    assert failure_streak([("CANCELED", crash), ("FAILURE", crash)]) == 0


def test_a_run_killed_while_replicating_is_replaced_at_once_even_deep_in_a_streak() -> None:
    policy = {"lease_timeout_s": 30.0, "initial_backoff_s": 1.0, "max_backoff_s": 60.0}
    # Killed again and again before its new standby started: no live run, six short-lived failures in a row.
    killed = history(
        latest_status="FAILURE", latest_ended_at=NOW, consecutive_failures=6, latest_lived_s=REPLICATING_RUN_S + 5
    )
    decision = restart_decision(killed, NOW - timedelta(seconds=1), NOW, wanted=2, **policy)
    assert decision.launch and decision.runs == 2  # heartbeating until it died: owner and standby at once
    # The same streak of runs that never heartbeated (or died within seconds of starting) is a crash loop.
    assert not restart_decision(killed, NOW - timedelta(minutes=5), NOW, wanted=2, **policy).launch
    assert not restart_decision(killed, None, NOW, wanted=2, **policy).launch
    young = history(latest_status="FAILURE", latest_ended_at=NOW, consecutive_failures=6, latest_lived_s=3.0)
    assert not restart_decision(young, NOW - timedelta(seconds=1), NOW, wanted=2, **policy).launch


def test_an_operator_restart_brings_a_failed_task_back_at_once() -> None:
    failed = history(latest_status="FAILURE", latest_ended_at=NOW, consecutive_failures=5)  # deep in backoff
    later = NOW + timedelta(seconds=1)
    assert requested_restart(failed, later)
    assert not requested_restart(failed, NOW - timedelta(seconds=1))  # asked before the run failed
    assert not requested_restart(failed, None)
    assert not requested_restart(history(live_runs=1, latest_status="FAILURE", latest_ended_at=NOW), later)
    assert not requested_restart(history(latest_status="SUCCESS", latest_ended_at=NOW), later)


def test_the_supervisor_replaces_a_live_run_that_stopped_heartbeating() -> None:
    policy = {"lease_timeout_s": 30.0, "initial_backoff_s": 1.0, "max_backoff_s": 60.0}
    live = history(live_runs=1, live_started_at=NOW)
    # A fresh run has not claimed its lease yet: the old heartbeat must not condemn it.
    assert not restart_decision(live, NOW - timedelta(minutes=5), NOW + timedelta(seconds=10), **policy).launch
    decision = restart_decision(live, NOW + timedelta(seconds=5), NOW + timedelta(seconds=40), **policy)
    assert decision.launch and decision.replace_live_run


# -- the platform on a real Dagster instance ---------------------------------------------------------------


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
    produce(
        stack.source_bootstrap_servers,
        [{"topic": first, "partition": i % 3, "key": b"%d" % i, "value": b"v%d" % i} for i in range(90)],
    )
    properties = connector_properties(
        stack,
        unique,
        **{
            "tasks.max": "2",
            "topics.regex": f"{unique}-.*",
            "destination.topic.name.suffix": ".copy",
            "task.standby.runs": "0",
            "consumer.sasl.password": "${env:TEST_SOURCE_PASSWORD}",
            "consumer.security.protocol": "PLAINTEXT",
        },
    )
    assert put(instance, resources, properties).success
    # The connectors asset shows the connector; the secret appears only as its reference.
    materialization = instance.get_latest_materialization_event(dg.AssetKey(CONNECTORS_ASSET)).asset_materialization
    assert unique in str(materialization.metadata["connectors"].value)
    shown = str(materialization.metadata)
    assert "hunter2-secret" not in shown and "${env:TEST_SOURCE_PASSWORD}" in shown
    assert unique in instance.get_dynamic_partitions(CONNECTOR_PARTITIONS)

    assert requests_for(evaluate(run_starter, instance, resources, None), unique) == []  # nothing assigned yet
    assert unique in [r.connector for r in watched(store, unique).changed]
    result = evaluated(run_starter, instance, resources, None)
    assert [r.job_name for r in result.run_requests if TAG_CONNECTOR not in r.tags] == [WATCHER_JOB]
    requests = requests_for(result, unique)
    assert sorted((r.tags[TAG_CONNECTOR], r.tags[TAG_TASK]) for r in requests) == [(unique, "0"), (unique, "1")]
    runs = [InProcessRun(instance, resources, r) for r in requests]
    copied = consume_all(stack.destination_bootstrap_servers, f"{first}.copy", 3, expected=90)
    assert sorted(r.value for r in copied) == sorted(b"v%d" % i for i in range(90))

    # Runs are live now: the monitor requests nothing more.
    live = dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED], tags={TAG_CONNECTOR: unique})
    wait_until(lambda: len(instance.get_runs(live)) == 2)
    assert requests_for(evaluate(run_starter, instance, resources, result.cursor), unique) == []

    # A topic created at the source is assigned and replicated by the running tasks, without a restart.
    create_topics(stack.destination_bootstrap_servers, {f"{second}.copy": 1})
    create_topics(stack.source_bootstrap_servers, {second: 1})
    produce(stack.source_bootstrap_servers, [{"topic": second, "value": b"new"}])
    cursor = result.cursor
    generation = store.get_connector(unique).assignment_generation
    watcher = MetadataWatcher(store)
    wait_until(
        lambda: watcher.watch_once() and store.get_connector(unique).assignment_generation > generation,
        what="a new generation",
    )
    assert [r.value for r in consume_all(stack.destination_bootstrap_servers, f"{second}.copy", 1, 1)] == [b"new"]

    assert admin(instance, resources, "pause", unique).success
    for run in runs:
        assert run.join().success
    assert requests_for(evaluate(run_starter, instance, resources, cursor), unique) == []  # paused
    assert admin(instance, resources, "resume", unique).success
    assert len(requests_for(evaluate(run_starter, instance, resources, cursor), unique)) == 2
    assert admin(instance, resources, "delete", unique).success
    assert unique not in instance.get_dynamic_partitions(CONNECTOR_PARTITIONS)
    assert admin(instance, resources, "pause", unique).success is False  # unknown now: a clear failure


def test_unreachable_source_backs_off_without_affecting_other_connectors(
    instance: dg.DagsterInstance, resources: dict, stack: StackEndpoints, db_engine: Engine, unique: str
) -> None:
    store = Store(db_engine)
    healthy, broken = f"{unique}-ok", f"{unique}-down"
    create_topics(stack.source_bootstrap_servers, {healthy: 1})
    create_topics(stack.destination_bootstrap_servers, {healthy: 1})
    assert put(instance, resources, connector_properties(stack, healthy, **{"topics.whitelist": healthy})).success
    unreachable = connector_properties(stack, broken, **{"topics.whitelist": "x"})
    unreachable["consumer.bootstrap.servers"] = "127.0.0.1:1"  # nothing listens there
    assert put(instance, resources, unreachable).success
    errors: list[tuple[str, str | None]] = []
    watcher = MetadataWatcher(store, on_error=lambda name, error: errors.append((name, error)))

    first = watcher.watch_once()

    assert (
        healthy in [r.connector for r in first.changed]
        and "source cluster metadata unavailable" in first.errors[broken]
    )
    assert [e for e in errors if e[0] == broken] == [(broken, first.errors[broken])]  # other tests' connectors too
    snapshot = store.latest_snapshot(broken, "source")
    assert snapshot is not None and "source cluster metadata unavailable" in snapshot.error
    assert watcher.watches[broken].failures == 1  # backing off: 1 s, then 2, 4 … 64 s
    assert watcher.watches[broken].retry_at > watcher.watches[healthy].retry_at
    result = evaluated(run_starter, instance, resources, None)
    assert [r.tags[TAG_CONNECTOR] for r in requests_for(result, healthy) + requests_for(result, broken)] == [
        healthy
    ] * 2
    # The reason is visible in the UI: the connectors asset lists it.
    shown = next(e for e in result.asset_events if e.asset_key == dg.AssetKey(CONNECTORS_ASSET))
    assert "source metadata: source cluster metadata unavailable" in str(shown.metadata["connectors"].value)
    for name in (healthy, broken):
        admin(instance, resources, "delete", name)


def test_a_connector_the_watcher_cannot_load_shows_why_until_it_can(
    instance: dg.DagsterInstance,
    resources: dict,
    stack: StackEndpoints,
    db_engine: Engine,
    unique: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Submitted with an env reference that resolved then; the variable is gone where the watcher runs. Not a
    # metadata error (no snapshot shows it): the watcher must put it where operators look.
    store = Store(db_engine)
    monkeypatch.setenv("MIRUS_TEST_SOURCE", stack.source_bootstrap_servers)
    props = connector_properties(stack, unique, **{"topics.whitelist": unique})
    props["consumer.bootstrap.servers"] = "${env:MIRUS_TEST_SOURCE}"
    assert put(instance, resources, props).success
    monkeypatch.delenv("MIRUS_TEST_SOURCE")

    failed = watch(store)

    assert "MIRUS_TEST_SOURCE" in failed.errors[unique]
    assert "MIRUS_TEST_SOURCE" in store.connector_statuses(unique)[0].flow_problems["watch"]
    result = evaluated(run_starter, instance, resources, None)
    shown = next(e for e in result.asset_events if e.asset_key == dg.AssetKey(CONNECTORS_ASSET))
    assert "watch: " in str(shown.metadata["connectors"].value)

    # Set again, a later watcher run (the one that showed the error has ended) clears it once it polls.
    monkeypatch.setenv("MIRUS_TEST_SOURCE", stack.source_bootstrap_servers)
    watched(store, unique)
    assert "watch" not in store.connector_statuses(unique)[0].flow_problems
    admin(instance, resources, "delete", unique)


def test_the_supervisor_restarts_a_failed_task(
    instance: dg.DagsterInstance, resources: dict, stack: StackEndpoints, db_engine: Engine, unique: str
) -> None:
    store, properties, request = a_requested_run(instance, resources, stack, db_engine, unique)
    # A real failure: the stored configuration no longer loads when the run starts (as one an older version stored
    # under rules it has since tightened). A connector deleted under the run would not do: that run ends SUCCESS.
    store.put_connector(unique, {**properties, "tasks.max": "0"}, 1)
    failed = InProcessRun(instance, resources, request).join()
    assert not failed.success
    error = failed.get_step_failure_events()[0].step_failure_data.error
    assert error is not None and "ConnectorConfigError: tasks.max" in error.to_string(), error
    assert put(instance, resources, properties).success
    # Assignment again (a watcher round can miss a slow broker: it is retried); the failed run is left alone.
    wait_until(lambda: watched(store, unique) and store.read_assignment(unique), what="the task assigned again")
    assert requests_for(evaluate(run_starter, instance, resources, None), unique) == []  # left to the supervisor

    restart = wait_until(
        lambda: requests_for(evaluate(task_supervisor, instance, resources, None), unique),
        timeout=60,
        what="a restart after the first backoff",
    )
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


def test_metadata_is_read_once_per_cluster_and_sensor_ticks_touch_no_cluster(
    instance: dg.DagsterInstance,
    resources: dict,
    stack: StackEndpoints,
    db_engine: Engine,
    unique: str,
    kafka_clients: list[str],
) -> None:
    store = Store(db_engine)
    create_topics(stack.source_bootstrap_servers, {unique: 1})
    create_topics(stack.destination_bootstrap_servers, {unique: 1})
    names = [f"{unique}-{i}" for i in range(3)]
    for name in names:  # three connectors reading the same two clusters; periodic duties not due during the test
        properties = connector_properties(stack, name, **{"topics.whitelist": unique, "monitor.poll.wait.ms": "600000"})
        assert put(instance, resources, properties).success
    assert "Consumer (no brokers)" in kafka_clients  # the submission checks judged the client settings
    kafka_clients.clear()
    watcher = MetadataWatcher(store)

    first = watcher.watch_once()
    assert set(names) <= {r.connector for r in first.changed}
    # One metadata request per cluster, however many connectors read it (their monitor duties use own clients).
    ours = (stack.source_bootstrap_servers, stack.destination_bootstrap_servers)
    assert {c: n for c, n in first.requests.items() if c in ours} == dict.fromkeys(ours, 1)
    kafka_clients.clear()
    second = watcher.watch_once()
    assert kafka_clients == [] and not set(names) & set(second.polled)  # nothing changed: nobody is polled
    assert second.requests == first.requests
    create_topics(stack.source_bootstrap_servers, {f"{unique}-other": 1})  # a topic none of them selects
    third = wait_until(lambda: (r := watcher.watch_once()).requests and r, what="a round")
    assert not set(names) & set(third.polled), "a topic nobody selects made connectors poll"

    # Sensor ticks create no Kafka client at all: they only start runs.
    kafka_clients.clear()  # the rounds above polled other tests' connectors for their periodic duties
    assert requests_for(evaluate(run_starter, instance, resources, None), names[0])
    evaluate(task_supervisor, instance, resources, None)
    assert kafka_clients == []
    for name in names:
        admin(instance, resources, "delete", name)
