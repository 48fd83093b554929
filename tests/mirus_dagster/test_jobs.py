"""The jobs (`mirus_dagster/jobs.py`) on a real Dagster instance with real clusters and Postgres, runs in-process:
`put_connector` refuses a bad config without storing anything, and a replicator run whose connector is gone ends
saying so."""

import dagster as dg
from sqlalchemy import Engine

from mirus_dagster.settings import StackEndpoints
from replicator.state.store import Store
from tests.fixtures.dagster_runs import InProcessRun, a_requested_run, admin, put
from tests.fixtures.engine_helpers import connector_properties, step_failure_message


def test_a_rejected_config_fails_the_run_and_changes_nothing(
    instance: dg.DagsterInstance, resources: dict, stack: StackEndpoints, db_engine: Engine, unique: str
) -> None:
    store = Store(db_engine)
    good = connector_properties(stack, unique, **{"topics.whitelist": unique})
    assert put(instance, resources, good).success

    bad = {**good, "tasks.max": "zero", "topics.regex": "("}
    result = put(instance, resources, bad)

    assert not result.success
    failure = step_failure_message(result)
    assert "tasks.max" in failure and "topics.regex" in failure and "nothing was stored" in failure
    record = store.get_connector(unique)
    assert record.version == 1 and record.properties == good


def test_a_literal_secret_is_refused_from_the_launchpad(
    instance: dg.DagsterInstance, resources: dict, stack: StackEndpoints, db_engine: Engine, unique: str
) -> None:
    properties = connector_properties(stack, unique, **{"topics.whitelist": unique, "consumer.sasl.password": "pw1"})

    result = put(instance, resources, properties)

    assert not result.success
    failure = step_failure_message(result)
    assert "consumer.sasl.password" in failure and "${env:NAME}" in failure and "pw1" not in failure
    assert unique not in [c.name for c in Store(db_engine).list_connectors()]


def test_a_run_whose_connector_was_deleted_before_it_started_ends_success_saying_so(
    instance: dg.DagsterInstance, resources: dict, stack: StackEndpoints, db_engine: Engine, unique: str
) -> None:
    """A run the monitor requested a moment before the connector was deleted: an operator's action, not red."""
    *_, request = a_requested_run(instance, resources, stack, db_engine, unique)
    assert admin(instance, resources, "delete", unique).success
    result = InProcessRun(instance, resources, request).join()
    assert result.success
    messages = [event.user_message for event in instance.all_logs(result.run_id)]
    assert f"task {unique}-0 ended: connector deleted" in messages, messages[-5:]
