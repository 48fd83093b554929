"""`mirus connectors`, `mirus offsets` and `mirus api` against real clusters and Postgres."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import requests
from click.testing import CliRunner, Result
from confluent_kafka import Consumer, TopicPartition
from sqlalchemy import Engine

from mirus.cli.main import main
from mirus.local.stack import free_port
from mirus.waiting import wait_until
from mirus_dagster.settings import StackEndpoints
from replicator.discovery.monitor import KafkaMonitor
from replicator.engine.task import TaskExit
from replicator.state.store import Store
from tests.fixtures.engine_helpers import TaskThread, connector_properties
from tests.fixtures.kafka_helpers import consume_all, create_topics, produce


@pytest.fixture
def mirus(stack: StackEndpoints, tmp_path: Path) -> Callable[..., Result]:
    """Runs `mirus ARGS...` in-process against the test stack."""
    runner = CliRunner()
    env = {**stack.as_env(), "MIRUS_STATE_DIR": str(tmp_path / "state")}

    def run(*args: str, input: str | None = None, ok: bool = True) -> Result:
        result = runner.invoke(main, list(args), input=input, env=env, catch_exceptions=False)
        if ok:
            assert result.exit_code == 0, result.output
        return result

    return run


def test_connectors_commands_share_the_launchpad_validation(
    mirus, stack: StackEndpoints, store: Store, unique: str, tmp_path: Path
) -> None:
    properties = tmp_path / "connector.properties"
    properties.write_text(
        f"name={unique}\nconnector.class=com.salesforce.mirus.MirusSourceConnector\ntopics.whitelist={unique}\n"
        f"consumer.bootstrap.servers={stack.source_bootstrap_servers}\n"
        f"destination.consumer.bootstrap.servers={stack.destination_bootstrap_servers}\n"
    )
    assert (
        mirus("connectors", "put", "--from-file", str(properties)).output == f"connector {unique} created (version 1)\n"
    )
    config = connector_properties(stack, unique, **{"topics.whitelist": unique, "tasks.max": "2"})
    assert "updated (version 2)" in mirus("connectors", "put", unique, input=json.dumps(config)).output
    assert store.get_connector(unique).tasks_max == 2
    assert f"{unique}\tRUNNING\tversion 2" in mirus("connectors", "list").output
    shown = json.loads(mirus("connectors", "get", unique).output)
    assert shown["config"] == config and shown["state"] == "RUNNING"

    refused = mirus(
        "connectors", "put", input=json.dumps({**config, "tasks.max": "0", "consumer.sasl.password": "pw"}), ok=False
    )
    assert refused.exit_code == 1 and "nothing was stored" in refused.output
    assert "tasks.max" in refused.output and "consumer.sasl.password" in refused.output
    assert store.get_connector(unique).version == 2

    mirus("connectors", "pause", unique)
    assert store.get_connector(unique).state == "PAUSED"
    mirus("connectors", "resume", unique)
    assert store.get_connector(unique).state == "RUNNING"
    mirus("connectors", "restart", unique)
    assert store.connector_head(unique).restart_requested_at is not None
    mirus("connectors", "delete", unique)
    assert store.connector_head(unique) is None
    missing = mirus("connectors", "pause", unique, ok=False)
    assert missing.exit_code == 1 and "does not exist" in missing.output


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_offsets_export_reset_import_round_trip(
    mirus, stack: StackEndpoints, store: Store, unique: str, tmp_path: Path, fmt: str
) -> None:
    create_topics(stack.source_bootstrap_servers, {unique: 3})
    create_topics(stack.destination_bootstrap_servers, {unique: 3})
    produce(
        stack.source_bootstrap_servers, [{"topic": unique, "partition": i % 3, "value": b"%d" % i} for i in range(30)]
    )
    properties = connector_properties(stack, unique, **{"topics.whitelist": unique, "emit.heartbeats.enabled": "false"})
    mirus("connectors", "put", input=json.dumps(properties))
    KafkaMonitor(store).poll(unique)
    runner = TaskThread.start(store, unique)
    wait_until(lambda: store.load_offsets(unique) == {(unique, p): 10 for p in range(3)}, what="offsets committed")

    exported = mirus("offsets", "describe", unique, "--format", fmt).output
    if fmt == "csv":
        assert exported == "".join(f"{unique},{unique},{p},10\n" for p in range(3))
    else:
        assert [json.loads(line) for line in exported.splitlines()] == [
            {"connectorId": unique, "topic": unique, "partition": p, "offset": 10} for p in range(3)
        ]
    saved = tmp_path / f"offsets.{fmt}"
    saved.write_text(exported)

    refused = mirus("offsets", "reset", "--from-file", str(saved), "--format", fmt, ok=False)
    assert refused.exit_code == 1 and "pause it first" in refused.output and "no offsets were changed" in refused.output
    mirus("connectors", "pause", unique)
    assert runner.join() is TaskExit.PAUSED

    # Forget every offset (empty / null offsets), then import the export again.
    nulls = (
        "".join(f"{unique},{unique},{p},\n" for p in range(3))
        if fmt == "csv"
        else "".join(
            json.dumps({"connectorId": unique, "topic": unique, "partition": p, "offset": None}, separators=(",", ":"))
            + "\n"
            for p in range(3)
        )
    )
    mirus("offsets", "reset", "--from-file", "-", "--format", fmt, input=nulls)
    assert store.load_offsets(unique) == {}
    assert mirus("offsets", "describe", unique, "--format", fmt).output == ""
    assert mirus("offsets", "describe", unique, "--show-nulls", "--format", fmt).output == nulls
    mirus("offsets", "reset", "--from-file", str(saved), "--format", fmt)
    assert mirus("offsets", "describe", unique, "--format", fmt).output == exported

    # The imported offsets are where replication resumes: nothing is copied twice.
    mirus("connectors", "resume", unique)
    produce(stack.source_bootstrap_servers, [{"topic": unique, "partition": p, "value": b"new"} for p in range(3)])
    runner = TaskThread.start(store, unique)
    copied = consume_all(stack.destination_bootstrap_servers, unique, 3, expected=33)
    runner.finish()
    assert len(copied) == 33

    bad = mirus("offsets", "reset", "--from-file", "-", "--format", fmt, input="garbage\n", ok=False)
    assert bad.exit_code == 1 and "line 1" in bad.output


def test_import_group_seeds_offsets_from_a_mirrormaker_consumer_group(
    mirus, stack: StackEndpoints, store: Store, unique: str
) -> None:
    topic, group = unique, f"{unique}-mirrormaker"
    create_topics(stack.source_bootstrap_servers, {topic: 2})
    create_topics(stack.destination_bootstrap_servers, {f"{topic}.mirror": 2})
    produce(
        stack.source_bootstrap_servers, [{"topic": topic, "partition": i % 2, "value": b"%d" % i} for i in range(20)]
    )
    # What MirrorMaker left behind: its group's committed positions (assign() + commit, no group membership needed).
    consumer = Consumer(
        {"bootstrap.servers": stack.source_bootstrap_servers, "group.id": group, "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, 0, 0), TopicPartition(topic, 1, 0)])
    consumer.commit(offsets=[TopicPartition(topic, 0, 7), TopicPartition(topic, 1, 4)], asynchronous=False)
    consumer.close()

    config = connector_properties(
        stack, unique, **{"topics.whitelist": topic, "destination.topic.name.suffix": ".mirror"}
    )
    mirus("connectors", "put", "--paused", input=json.dumps(config))
    assert store.get_connector(unique).state == "PAUSED"
    dry = mirus("offsets", "import-group", unique, group, "--dry-run")
    assert dry.stdout == f"{unique},{topic},0,7\n{unique},{topic},1,4\n" and store.load_offsets(unique) == {}
    imported = mirus("offsets", "import-group", unique, group, "--format", "json")
    assert [json.loads(line)["offset"] for line in imported.stdout.splitlines()] == [7, 4]
    assert store.load_offsets(unique) == {(topic, 0): 7, (topic, 1): 4}

    mirus("connectors", "resume", unique)
    refused = mirus("offsets", "import-group", unique, group, ok=False)
    assert refused.exit_code == 1 and "pause it" in refused.output
    KafkaMonitor(store).poll(unique)
    runner = TaskThread.start(store, unique)
    copied = consume_all(stack.destination_bootstrap_servers, f"{topic}.mirror", 2, expected=20 - 7 - 4)
    runner.finish()
    assert sorted(int(r.value) for r in copied) == sorted(
        [i for i in range(20) if (i % 2 == 0 and i // 2 >= 7) or (i % 2 == 1 and i // 2 >= 4)]
    )

    unknown_group = mirus("offsets", "import-group", unique, f"{group}-never", ok=False)
    assert unknown_group.exit_code == 1 and "no committed offsets" in unknown_group.output


def test_mirus_api_runs_on_its_own_with_host_and_port(stack: StackEndpoints, db_engine: Engine, tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, **stack.as_env(), "MIRUS_STATE_DIR": str(tmp_path), "MIRUS_API_HOST": "127.0.0.1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "mirus.cli.main", "api", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: _answers(f"http://127.0.0.1:{port}/"), timeout=60, what="mirus api to answer")
        assert isinstance(requests.get(f"http://127.0.0.1:{port}/connectors").json(), list)
        assert "mirus_connector_tasks" in requests.get(f"http://127.0.0.1:{port}/metrics").text
    finally:
        proc.terminate()
        proc.wait(60)


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.ConnectionError:
        return False
