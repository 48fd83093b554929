"""What an operator sees of the estate in Dagster: the `connectors` asset (current, bounded, with problems), admin
runs naming their connector, and the `connectors` dynamic partitions. A real Dagster instance with real clusters
and Postgres; runs execute in-process."""

from __future__ import annotations

import json

import dagster as dg
import pytest
from sqlalchemy import Engine

from mirus.waiting import wait_until
from mirus_dagster.constants import CONNECTOR_PARTITIONS, CONNECTORS_ASSET, TAG_CONNECTOR
from mirus_dagster.definitions import run_starter
from mirus_dagster.settings import StackEndpoints
from replicator.state.records import ConnectorRecord
from replicator.state.store import Store
from sensors.run_starter import RunStarterCursor
from tests.fixtures.dagster_runs import InProcessRun, admin, evaluate, put, requests_for, watched
from tests.fixtures.engine_helpers import connector_properties
from tests.fixtures.kafka_helpers import create_topics


def connectors_view(result: dg.SensorResult) -> str:
    """The `connectors` table as the asset page shows it, from what a monitor tick recorded."""
    events = [e for e in result.asset_events if e.asset_key == dg.AssetKey(CONNECTORS_ASSET)]
    assert events, "the connectors asset was not recorded"
    return str(events[-1].metadata["connectors"].value)


def row(view: str, connector: str) -> str:
    return next(line for line in view.splitlines() if line.startswith(f"| {connector} |"))


def test_the_view_shows_running_tasks_with_their_run_and_heartbeat_as_soon_as_they_claim(
    instance: dg.DagsterInstance, resources: dict, stack: StackEndpoints, db_engine: Engine, unique: str
) -> None:
    create_topics(stack.source_bootstrap_servers, {unique: 3})
    create_topics(stack.destination_bootstrap_servers, {unique: 3})
    # Without heartbeats, whose source topic would add a partition to every connector.
    properties = connector_properties(
        stack,
        unique,
        **{"topics.whitelist": unique, "tasks.max": "2", "emit.heartbeats.enabled": "false", "task.standby.runs": "0"},
    )
    assert put(instance, resources, properties).success
    watched(Store(db_engine), unique)
    first = evaluate(run_starter, instance, resources, None)
    runs = [InProcessRun(instance, resources, r) for r in requests_for(first, unique)]
    try:
        store = Store(db_engine)
        wait_until(lambda: all(store.lease_of(unique, t) for t in (0, 1)), 60, what="both tasks to claim their lease")

        # The next tick records the change at once: the tasks claimed their leases.
        view = connectors_view(evaluate(run_starter, instance, resources, first.cursor))

        line = row(view, unique)
        assert "| RUNNING | 3 |" in line, line
        for task in (0, 1):
            assert f"{task}: RUNNING" in line, line
        assert "UNASSIGNED" not in line and "heartbeat never" not in line and "no run" not in line, line
        live = instance.get_runs(dg.RunsFilter(tags={TAG_CONNECTOR: unique}, statuses=[dg.DagsterRunStatus.STARTED]))
        for run in live:
            assert f"(/runs/{run.run_id})" in line, line
        assert "heartbeat " in line and " UTC" in line and view.startswith("As of ")
        assert "replicates nothing" not in line
    finally:
        assert admin(instance, resources, "pause", unique).success
        for run in runs:
            run.join()
        admin(instance, resources, "delete", unique)


def test_the_view_is_recorded_again_while_tasks_run_so_heartbeats_stay_recent(
    instance: dg.DagsterInstance, resources: dict, stack: StackEndpoints, unique: str
) -> None:
    create_topics(stack.source_bootstrap_servers, {unique: 1})
    create_topics(stack.destination_bootstrap_servers, {unique: 1})
    assert put(instance, resources, connector_properties(stack, unique, **{"topics.whitelist": unique})).success
    first = evaluate(run_starter, instance, resources, None)
    unchanged = evaluate(run_starter, instance, resources, first.cursor)
    # The asset promises a view at most a minute old while tasks run: its last recording is made a minute old,
    # rather than waiting for one.
    cursor = RunStarterCursor.model_validate_json(unchanged.cursor)
    a_minute_old = cursor.model_copy(update={"reported_at": cursor.reported_at - 60}).model_dump_json()

    again = evaluate(run_starter, instance, resources, a_minute_old)

    assert not [e for e in unchanged.asset_events if e.asset_key.path == [CONNECTORS_ASSET]]
    assert [e.description for e in again.asset_events] == ["refresh (heartbeats and lag)"]
    admin(instance, resources, "delete", unique)


def test_a_connector_whose_destinations_are_missing_shows_it_as_a_problem(
    instance: dg.DagsterInstance, resources: dict, stack: StackEndpoints, db_engine: Engine, unique: str
) -> None:
    create_topics(stack.source_bootstrap_servers, {unique: 3})  # no destination topic, and none is created
    no_creation = {"topics.whitelist": unique, "topic.creation.enable": "false", "emit.heartbeats.enabled": "false"}
    assert put(instance, resources, connector_properties(stack, unique, **no_creation)).success
    watched(Store(db_engine), unique)

    line = row(connectors_view(evaluate(run_starter, instance, resources, None)), unique)

    assert "| RUNNING | 0 |" in line, line
    assert f"missing at destination, not replicated: {unique}[0], {unique}[1], {unique}[2]" in line, line
    assert "replicates nothing: no source partition is assigned" in line, line
    admin(instance, resources, "delete", unique)


def test_the_view_stays_small_whatever_a_connector_holds(
    instance: dg.DagsterInstance, resources: dict, stack: StackEndpoints, unique: str
) -> None:
    huge = "x" * 100_000
    properties = connector_properties(stack, unique, **{"topics.whitelist": unique, "consumer.client.id": huge})
    result = put(instance, resources, properties)
    assert result.success

    event = instance.get_latest_materialization_event(dg.AssetKey(CONNECTORS_ASSET))
    metadata = event.asset_materialization.metadata
    size = len(json.dumps({k: str(v.value) for k, v in metadata.items()}))
    assert size < 20_000, f"{size} characters of metadata"
    assert "(100000 characters)" in str(metadata["configs (secrets masked)"].value)
    assert unique in str(metadata["connectors"].value)
    admin(instance, resources, "delete", unique)


def test_admin_runs_name_the_connector_they_act_on(
    instance: dg.DagsterInstance, resources: dict, stack: StackEndpoints, unique: str
) -> None:
    assert put(instance, resources, connector_properties(stack, unique, **{"topics.whitelist": unique})).success
    for action in ("pause", "resume", "restart", "delete"):
        assert admin(instance, resources, action, unique).success

    runs = instance.get_runs(dg.RunsFilter(tags={TAG_CONNECTOR: unique}))

    assert sorted(r.job_name for r in runs) == sorted(
        ["put_connector", "pause_connector", "resume_connector", "restart_connector", "delete_connector"]
    )


def test_a_connector_added_while_the_monitor_evaluates_keeps_its_partition(
    instance: dg.DagsterInstance,
    resources: dict,
    stack: StackEndpoints,
    db_engine: Engine,
    unique: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`put_connector` stores the connector, then registers its partition; a monitor tick that read the connectors
    just before must not delete that partition. The interleaving is forced (timing is what no real part can be
    made to produce on demand): the put completes right after the tick read the connectors."""
    store = Store(db_engine)
    properties = connector_properties(stack, unique, **{"topics.whitelist": unique})
    original = Store.list_connectors

    def put_completes_meanwhile(self: Store) -> list[ConnectorRecord]:
        records = original(self)
        if unique not in instance.get_dynamic_partitions(CONNECTOR_PARTITIONS):
            store.put_connector(unique, properties, 1)
            instance.add_dynamic_partitions(CONNECTOR_PARTITIONS, [unique])
        return records

    monkeypatch.setattr(Store, "list_connectors", put_completes_meanwhile)
    result = evaluate(run_starter, instance, resources, None)
    monkeypatch.undo()

    deleted = [r for r in result.dynamic_partitions_requests if isinstance(r, dg.DeleteDynamicPartitionsRequest)]
    assert not [r for r in deleted if unique in r.partition_keys], deleted
    admin(instance, resources, "delete", unique)
