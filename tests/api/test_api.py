"""The Kafka Connect REST API over real HTTP (uvicorn on a free port) with real clusters and Postgres."""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, text

from mirus.api.app import ConnectApi
from mirus.api.auth import ApiSettings, Credentials
from mirus.waiting import wait_until
from mirus_dagster.constants import CONNECTOR_PARTITIONS, CONNECTORS_ASSET
from mirus_dagster.definitions import run_starter
from mirus_dagster.settings import StackEndpoints
from replicator.configuration.properties import PROPERTIES
from replicator.configuration.secrets import ENV_ALLOWED_PATHS
from replicator.discovery.monitor import KafkaMonitor
from replicator.engine.task import TaskExit
from replicator.state.store import Store
from tests.fixtures.api_helpers import serve_api
from tests.fixtures.engine_helpers import TaskThread, connector_properties, private_database
from tests.fixtures.kafka_helpers import consume_all, create_topics, produce


@pytest.fixture(scope="module")
def api(stack: StackEndpoints, db_engine: Engine) -> Iterator[str]:
    with serve_api(Store(db_engine), ApiSettings(), stack.destination_bootstrap_servers) as url:
        yield url


def quick_start_config(stack: StackEndpoints, name: str, topic: str) -> dict[str, str]:
    """The Mirus README's quick-start request body, with the test clusters' addresses and topic."""
    return {
        "name": name,
        "connector.class": "com.salesforce.mirus.MirusSourceConnector",
        "tasks.max": "5",
        "topics.whitelist": topic,
        "destination.topic.name.suffix": ".mirror",
        "destination.consumer.bootstrap.servers": stack.destination_bootstrap_servers,
        "consumer.bootstrap.servers": stack.source_bootstrap_servers,
        "consumer.client.id": "mirus-quickstart",
        "consumer.key.deserializer": "org.apache.kafka.common.serialization.ByteArrayDeserializer",
        "consumer.value.deserializer": "org.apache.kafka.common.serialization.ByteArrayDeserializer",
    }


def values(n: int, prefix: str) -> list[dict]:
    return [{"topic": prefix, "value": f"{prefix}-{i}".encode()} for i in range(n)]


def test_the_mirus_quick_start_works_unchanged_and_pause_stops_the_flow(
    api: str, stack: StackEndpoints, store: Store, unique: str
) -> None:
    topic, name = unique, f"{unique}-source"
    root = requests.get(api)
    assert root.status_code == 200 and set(root.json()) == {"version", "commit", "kafka_cluster_id"}
    assert root.json()["kafka_cluster_id"]

    put = requests.put(f"{api}/connectors/{name}/config", json=quick_start_config(stack, name, topic))
    assert put.status_code == 201, put.text
    assert put.json() == {"name": name, "config": quick_start_config(stack, name, topic), "tasks": [], "type": "source"}
    assert name in requests.get(f"{api}/connectors").json()
    status = requests.get(f"{api}/connectors/{name}/status").json()
    assert status == {
        "name": name,
        "connector": {"state": "RUNNING", "worker_id": status["connector"]["worker_id"]},
        "tasks": [],
        "type": "source",
    }

    # "Create source and destination topics test and test.mirror"; the monitor finds them and assigns a task.
    create_topics(stack.source_bootstrap_servers, {topic: 1})
    create_topics(stack.destination_bootstrap_servers, {f"{topic}.mirror": 1})
    KafkaMonitor(store).poll(name)
    # The source's `heartbeats` topic (written by monitors of earlier tests) may be assigned to another task.
    owner = next(t for t, partitions in store.read_assignment(name).items() if (topic, 0) in partitions)

    def task_status() -> dict:
        tasks = requests.get(f"{api}/connectors/{name}/status").json()["tasks"]
        return next(t for t in tasks if t["id"] == owner)

    runner = TaskThread.start(store, name, owner)
    wait_until(lambda: task_status()["state"] == "RUNNING", what=f"task {owner} RUNNING")
    assert task_status()["worker_id"] == "test"

    produce(stack.source_bootstrap_servers, values(20, topic))
    copied = consume_all(stack.destination_bootstrap_servers, f"{topic}.mirror", 1, expected=20)
    assert [r.value for r in copied] == [f"{topic}-{i}".encode() for i in range(20)]

    # Paused: the task commits and stops, and a task started while paused stops at once without copying.
    assert requests.put(f"{api}/connectors/{name}/pause").status_code == 202
    assert runner.join() is TaskExit.PAUSED
    produce(stack.source_bootstrap_servers, values(5, topic))
    assert TaskThread.start(store, name, owner).join() is TaskExit.PAUSED
    status = requests.get(f"{api}/connectors/{name}/status").json()
    assert status["connector"]["state"] == "PAUSED" and task_status()["state"] == "PAUSED"
    assert store.load_offsets(name)[(topic, 0)] == 20

    assert requests.put(f"{api}/connectors/{name}/resume").status_code == 202
    runner = TaskThread.start(store, name, owner)
    copied = consume_all(stack.destination_bootstrap_servers, f"{topic}.mirror", 1, expected=25)
    runner.finish()
    assert len(copied) == 25 and copied[-1].value == f"{topic}-4".encode()


def test_every_connector_route_speaks_kafka_connect(api: str, stack: StackEndpoints, store: Store, unique: str) -> None:
    name = unique
    create_topics(stack.source_bootstrap_servers, {unique: 2})
    create_topics(stack.destination_bootstrap_servers, {unique + ".mirror": 2})
    config = connector_properties(
        stack,
        name,
        **{"topics.whitelist": unique, "destination.topic.name.suffix": ".mirror", "emit.heartbeats.enabled": "false"},
    )

    created = requests.post(f"{api}/connectors", json={"name": name, "config": config})
    assert created.status_code == 201 and created.headers["Location"].endswith(f"/connectors/{name}")
    assert created.json()["name"] == name and created.json()["type"] == "source"
    KafkaMonitor(store).poll(name)

    info = requests.get(f"{api}/connectors/{name}").json()
    assert info["config"] == config and info["tasks"] == [{"connector": name, "task": 0}]
    assert requests.get(f"{api}/connectors/{name}/config").json() == config
    expanded = requests.get(f"{api}/connectors", params=[("expand", "status"), ("expand", "info")]).json()
    assert expanded[name]["info"] == info and expanded[name]["status"]["tasks"][0]["state"] == "UNASSIGNED"
    assert set(requests.get(f"{api}/connectors?expand=info").json()[name]) == {"info"}

    updated = requests.put(f"{api}/connectors/{name}/config", json={**config, "offset.flush.interval.ms": "500"})
    assert updated.status_code == 200 and updated.json()["config"]["offset.flush.interval.ms"] == "500"
    assert store.get_connector(name).version == 2

    tasks = requests.get(f"{api}/connectors/{name}/tasks").json()
    assert [t["id"] for t in tasks] == [{"connector": name, "task": 0}]
    assert (
        tasks[0]["config"]["partitions"] == f'[{{"topic": "{unique}", "partition": 0}}, '
        f'{{"topic": "{unique}", "partition": 1}}]'
    )
    assert requests.get(f"{api}/connectors/{name}/tasks/0/status").json() == {
        "id": 0,
        "state": "UNASSIGNED",
        "worker_id": "",
    }
    assert requests.get(f"{api}/connectors/{name}/topics").json() == {name: {"topics": [unique]}}

    before = store.connector_head(name).restart_requested_at
    assert requests.post(f"{api}/connectors/{name}/restart").status_code == 204
    marker = store.connector_head(name).restart_requested_at
    assert marker is not None and marker != before
    restarted = requests.post(f"{api}/connectors/{name}/restart?includeTasks=true&onlyFailed=false")
    assert restarted.status_code == 202
    assert restarted.json()["connector"]["state"] == "RESTARTING"
    assert [t["state"] for t in restarted.json()["tasks"]] == ["RESTARTING"]
    assert requests.post(f"{api}/connectors/{name}/tasks/0/restart").status_code == 204

    assert requests.put(f"{api}/connectors/{name}/stop").status_code == 202
    assert store.get_connector(name).state == "PAUSED"
    assert requests.put(f"{api}/connectors/{name}/resume").status_code == 202
    assert store.get_connector(name).state == "RUNNING"

    plugins = requests.get(f"{api}/connector-plugins").json()
    assert {"com.salesforce.mirus.MirusSourceConnector", "org.apache.kafka.connect.mirror.MirrorSourceConnector"} == {
        p["class"] for p in plugins
    }
    ok = requests.put(f"{api}/connector-plugins/MirusSourceConnector/config/validate", json=config).json()
    assert ok["error_count"] == 0 and ok["name"] == "com.salesforce.mirus.MirusSourceConnector"
    bad = requests.put(
        f"{api}/connector-plugins/com.salesforce.mirus.MirusSourceConnector/config/validate",
        json={**config, "tasks.max": "0"},
    ).json()
    assert bad["error_count"] == 1
    assert next(c["value"]["errors"] for c in bad["configs"] if c["value"]["name"] == "tasks.max")

    assert requests.delete(f"{api}/connectors/{name}").status_code == 204
    assert name not in requests.get(f"{api}/connectors").json()
    assert store.connector_head(name) is None


def test_kip_875_offsets_change_only_while_paused(api: str, stack: StackEndpoints, store: Store, unique: str) -> None:
    config = connector_properties(stack, unique, **{"topics.whitelist": unique})
    assert requests.put(f"{api}/connectors/{unique}/config", json=config).status_code == 201
    patch = {
        "offsets": [
            {"partition": {"topic": unique, "partition": 0}, "offset": {"offset": 7}},
            {"partition": {"topic": unique, "partition": 1}, "offset": {"offset": 3}},
        ]
    }

    running = requests.patch(f"{api}/connectors/{unique}/offsets", json=patch)
    assert running.status_code == 400 and "pause" in running.json()["message"]
    assert store.load_offsets(unique) == {}

    requests.put(f"{api}/connectors/{unique}/pause")
    # A task instance that has not finished its final commit yet would overwrite the change: 409 until it has.
    lease = store.claim_task(unique, 0, "stopping-instance")
    conflict = requests.patch(f"{api}/connectors/{unique}/offsets", json=patch)
    assert conflict.status_code == 409 and "still stopping" in conflict.json()["message"]
    store.finish_task(lease, "PAUSED")

    altered = requests.patch(f"{api}/connectors/{unique}/offsets", json=patch)
    assert altered.status_code == 200, altered.text
    assert altered.json() == {"message": "The offsets for this connector have been altered successfully"}
    assert requests.get(f"{api}/connectors/{unique}/offsets").json() == {
        "offsets": [
            {"partition": {"topic": unique, "partition": 0}, "offset": {"offset": 7}},
            {"partition": {"topic": unique, "partition": 1}, "offset": {"offset": 3}},
        ]
    }
    forget = {"offsets": [{"partition": {"topic": unique, "partition": 1}, "offset": None}]}
    assert requests.patch(f"{api}/connectors/{unique}/offsets", json=forget).status_code == 200
    assert store.load_offsets(unique) == {(unique, 0): 7}
    malformed = requests.patch(
        f"{api}/connectors/{unique}/offsets", json={"offsets": [{"partition": {"topic": unique}, "offset": None}]}
    )
    assert malformed.status_code == 400 and "partition" in malformed.json()["message"]

    reset = requests.delete(f"{api}/connectors/{unique}/offsets")
    assert reset.json() == {"message": "The offsets for this connector have been reset successfully"}
    assert store.load_offsets(unique) == {}


def test_mirrormaker_2_offsets_resume_after_the_last_record_it_copied(
    api: str, stack: StackEndpoints, store: Store, unique: str
) -> None:
    """MM2 stores the offset of the last record replicated; taken over, the next record is the first copied."""
    topic, name = unique, f"{unique}-mm2"
    create_topics(stack.source_bootstrap_servers, {topic: 1})
    produce(stack.source_bootstrap_servers, values(10, topic))
    config = connector_properties(
        stack,
        name,
        **{
            "connector.class": "org.apache.kafka.connect.mirror.MirrorSourceConnector",
            "source.cluster.alias": "primary",
            "topics": topic,
            "emit.heartbeats.enabled": "false",
        },
    )
    created = requests.post(f"{api}/connectors", json={"name": name, "config": config, "initial_state": "STOPPED"})
    assert created.status_code == 201, created.text
    # What Kafka Connect's GET /connectors/{name}/offsets shows for an MM2 connector that copied records 0..4.
    mm2 = {"offsets": [{"partition": {"cluster": "primary", "topic": topic, "partition": 0}, "offset": {"offset": 4}}]}
    assert requests.patch(f"{api}/connectors/{name}/offsets", json=mm2).status_code == 200
    assert store.load_offsets(name) == {(topic, 0): 5}
    assert requests.get(f"{api}/connectors/{name}/offsets").json() == mm2  # round trip in MM2's format

    assert requests.put(f"{api}/connectors/{name}/resume").status_code == 202
    KafkaMonitor(store).poll(name)
    runner = TaskThread.start(store, name, 0)
    copied = consume_all(stack.destination_bootstrap_servers, f"primary.{topic}", 1, expected=5)
    runner.finish()
    assert [r.value for r in copied] == [f"{topic}-{i}".encode() for i in range(5, 10)]
    assert requests.get(f"{api}/connectors/{name}/offsets").json()["offsets"][0]["offset"] == {"offset": 9}

    requests.put(f"{api}/connectors/{name}/stop")
    # MM2's "nothing copied yet" (-1) is the first record; Mirus's format on the same connector means the next one.
    none_yet = {
        "offsets": [{"partition": {"cluster": "primary", "topic": topic, "partition": 0}, "offset": {"offset": -1}}]
    }
    assert requests.patch(f"{api}/connectors/{name}/offsets", json=none_yet).status_code == 200
    assert store.load_offsets(name) == {(topic, 0): 0}
    assert requests.get(f"{api}/connectors/{name}/offsets").json() == none_yet
    mirus = {"offsets": [{"partition": {"topic": topic, "partition": 0}, "offset": {"offset": 7}}]}
    assert requests.patch(f"{api}/connectors/{name}/offsets", json=mirus).status_code == 200
    assert store.load_offsets(name) == {(topic, 0): 7}
    below = {
        "offsets": [{"partition": {"cluster": "primary", "topic": topic, "partition": 0}, "offset": {"offset": -2}}]
    }
    assert requests.patch(f"{api}/connectors/{name}/offsets", json=below).status_code == 400
    assert store.load_offsets(name) == {(topic, 0): 7}
    assert requests.delete(f"{api}/connectors/{name}/offsets").status_code == 200
    assert requests.get(f"{api}/connectors/{name}/offsets").json() == {"offsets": []}


def test_errors_have_kafka_connect_status_codes_and_bodies(
    api: str, stack: StackEndpoints, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    for method, path in [
        ("GET", "/connectors/nope"),
        ("GET", "/connectors/nope/config"),
        ("GET", "/connectors/nope/status"),
        ("GET", "/connectors/nope/tasks"),
        ("GET", "/connectors/nope/offsets"),
        ("PUT", "/connectors/nope/pause"),
        ("PUT", "/connectors/nope/resume"),
        ("POST", "/connectors/nope/restart"),
        ("DELETE", "/connectors/nope"),
        ("POST", "/connectors/nope/tasks/0/restart"),
        ("DELETE", "/connectors/nope/offsets"),
    ]:
        response = requests.request(method, api + path)
        assert (response.status_code, response.json()) == (
            404,
            {"error_code": 404, "message": "Connector nope not found"},
        ), path
    assert requests.get(f"{api}/no/such/route").json()["error_code"] == 404
    assert requests.post(f"{api}/connectors/nope/config").json()["error_code"] == 405

    config = connector_properties(stack, unique, **{"topics.whitelist": unique})
    invalid = requests.put(f"{api}/connectors/{unique}/config", json={**config, "tasks.max": "many"})
    assert invalid.status_code == 400 and invalid.json()["error_code"] == 400
    assert "tasks.max" in invalid.json()["message"] and "1 error(s)" in invalid.json()["message"]
    mismatch = requests.put(f"{api}/connectors/other/config", json=config)
    assert mismatch.status_code == 400 and "doesn't match connector name in the URL" in mismatch.json()["message"]
    not_json = requests.put(f"{api}/connectors/{unique}/config", data="{", headers={"Content-Type": "application/json"})
    assert not_json.status_code == 400
    literal = requests.put(f"{api}/connectors/{unique}/config", json={**config, "consumer.sasl.password": "hunter2"})
    assert literal.status_code == 400 and "consumer.sasl.password" in literal.json()["message"]
    assert "hunter2" not in literal.text
    assert f"refused PUT /connectors/{unique}/config" in caplog.text and "hunter2" not in caplog.text
    assert requests.get(f"{api}/connectors/{unique}").status_code == 404  # nothing was stored

    assert requests.post(f"{api}/connectors", json={"name": unique, "config": config}).status_code == 201
    again = requests.post(f"{api}/connectors", json={"name": unique, "config": config})
    assert (again.status_code, again.json()["message"]) == (409, f"Connector {unique} already exists")
    assert requests.get(f"{api}/connectors/{unique}/tasks/9/status").status_code == 404
    assert requests.put(f"{api}/connector-plugins/NoSuchConnector/config/validate", json=config).status_code == 404
    other = requests.put(f"{api}/connector-plugins/MirrorSourceConnector/config/validate", json=config)
    assert other.status_code == 400 and "does not match request type" in other.json()["message"]
    paused = {"name": f"{unique}-p", "config": {**config, "name": f"{unique}-p"}, "initial_state": "PAUSED"}
    bad_state = requests.post(f"{api}/connectors", json={**paused, "initial_state": "ON"})
    assert bad_state.status_code == 400 and "initial_state" in bad_state.json()["message"]
    assert requests.post(f"{api}/connectors", json=paused).status_code == 201
    assert requests.get(f"{api}/connectors/{unique}-p/status").json()["connector"]["state"] == "PAUSED"


def test_secrets_never_appear_in_responses(
    api: str, stack: StackEndpoints, unique: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secrets = tmp_path / "client.properties"
    secrets.write_text("key.password=s3cr3t-value\n")
    monkeypatch.setenv(ENV_ALLOWED_PATHS, str(tmp_path))  # the deployment allows its secrets directory
    monkeypatch.setenv("MIRUS_TEST_TRUSTSTORE_PASSWORD", "other-s3cr3t")
    config = connector_properties(
        stack,
        unique,
        **{
            "topics.whitelist": unique,
            "consumer.ssl.key.password": f"${{file:{secrets}:key.password}}",
            "destination.consumer.ssl.key.password": "${env:MIRUS_TEST_TRUSTSTORE_PASSWORD}",
        },
    )
    assert requests.put(f"{api}/connectors/{unique}/config", json=config).status_code == 201
    bodies = [
        requests.get(f"{api}/connectors/{unique}").text,
        requests.get(f"{api}/connectors/{unique}/config").text,
        requests.get(f"{api}/connectors/{unique}/tasks").text,
        requests.get(f"{api}/connectors?expand=info&expand=status").text,
        requests.put(f"{api}/connector-plugins/MirusSourceConnector/config/validate", json=config).text,
    ]
    for body in bodies:
        assert "s3cr3t" not in body
    assert requests.get(f"{api}/connectors/{unique}/config").json()["consumer.ssl.key.password"].startswith("${file:")
    # The API's process needs none of the secrets: status and metrics work where the references do not resolve.
    monkeypatch.delenv("MIRUS_TEST_TRUSTSTORE_PASSWORD")
    secrets.unlink()
    assert requests.get(f"{api}/connectors/{unique}/status").json()["connector"]["state"] == "RUNNING"
    assert requests.get(f"{api}/metrics").status_code == 200


def test_authentication_guards_every_route_but_the_version_and_metrics(
    stack: StackEndpoints, db_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    users = tmp_path / "users.properties"
    users.write_text("admin=correct horse\n")
    monkeypatch.setenv("MIRUS_TEST_API_TOKEN", "t0ken")
    settings = ApiSettings(basic_auth_users=f"${{file:{users}}}", bearer_token="${env:MIRUS_TEST_API_TOKEN}")
    with serve_api(Store(db_engine), settings) as url:
        assert requests.get(url).status_code == 200
        assert requests.get(f"{url}/metrics").status_code == 200
        denied = requests.get(f"{url}/connectors")
        assert denied.status_code == 401 and denied.json()["error_code"] == 401
        assert denied.headers["WWW-Authenticate"].startswith("Basic")
        assert requests.get(f"{url}/connectors", auth=("admin", "wrong")).status_code == 401
        assert requests.get(f"{url}/connectors", auth=("nobody", "correct horse")).status_code == 401
        assert requests.put(f"{url}/connectors/x/pause", headers={"Authorization": "Bearer nope"}).status_code == 401
        assert requests.get(f"{url}/connectors", auth=("admin", "correct horse")).status_code == 200
        assert requests.get(f"{url}/connectors", headers={"Authorization": "Bearer t0ken"}).status_code == 200
        garbage = base64.b64encode(b"\xff\xfe").decode()
        assert requests.get(f"{url}/connectors", headers={"Authorization": f"Basic {garbage}"}).status_code == 401
    with pytest.raises(ValueError, match="reference"):
        ApiSettings(bearer_token="t0ken")


def _samples(api: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = requests.get(f"{api}/metrics").text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def m(metric: str, **labels: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """A sample's key in `_samples`."""
    return metric, tuple(sorted(labels.items()))


def _sampled_ago(store: Store, connector: str, seconds: int) -> None:
    """Move every metric sample of `connector` so that its interval ends `seconds` ago."""
    with store.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE metric_samples SET interval_end = now() - make_interval(secs => :s),"
                " interval_start = now() - make_interval(secs => :s) - (interval_end - interval_start)"
                " WHERE connector = :c"
            ),
            {"s": seconds, "c": connector},
        )


def test_metrics_move_with_real_traffic_and_cover_task_states(
    api: str, stack: StackEndpoints, store: Store, unique: str
) -> None:
    name, topic, missing = unique, unique, f"{unique}-nodest"
    create_topics(stack.source_bootstrap_servers, {topic: 2, missing: 3})
    create_topics(stack.destination_bootstrap_servers, {f"{topic}.mirror": 2})
    config = connector_properties(
        stack,
        name,
        **{
            "topics.regex": f"{unique}.*",
            "destination.topic.name.suffix": ".mirror",
            "topic.creation.enable": "false",
            "emit.heartbeats.enabled": "false",
        },
    )
    requests.put(f"{api}/connectors/{name}/config", json=config)
    KafkaMonitor(store).poll(name)
    runner = TaskThread.start(store, name, 0)

    dest = {"connector": name, "topic": f"{topic}.mirror"}
    produce(
        stack.source_bootstrap_servers, [{"topic": topic, "partition": i % 2, "value": b"x" * 100} for i in range(30)]
    )
    wait_until(lambda: _samples(api).get(m("mirus_replicated_records_total", **dest)) == 30, what="30 records counted")
    first = _samples(api)
    assert first[m("mirus_replicated_bytes_total", **dest)] == 3000
    assert first[m("mirus_replication_latency_seconds_count", **dest)] == 30
    assert first[m("mirus_replication_latency_seconds_bucket", **dest, le="+Inf")] == 30
    assert first[m("mirus_replication_latency_seconds_bucket", **dest, le="300.0")] == 30  # Mirus's 5m bucket
    # The rate counts the last minute's samples by the database's clock: they are placed 30 s, then 61 s, in the
    # past, so that how long replication took on this machine plays no part.
    _sampled_ago(store, name, 30)
    assert _samples(api)[m("mirus_record_rate", **dest)] == pytest.approx(30 / 60)
    _sampled_ago(store, name, 61)
    assert _samples(api).get(m("mirus_record_rate", **dest), 0.0) == 0.0
    assert first[m("mirus_missing_destination_partitions", connector=name)] == 3
    assert first[m("mirus_connector_tasks", connector=name, state="RUNNING")] == 1
    assert first[m("mirus_connector_tasks", connector=name, state="FAILED")] == 0
    assert first[m("mirus_task_restart_attempts_total", connector=name, task="0")] == 0

    produce(stack.source_bootstrap_servers, [{"topic": topic, "partition": 1, "value": b"y" * 10} for _ in range(12)])
    wait_until(lambda: _samples(api).get(m("mirus_replicated_records_total", **dest)) == 42, what="42 records counted")
    assert _samples(api)[m("mirus_replicated_bytes_total", **dest)] == 3120

    store.record_restart(name, 0)
    requests.put(f"{api}/connectors/{name}/pause")
    assert runner.join() is TaskExit.PAUSED
    after = _samples(api)
    assert after[m("mirus_connector_tasks", connector=name, state="PAUSED")] == 1
    assert after[m("mirus_task_restart_attempts_total", connector=name, task="0")] == 1
    assert after[m("mirus_connector_task_restart_attempts_total", connector=name)] == 1


def test_a_connector_put_over_the_api_shows_in_dagster(
    api: str, instance: dg.DagsterInstance, resources: dict, stack: StackEndpoints, unique: str
) -> None:
    config = connector_properties(stack, unique, **{"topics.whitelist": unique})
    assert requests.put(f"{api}/connectors/{unique}/config", json=config).status_code == 201
    result = run_starter(dg.build_sensor_context(instance=instance, resources=resources))
    added = [
        n
        for r in result.dynamic_partitions_requests
        if isinstance(r, dg.AddDynamicPartitionsRequest)
        for n in r.partition_keys
    ]
    assert unique in added
    events = [e for e in result.asset_events if e.asset_key == dg.AssetKey(CONNECTORS_ASSET)]
    assert events and unique in events[-1].metadata["configs (secrets masked)"].data
    cursor = result.cursor
    requests.put(f"{api}/connectors/{unique}/pause")
    result = run_starter(dg.build_sensor_context(instance=instance, cursor=cursor, resources=resources))
    events = [e for e in result.asset_events if e.asset_key == dg.AssetKey(CONNECTORS_ASSET)]
    assert events and f"| {unique} | PAUSED |" in events[-1].metadata["connectors"].value
    requests.post(f"{api}/connectors/{unique}/restart")
    result = run_starter(dg.build_sensor_context(instance=instance, cursor=result.cursor, resources=resources))
    assert any(e.asset_key == dg.AssetKey(CONNECTORS_ASSET) for e in result.asset_events)
    requests.delete(f"{api}/connectors/{unique}")
    instance.add_dynamic_partitions(CONNECTOR_PARTITIONS, [unique])
    result = run_starter(dg.build_sensor_context(instance=instance, cursor=result.cursor, resources=resources))
    removed = [
        n
        for r in result.dynamic_partitions_requests
        if isinstance(r, dg.DeleteDynamicPartitionsRequest)
        for n in r.partition_keys
    ]
    assert unique in removed


def test_validation_describes_every_property_from_the_table_and_lists_what_a_put_would_refuse(
    api: str, stack: StackEndpoints, unique: str
) -> None:
    config = connector_properties(
        stack,
        unique,
        **{
            "topics.whitelist": unique,
            "tasks.max": "0",
            "exactly.once.support": "sometimes",
            "consumer.sasl.password": "hunter2",
            "poll.timeout.msec": "5",
        },
    )
    answer = requests.put(f"{api}/connector-plugins/MirusSourceConnector/config/validate", json=config)
    assert answer.status_code == 200 and "hunter2" not in answer.text
    body = answer.json()
    by_name = {c["definition"]["name"]: c for c in body["configs"]}
    tasks_max = by_name["tasks.max"]["definition"]
    assert (tasks_max["type"], tasks_max["default_value"], tasks_max["importance"], tasks_max["group"]) == (
        "INT",
        "1",
        "HIGH",
        "Connector",
    )
    assert "between 1 and 256" in tasks_max["documentation"]
    heartbeats = by_name["emit.heartbeats.enabled"]
    assert heartbeats["definition"]["type"] == "BOOLEAN" and heartbeats["definition"]["group"] == "Failover"
    assert heartbeats["value"] == {
        "name": "emit.heartbeats.enabled",
        "value": "true",  # unset: the default, as Connect shows it
        "recommended_values": ["true", "false"],
        "errors": [],
        "visible": True,
    }
    assert by_name["topics"]["definition"]["type"] == "LIST"
    assert by_name["replication.policy.class"]["definition"]["type"] == "CLASS"
    assert by_name["exactly.once.support"]["value"]["recommended_values"] == ["disabled", "requested", "required"]
    assert by_name["consumer.sasl.password"]["definition"]["type"] == "PASSWORD"
    assert by_name["consumer.sasl.password"]["definition"]["group"] == "Clients"
    assert by_name["poll.timeout.msec"]["definition"]["group"] == "Unknown"
    assert {"Connector", "Topic selection", "Clients", "Unknown"} <= set(body["groups"])

    # Every error of a PUT of the same config, each under its property, counted in error_count.
    put = requests.put(f"{api}/connectors/{unique}/config", json=config)
    assert put.status_code == 400
    refused = {line for line in put.json()["message"].splitlines()[1:-1]}
    listed = {f"{name}: {e}" for name, c in by_name.items() for e in c["value"]["errors"]}
    assert listed == refused and body["error_count"] == len(refused) == 4
    assert requests.get(f"{api}/connectors/{unique}").status_code == 404

    # The same definitions, without values, for forms built before any config exists.
    definitions = requests.get(f"{api}/connector-plugins/MirrorSourceConnector/config").json()
    assert [d["name"] for d in definitions] == [spec.name for spec in PROPERTIES]
    assert definitions == [c["definition"] for c in body["configs"]][: len(PROPERTIES)]
    assert requests.get(f"{api}/connector-plugins/NoSuchPlugin/config").status_code == 404
    everything = requests.get(f"{api}/connector-plugins?connectorsOnly=false").json()
    assert {"class": "org.apache.kafka.connect.transforms.RegexRouter", "type": "transformation"}.items() <= next(
        p for p in everything if p["class"].endswith("RegexRouter")
    ).items()
    regex_router = requests.get(f"{api}/connector-plugins/RegexRouter/config").json()
    assert [d["name"] for d in regex_router] == ["regex", "replacement"]


def test_tasks_config_topic_reset_loggers_and_the_version_probe(
    api: str, stack: StackEndpoints, store: Store, unique: str
) -> None:
    create_topics(stack.source_bootstrap_servers, {unique: 2})
    config = connector_properties(stack, unique, **{"topics.whitelist": unique, "emit.heartbeats.enabled": "false"})
    requests.put(f"{api}/connectors/{unique}/config", json=config)
    KafkaMonitor(store).poll(unique)

    tasks = requests.get(f"{api}/connectors/{unique}/tasks").json()
    assert requests.get(f"{api}/connectors/{unique}/tasks-config").json() == {f"{unique}-0": tasks[0]["config"]}
    reset = requests.put(f"{api}/connectors/{unique}/topics/reset")
    assert (reset.status_code, reset.content) == (202, b"")
    # Only topics in use are listed: the reset leaves exactly those.
    assert requests.get(f"{api}/connectors/{unique}/topics").json() == {unique: {"topics": [unique]}}
    assert requests.put(f"{api}/connectors/{unique}-nope/topics/reset").status_code == 404

    root = requests.get(api).json()
    assert len(root["commit"]) == 40 and int(root["commit"], 16) >= 0  # installed from this checkout

    logger = f"mirus.test.{unique}"
    before = logging.getLogger(logger)
    logging.getLogger(f"{logger}.child")
    try:
        assert "root" in requests.get(f"{api}/admin/loggers").json()
        changed = requests.put(f"{api}/admin/loggers/{logger}", json={"level": "DEBUG"})
        assert changed.status_code == 200 and changed.json() == [logger, f"{logger}.child"]
        assert logging.getLogger(f"{logger}.child").getEffectiveLevel() == logging.DEBUG  # this very process
        shown = requests.get(f"{api}/admin/loggers/{logger}").json()
        assert shown["level"] == "DEBUG" and shown["last_modified"] > 0
        assert requests.get(f"{api}/admin/loggers").json()[logger]["level"] == "DEBUG"
        cluster = requests.put(f"{api}/admin/loggers/{logger}?scope=cluster", json={"level": "WARN"})
        assert cluster.status_code == 204 and before.level == logging.WARNING
        invalid = requests.put(f"{api}/admin/loggers/{logger}", json={"level": "LOUD"})
        assert (invalid.status_code, invalid.json()["message"]) == (404, "invalid log level 'LOUD'.")
        assert requests.put(f"{api}/admin/loggers/{logger}", json={}).status_code == 400
        assert before.level == logging.WARNING
        assert requests.get(f"{api}/admin/loggers/{logger}.nobody").status_code == 404
    finally:
        for name in (logger, f"{logger}.child"):
            logging.getLogger(name).setLevel(logging.NOTSET)


def test_oversized_bodies_and_too_many_tasks_are_refused_and_nothing_is_stored(
    api: str, stack: StackEndpoints, store: Store, unique: str
) -> None:
    config = connector_properties(stack, unique, **{"topics.whitelist": unique})
    huge = {**config, "destination.topic.name.prefix": "x" * (1024 * 1024)}
    declared = requests.put(f"{api}/connectors/{unique}/config", json=huge)
    assert (declared.status_code, declared.json()["error_code"]) == (413, 413)
    streamed = requests.put(  # chunked: no Content-Length to trust
        f"{api}/connectors/{unique}/config",
        data=(b"x" * 65536 for _ in range(20)),
        headers={"Content-Type": "application/json"},
    )
    assert streamed.status_code == 413
    many = requests.put(f"{api}/connectors/{unique}/config", json={**config, "tasks.max": "257"})
    assert many.status_code == 400 and "tasks.max: must be an integer between 1 and 256" in many.json()["message"]
    assert store.connector_head(unique) is None
    assert requests.put(f"{api}/connectors/{unique}/config", json={**config, "tasks.max": "256"}).status_code == 201


def test_metrics_can_require_the_token_and_refusals_are_logged_without_it(
    db_engine: Engine, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("MIRUS_TEST_API_TOKEN", "t0ken-value")
    settings = ApiSettings(bearer_token="${env:MIRUS_TEST_API_TOKEN}", metrics_auth=True)
    with caplog.at_level(logging.INFO), serve_api(Store(db_engine), settings) as url:
        assert requests.get(url).status_code == 200
        assert requests.get(f"{url}/metrics").status_code == 401
        assert requests.get(f"{url}/metrics", headers={"Authorization": "Bearer t0ken-valu"}).status_code == 401
        assert requests.get(f"{url}/metrics", headers={"Authorization": "t0ken-valu"}).status_code == 401
        assert requests.get(f"{url}/metrics", headers={"Authorization": "Bearer t0ken-value"}).status_code == 200
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 3 and all("GET /metrics" in r and "401" in r for r in refusals)
    assert "t0ken-valu" not in caplog.text
    # Beyond loopback the API does not start without credentials, nor guard /metrics with none.
    with pytest.raises(ValueError, match="without authentication"):
        Credentials(ApiSettings(host="0.0.0.0"))
    with pytest.raises(ValueError, match="MIRUS_API_METRICS_AUTH"):
        Credentials(ApiSettings(metrics_auth=True))
    assert Credentials(ApiSettings(host="::1")).required is False


def test_the_version_probe_names_the_destination_the_watcher_recorded_without_a_client_of_its_own(
    stack: StackEndpoints, unique: str
) -> None:
    """A secured destination refuses a client without the connectors' settings: `GET /` answers from the flows."""
    engine = private_database(stack, unique)
    try:
        store = Store(engine)
        store.put_connector(unique, {"name": unique}, 1)
        store.update_flow(unique, destination_cluster_id="the-secured-destination")
        # Nothing listens at the platform's destination address: asking it would answer nothing.
        api = ConnectApi(store, "localhost:8083", destination_bootstrap_servers="127.0.0.1:1")
        assert api.root.cluster_id() == "the-secured-destination"
    finally:
        engine.dispose()
