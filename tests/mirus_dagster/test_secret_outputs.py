"""A secret given by reference appears in no output of the platform.

One sentinel value is set in the environment and referenced from secret properties of a connector that then
really replicates: added through the `put_connector` job, started by the run_starter sensor as a replicator run,
shown in the `connectors` asset, run again as a `mirus task run` process. Then every output is searched for the
sentinel: the Dagster instance's whole directory (run configs, event logs with asset metadata, compute logs),
what the test process printed and logged (librdkafka included), the `mirus task run` log file, `mirus` command
output, every row of the platform database, and every REST API response about the connector.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import dagster as dg
import pytest
import requests
from click.testing import CliRunner
from sqlalchemy import Engine, MetaData, select

from mirus.api.auth import ApiSettings
from mirus.cli.main import main as mirus
from mirus.waiting import wait_until
from mirus_dagster.constants import CONNECTORS_ASSET
from mirus_dagster.definitions import admin_jobs, run_starter
from mirus_dagster.settings import StackEndpoints
from replicator.configuration.connector import load
from replicator.state.store import Store
from tests.fixtures.api_helpers import serve_api
from tests.fixtures.dagster_runs import InProcessRun, evaluate, files_containing, requests_for, watched
from tests.fixtures.engine_helpers import connector_properties, step_failure_message
from tests.fixtures.kafka_helpers import consume_all, create_topics, produce

JOBS = {job.name: job for job in admin_jobs}
SECRET_ENV = "MIRUS_TEST_LEAK_SENTINEL"


@pytest.fixture
def sentinel(monkeypatch: pytest.MonkeyPatch) -> str:
    value = f"sentinel-{uuid.uuid4().hex}"
    monkeypatch.setenv(SECRET_ENV, value)
    return value


def rest_api_responses(stack: StackEndpoints, store: Store, connector: str, properties: dict) -> list[str]:
    """Every answer of the REST API about `connector` (list, show, config, tasks, status, validation, a refusal)."""
    with serve_api(store, ApiSettings(), stack.destination_bootstrap_servers) as api:
        return [
            requests.get(f"{api}/connectors?expand=info&expand=status", timeout=30).text,
            requests.get(f"{api}/connectors/{connector}", timeout=30).text,
            requests.get(f"{api}/connectors/{connector}/config", timeout=30).text,
            requests.get(f"{api}/connectors/{connector}/tasks", timeout=30).text,
            requests.get(f"{api}/connectors/{connector}/status", timeout=30).text,
            requests.put(
                f"{api}/connector-plugins/MirusSourceConnector/config/validate", json=properties, timeout=30
            ).text,
            requests.put(
                f"{api}/connectors/{connector}/config", json={**properties, "tasks.max": "x"}, timeout=30
            ).text,  # a refusal
            requests.get(f"{api}/metrics", timeout=30).text,
        ]


def database_rows(engine: Engine) -> str:
    metadata = MetaData()
    metadata.reflect(engine)
    with engine.connect() as conn:
        return "\n".join(str(row) for table in metadata.sorted_tables for row in conn.execute(select(table)))


def test_a_referenced_secret_reaches_the_clients_and_no_output(
    instance: dg.DagsterInstance,
    resources: dict,
    stack: StackEndpoints,
    db_engine: Engine,
    unique: str,
    sentinel: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)
    reference = f"${{env:{SECRET_ENV}}}"
    create_topics(stack.source_bootstrap_servers, {unique: 2})
    create_topics(stack.destination_bootstrap_servers, {f"{unique}.copy": 2})
    produce(
        stack.source_bootstrap_servers, [{"topic": unique, "partition": i % 2, "value": b"%d" % i} for i in range(20)]
    )
    properties = connector_properties(
        stack,
        unique,
        **{
            "topics.whitelist": unique,
            "destination.topic.name.suffix": ".copy",
            "monitor.poll.wait.ms": "100",
            # PLAINTEXT clusters ignore these credentials, but every client is built with them.
            "consumer.security.protocol": "PLAINTEXT",
            "consumer.sasl.password": reference,
            "destination.consumer.sasl.password": reference,
            "producer.ssl.key.password": reference,
        },
    )

    # Through the platform: the launchpad job, the run_starter sensor, a replicator run, the connectors asset.
    put = JOBS["put_connector"].execute_in_process(
        run_config={"ops": {"store_connector": {"config": {"properties": properties}}}},
        instance=instance,
        resources=resources,
        raise_on_error=False,
    )
    assert put.success
    watched(Store(db_engine), unique)  # the metadata watcher's round: the task is assigned
    request = requests_for(evaluate(run_starter, instance, resources, None), unique)[0]
    run = InProcessRun(instance, resources, request)
    assert len(consume_all(stack.destination_bootstrap_servers, f"{unique}.copy", 2, expected=20)) == 20
    pause = JOBS["pause_connector"].execute_in_process(
        run_config={"ops": {"pause_connector_op": {"config": {"name": unique}}}},
        instance=instance,
        resources=resources,
    )
    assert pause.success and run.join().success

    # The same task as a `mirus task run` process, and the operator's commands.
    store = Store(db_engine)
    store.set_connector_state(unique, "RUNNING")
    env = {**os.environ, **stack.as_env()}
    log_file = tmp_path / "task.log"
    with open(log_file, "wb") as out:
        task = subprocess.Popen(
            [sys.executable, "-m", "mirus.cli.main", "task", "run", unique, "0"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    wait_until(lambda: b"replicating" in log_file.read_bytes(), what="the task process replicating")
    task.send_signal(signal.SIGINT)
    assert task.wait(30) == 0
    runner = CliRunner()
    cli_output = [
        runner.invoke(mirus, ["stack", "status"], env=stack.as_env()).output,
        runner.invoke(
            mirus,
            [
                "verify",
                "--topic",
                f"{unique}:{unique}.copy",
                "--idle-seconds",
                "1",
                "--source-config",
                f"sasl.password={sentinel}",
                "--source-config",
                "security.protocol=PLAINTEXT",
            ],
            env=stack.as_env(),
        ).output,
    ]

    # The secret was really resolved into the clients' settings: a leak would have had something to leak.
    resolved = load(store.get_connector(unique).properties)
    assert resolved.source_client["sasl.password"] == sentinel
    assert resolved.producer_settings(0)["ssl.key.password"] == sentinel

    # ... and it is nowhere in what the platform produced.
    leaks = {
        "Dagster instance files (runs, run configs, event logs, asset metadata, compute logs)": files_containing(
            Path(instance.root_directory), sentinel.encode()
        ),
        "test process output (librdkafka included)": [t for t in capfd.readouterr() if sentinel in t],
        "Python log records": [r.getMessage() for r in caplog.records if sentinel in r.getMessage()],
        "mirus task run log file": [str(log_file)] if sentinel.encode() in log_file.read_bytes() else [],
        "mirus command output": [o for o in cli_output if sentinel in o],
        "platform database rows": [sentinel] if sentinel in database_rows(db_engine) else [],
        "REST API responses": [r for r in rest_api_responses(stack, store, unique, properties) if sentinel in r],
    }
    assert {where: found for where, found in leaks.items() if found} == {}
    # The search looked where configurations do appear: the reference itself is shown.
    shown = instance.get_latest_materialization_event(dg.AssetKey(CONNECTORS_ASSET)).asset_materialization.metadata
    assert reference in str(shown) and reference in database_rows(db_engine)
    assert files_containing(Path(instance.root_directory), reference.encode())
    JOBS["delete_connector"].execute_in_process(
        run_config={"ops": {"delete_connector_op": {"config": {"name": unique}}}},
        instance=instance,
        resources=resources,
    )


def test_a_rejected_literal_secret_does_not_stay_in_the_run_history(
    instance: dg.DagsterInstance, resources: dict, stack: StackEndpoints, db_engine: Engine, unique: str
) -> None:
    typed = f"typed-in-clear-{uuid.uuid4().hex}"
    properties = connector_properties(stack, unique, **{"topics.whitelist": unique, "producer.sasl.password": typed})

    put = JOBS["put_connector"].execute_in_process(
        run_config={"ops": {"store_connector": {"config": {"properties": properties}}}},
        instance=instance,
        resources=resources,
        raise_on_error=False,
    )

    assert not put.success
    failure = step_failure_message(put)
    assert "producer.sasl.password" in failure
    run = instance.get_run_by_id(put.run_id)
    assert run is not None and run.status == dg.DagsterRunStatus.FAILURE  # later status updates kept the mask
    stored = run.run_config["ops"]["store_connector"]["config"]["properties"]
    assert stored["producer.sasl.password"] == "********" and stored["name"] == unique
    history = [str(r.run_config) for r in instance.get_runs()] + [str(e) for e in instance.all_logs(put.run_id)]
    assert not [entry for entry in history if typed in entry]
    assert unique not in [c.name for c in Store(db_engine).list_connectors()]
