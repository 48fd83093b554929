"""An operator pauses one source partition by hand: it stops while the others flow, stays paused across a task
restart, and resumes in order with nothing lost; the same control through the REST API, the CLI and the launchpad
job, shown with its reason in the `connectors` asset."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import dagster as dg
import pytest
import requests
from click.testing import CliRunner
from sqlalchemy import Engine

from assets.connectors import connectors_markdown
from mirus.api.auth import ApiSettings
from mirus.cli.main import main
from mirus.waiting import wait_until
from mirus_dagster.constants import CONNECTORS_ASSET, PAUSE_PARTITION_JOB, RESUME_PARTITION_JOB
from mirus_dagster.definitions import admin_jobs, run_starter
from mirus_dagster.settings import StackEndpoints
from replicator.configuration import administration
from replicator.engine.task import TaskExit
from replicator.state.records import OPERATOR_PAUSE, PartitionPauseError
from replicator.state.store import Store
from tests.fixtures.api_helpers import serve_api
from tests.fixtures.dagster_runs import evaluate
from tests.fixtures.engine_helpers import TaskThread, connector_properties, create_connector
from tests.fixtures.kafka_helpers import Traffic, create_topics
from tests.fixtures.replica_check import check_replica


@pytest.fixture(scope="module")
def api(stack: StackEndpoints, db_engine: Engine) -> Iterator[str]:
    with serve_api(Store(db_engine), ApiSettings(), stack.destination_bootstrap_servers) as url:
        yield url


def _pause_event(runner: TaskThread, topic: str, reason: str) -> bool:
    return f"paused {topic}[0]: {OPERATOR_PAUSE}: {reason}" in runner.events


def test_a_partition_paused_by_hand_stops_alone_stays_paused_across_a_restart_and_resumes_losing_nothing(
    stack: StackEndpoints, store: Store, unique: str
) -> None:
    topic = unique
    create_topics(stack.source_bootstrap_servers, {topic: 2})
    create_topics(stack.destination_bootstrap_servers, {topic: 2})
    create_connector(
        store,
        connector_properties(stack, unique, **{"topics.whitelist": topic}),
        {0: [(topic, 0), (topic, 1)]},
    )
    traffic = Traffic(stack.source_bootstrap_servers, {topic: 2}, rate=400)
    runner = TaskThread.start(store, unique)
    try:
        committed = lambda p: store.load_offsets(unique).get((topic, p), 0)  # noqa: E731
        wait_until(lambda: committed(0) >= 100 and committed(1) >= 100, timeout=60, what="both partitions to flow")

        administration.pause_partition(store, unique, (topic, 0), "  poison record at 1234 ")
        wait_until(lambda: _pause_event(runner, topic, "poison record at 1234"), timeout=10, what="the pause")
        # What it had produced is acknowledged and committed (within a commit interval); then it stays there while
        # the other partition flows on.
        start = committed(1)
        wait_until(lambda: committed(1) >= start + 400, timeout=30, what="p1 to flow")
        held = committed(0)
        wait_until(lambda: committed(1) >= start + 800, timeout=30, what="p1 to flow on")
        assert committed(0) == held < traffic.snapshot()[(topic, 0)] - 300
        status = store.connector_statuses(unique)[0]
        assert status.operator_pauses[(topic, 0)].reason == "poison record at 1234"

        # A new instance of the task (a restart, or a standby taking over) starts it held.
        assert runner.finish() is TaskExit.STOPPED
        runner = TaskThread.start(store, unique)
        wait_until(lambda: _pause_event(runner, topic, "poison record at 1234"), timeout=30, what="the pause again")
        before = committed(1)
        wait_until(lambda: committed(1) >= before + 200, timeout=30, what="p1 to flow after the restart")
        assert committed(0) == held

        assert administration.resume_partition(store, unique, (topic, 0))
        resumed = f"resumed {topic}[0] at offset {held} (was: {OPERATOR_PAUSE}: poison record at 1234)"
        wait_until(lambda: resumed in runner.events, timeout=10, what="the resume")
        written = traffic.stop()
        wait_until(lambda: committed(0) + committed(1) >= written, timeout=60, what="everything to be committed")
        assert runner.finish() is TaskExit.STOPPED
    finally:
        traffic.stopped.set()
        runner.stop.set()
    # Every record once, in source order: the pause skipped nothing and the resume wrote nothing twice.
    check_replica(
        stack.source_bootstrap_servers, topic, stack.destination_bootstrap_servers, partitions=2, written=written
    ).assert_exactly_once()
    assert not store.connector_statuses(unique)[0].operator_pauses


def test_a_pause_naming_a_partition_the_connector_does_not_replicate_is_refused_and_changes_nothing(
    stack: StackEndpoints, store: Store, unique: str
) -> None:
    create_connector(store, connector_properties(stack, unique, **{"topics.whitelist": unique}), {0: [(unique, 0)]})
    head = store.connector_head(unique)
    with pytest.raises(PartitionPauseError, match=rf"does not replicate {unique}\[7\]: its assignment holds 1"):
        administration.pause_partition(store, unique, (unique, 7), "why not")
    with pytest.raises(PartitionPauseError, match="a reason is required"):
        administration.pause_partition(store, unique, (unique, 0), "   ")
    with pytest.raises(PartitionPauseError, match="at most 1000"):
        administration.pause_partition(store, unique, (unique, 0), "x" * 1001)
    assert store.connector_head(unique) == head and not store.partition_pauses(unique)
    assert not administration.resume_partition(store, unique, (unique, 0))


def test_the_rest_api_cli_and_launchpad_pause_and_resume_a_partition_and_the_asset_shows_why(
    stack: StackEndpoints,
    store: Store,
    api: str,
    unique: str,
    resources: dict[str, object],
    instance: dg.DagsterInstance,
    tmp_path: Path,
) -> None:
    create_connector(store, connector_properties(stack, unique, **{"topics.whitelist": unique}), {0: [(unique, 0)]})
    base = f"{api}/connectors/{unique}/partitions"

    # REST
    refused = requests.put(f"{base}/{unique}/3/pause", json={"reason": "no such partition"}, timeout=30)
    assert refused.status_code == 400 and "does not replicate" in refused.json()["message"]
    assert requests.put(f"{base}/{unique}/0/pause", json={}, timeout=30).status_code == 400
    assert requests.put(f"{base}/{unique}/0/pause", json={"reason": "by REST"}, timeout=30).status_code == 202
    listed = requests.get(f"{base}/paused", timeout=30).json()
    assert [(p["topic"], p["partition"], p["reason"]) for p in listed] == [(unique, 0, "by REST")]
    assert requests.put(f"{base}/{unique}/0/resume", timeout=30).status_code == 202
    assert requests.put(f"{base}/{unique}/0/resume", timeout=30).status_code == 404
    assert requests.get(f"{api}/connectors/no-such/partitions/paused", timeout=30).status_code == 404

    # CLI
    cli = CliRunner(env={**stack.as_env(), "MIRUS_STATE_DIR": str(tmp_path / "state")})
    done = cli.invoke(main, ["connectors", "pause-partition", unique, unique, "0", "--reason", "by CLI"])
    assert done.exit_code == 0, done.output
    shown = cli.invoke(main, ["connectors", "paused-partitions", unique])
    assert f"{unique}[0]" in shown.output and "by CLI" in shown.output
    assert cli.invoke(main, ["connectors", "resume-partition", unique, unique, "0"]).exit_code == 0
    again = cli.invoke(main, ["connectors", "resume-partition", unique, unique, "0"])
    assert again.exit_code == 1 and "is not paused by an operator" in again.output

    # The launchpad's jobs, and the asset they record
    jobs = {job.name: job for job in admin_jobs}
    config: dict[str, object] = {"name": unique, "topic": unique, "partition": 0, "reason": "by the launchpad"}
    result = jobs[PAUSE_PARTITION_JOB].execute_in_process(
        run_config={"ops": {f"{PAUSE_PARTITION_JOB}_op": {"config": config}}},
        resources=resources,
        instance=instance,
    )
    assert result.success
    recorded = result.asset_materializations_for_node(f"{PAUSE_PARTITION_JOB}_op")[0]
    assert f"{unique}[0] {OPERATOR_PAUSE} at " in recorded.metadata["connectors"].value
    assert "by the launchpad" in recorded.metadata["connectors"].value
    del config["reason"]
    result = jobs[RESUME_PARTITION_JOB].execute_in_process(
        run_config={"ops": {f"{RESUME_PARTITION_JOB}_op": {"config": config}}},
        resources=resources,
        instance=instance,
    )
    assert result.success
    refused_run = jobs[PAUSE_PARTITION_JOB].execute_in_process(
        run_config={"ops": {f"{PAUSE_PARTITION_JOB}_op": {"config": {**config, "partition": 9, "reason": "x"}}}},
        resources=resources,
        instance=instance,
        raise_on_error=False,
    )
    assert not refused_run.success
    assert not store.partition_pauses(unique)
    status = store.connector_statuses(unique)[0]
    assert OPERATOR_PAUSE not in connectors_markdown([status], {}, {}, {}, datetime.now(UTC))


def test_a_pause_made_outside_dagster_is_recorded_on_the_connectors_asset_at_the_monitors_next_tick(
    stack: StackEndpoints, store: Store, unique: str, resources: dict[str, object], instance: dg.DagsterInstance
) -> None:
    create_connector(store, connector_properties(stack, unique, **{"topics.whitelist": unique}), {0: [(unique, 0)]})
    first = evaluate(run_starter, instance, resources, None)
    assert isinstance(first, dg.SensorResult)

    administration.pause_partition(store, unique, (unique, 0), "replaying a bad deploy")
    after = evaluate(run_starter, instance, resources, first.cursor)

    assert isinstance(after, dg.SensorResult)
    recorded = [e for e in after.asset_events if e.asset_key == dg.AssetKey(CONNECTORS_ASSET)]
    table = str(recorded[-1].metadata["connectors"].value)
    line = next(row for row in table.splitlines() if row.startswith(f"| {unique} |"))
    assert f"{unique}[0] {OPERATOR_PAUSE} at " in line and "replaying a bad deploy" in line
