"""The REST API against Kafka Connect 3.7's own OpenAPI description (tests/data/connect_rest_3.7.yaml).

One `mirus api` process, with authentication on, over the test stack's Postgres. The conformance test calls every
operation of the description with a valid request and checks status and body against it; the fuzzing run lets
schemathesis generate requests from the description (valid and invalid) and checks that none gets a server
error or an answer outside the description, that a refused request changes nothing, and that the server is
healthy afterwards.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
import yaml
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error, response_schema_conformance
from sqlalchemy import Engine

from mirus.api.app import ENV_COMMIT
from mirus.local.stack import free_port
from mirus.waiting import wait_until
from mirus_dagster.settings import StackEndpoints
from replicator.configuration import administration
from replicator.state.records import ConnectorState
from replicator.state.store import Store
from tests.fixtures.engine_helpers import connector_properties

DESCRIPTION = Path(__file__).parents[1] / "data" / "connect_rest_3.7.yaml"
TOKEN = "contract-test-token"
COMMIT = "0123456789abcdef0123456789abcdef01234567"  # as deploy/Dockerfile's build argument sets it
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MIRUS, MM2 = "seed-mirus", "seed-mm2"
TOPIC = "seed-topic"
# Answers Kafka Connect itself gives with null where the description says string.
NULLABLE = {
    "ConfigKeyInfo": ["default_value"],
    "ConfigValueInfo": ["value"],
    "ServerInfo": ["kafka_cluster_id"],
}
CHECKS = [not_a_server_error, response_schema_conformance]


def description() -> dict[str, Any]:
    """The description, corrected where Kafka Connect's own answers differ from it (and so ours, on purpose)."""
    raw = yaml.safe_load(DESCRIPTION.read_text())
    schemas = raw["components"]["schemas"]
    for schema, properties in NULLABLE.items():
        for name in properties:
            schemas[schema]["properties"][name]["nullable"] = True
    # Java's Map<String, ?> came out as maps of objects; Connect's offsets are `{"topic": "t", "partition": 0}`.
    for name in ("partition", "offset"):
        schemas["ConnectorOffset"]["properties"][name]["additionalProperties"] = {}
    # Its one `default` response is the success body; errors are Connect's documented `{"error_code", "message"}`.
    schemas["ErrorMessage"] = {
        "type": "object",
        "required": ["error_code", "message"],
        "properties": {"error_code": {"type": "integer"}, "message": {"type": "string"}},
    }
    error = {"$ref": "#/components/schemas/ErrorMessage"}
    for item in raw["paths"].values():
        for operation in item.values():
            success = operation["responses"].pop("default")
            operation["responses"] = {
                "2XX": success,
                "default": {"description": "error", "content": {"application/json": {"schema": error}}},
            }
    return raw


def operations(raw: dict[str, Any]) -> set[tuple[str, str]]:
    return {(method.upper(), path) for path, item in raw["paths"].items() for method in item}


@pytest.fixture(scope="module")
def server(stack: StackEndpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`mirus api` in its own process, as deployed: its log levels and state are its own."""
    port = free_port()
    log = tmp_path_factory.mktemp("api") / "api.log"
    env = {
        **os.environ,
        **stack.as_env(),
        "MIRUS_CONTRACT_TOKEN": TOKEN,
        "MIRUS_API_BEARER_TOKEN": "${env:MIRUS_CONTRACT_TOKEN}",
        ENV_COMMIT: COMMIT,
    }
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "mirus.cli.main", "api", "--port", str(port)], env=env, stdout=out, stderr=out
        )
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        assert process.poll() is None, log.read_text()
        try:
            return requests.get(url, timeout=5).status_code == 200
        except requests.ConnectionError:
            return False

    try:
        wait_until(answers, timeout=60, what="mirus api to answer")
        yield url
        assert process.poll() is None, log.read_text()
    finally:
        process.terminate()
        process.wait(30)


def seed(store: Store, stack: StackEndpoints) -> None:
    """Two connectors (Mirus's class, running; MM2's, paused with an offset) with two assigned tasks each, put
    back whenever a request deleted one, so that generated requests reach past "not found"."""
    for name, cls, state in (
        (MIRUS, "com.salesforce.mirus.MirusSourceConnector", ConnectorState.RUNNING),
        (MM2, "org.apache.kafka.connect.mirror.MirrorSourceConnector", ConnectorState.PAUSED),
    ):
        if store.connector_head(name) is not None:
            continue
        properties = connector_properties(stack, name, **{"connector.class": cls, "topics": TOPIC, "tasks.max": "2"})
        administration.put_connector(store, properties, state)
        store.write_assignment(name, {0: [(TOPIC, 0)], 1: [(TOPIC, 1)]})
        if state == ConnectorState.PAUSED:
            administration.alter_offsets(store, name, {(TOPIC, 0): 5})


def stored(store: Store) -> list[tuple[Any, ...]]:
    """What a refused request must leave as it was: every connector's version, state and config, and offsets."""
    return [
        (r.name, r.version, r.state, r.properties, sorted(store.load_offsets(r.name).items()))
        for r in store.list_connectors()
    ]


def test_every_operation_of_the_description_answers_as_it_says(
    server: str, stack: StackEndpoints, db_engine: Engine, unique: str
) -> None:
    store = Store(db_engine)
    seed(store, stack)
    raw = description()
    schema = schemathesis.openapi.from_dict(raw)
    name = unique
    config = connector_properties(stack, name, **{"topics.whitelist": TOPIC})
    plugin = {"pluginName": "MirusSourceConnector"}
    connector = {"connector": name}
    task = {"connector": MIRUS, "task": 0}
    # In an order that leaves each call something to act on; ends with the connector's deletion.
    calls: list[tuple[str, str, dict[str, Any], int]] = [
        ("GET", "/", {}, 200),
        ("GET", "/connector-plugins", {"query": {"connectorsOnly": False}}, 200),
        ("GET", "/connector-plugins/{pluginName}/config", {"path_parameters": plugin}, 200),
        ("PUT", "/connector-plugins/{pluginName}/config/validate", {"path_parameters": plugin, "body": config}, 200),
        ("POST", "/connectors", {"body": {"name": name, "config": config, "initial_state": "RUNNING"}}, 201),
        ("GET", "/connectors", {}, 200),
        ("GET", "/connectors/{connector}", {"path_parameters": connector}, 200),
        ("GET", "/connectors/{connector}/config", {"path_parameters": connector}, 200),
        ("PUT", "/connectors/{connector}/config", {"path_parameters": connector, "body": config}, 200),
        ("GET", "/connectors/{connector}/status", {"path_parameters": connector}, 200),
        ("GET", "/connectors/{connector}/tasks", {"path_parameters": {"connector": MIRUS}}, 200),
        ("GET", "/connectors/{connector}/tasks-config", {"path_parameters": {"connector": MIRUS}}, 200),
        ("GET", "/connectors/{connector}/tasks/{task}/status", {"path_parameters": task}, 200),
        ("POST", "/connectors/{connector}/tasks/{task}/restart", {"path_parameters": task}, 204),
        ("POST", "/connectors/{connector}/restart", {"path_parameters": connector}, 204),
        ("GET", "/connectors/{connector}/topics", {"path_parameters": {"connector": MIRUS}}, 200),
        ("PUT", "/connectors/{connector}/topics/reset", {"path_parameters": {"connector": MIRUS}}, 202),
        ("PUT", "/connectors/{connector}/pause", {"path_parameters": connector}, 202),
        ("PUT", "/connectors/{connector}/resume", {"path_parameters": connector}, 202),
        ("PUT", "/connectors/{connector}/stop", {"path_parameters": connector}, 202),
        ("GET", "/connectors/{connector}/offsets", {"path_parameters": {"connector": MM2}}, 200),
        (
            "PATCH",
            "/connectors/{connector}/offsets",
            {
                "path_parameters": connector,
                "body": {"offsets": [{"partition": {"topic": TOPIC, "partition": 0}, "offset": {"offset": 3}}]},
            },
            200,
        ),
        ("DELETE", "/connectors/{connector}/offsets", {"path_parameters": connector}, 200),
        ("GET", "/admin/loggers", {}, 200),
        ("GET", "/admin/loggers/{logger}", {"path_parameters": {"logger": "root"}}, 200),
        (
            "PUT",
            "/admin/loggers/{logger}",
            {"path_parameters": {"logger": "mirus.api"}, "query": {"scope": "worker"}, "body": {"level": "INFO"}},
            200,
        ),
        ("DELETE", "/connectors/{connector}", {"path_parameters": connector}, 204),
    ]
    assert {(method, path) for method, path, _, _ in calls} == operations(raw)
    # Without the token every operation but the version probe is refused, and changes nothing.
    before = stored(store)
    for method, path, request, _ in calls[1:]:
        url = server + path.format(**request.get("path_parameters", {}))
        refused = requests.request(method, url, params=request.get("query"), json=request.get("body"), timeout=30)
        assert (refused.status_code, refused.json()["error_code"]) == (401, 401), f"{method} {path}"
    assert stored(store) == before
    for method, path, request, status in calls:
        case = schema[path][method].Case(**request)
        response = case.call(base_url=server, headers=AUTH)
        assert response.status_code == status, f"{method} {path}: {response.status_code} {response.text}"
        case.validate_response(response, checks=CHECKS)
    assert requests.get(server, timeout=30).json()["commit"] == COMMIT  # from the image's environment
    expanded = requests.get(f"{server}/connectors?expand=status&expand=info", headers=AUTH, timeout=30).json()
    assert {MIRUS, MM2} <= set(expanded) and all(set(e) == {"status", "info"} for e in expanded.values())


def test_generated_requests_get_no_server_error_nor_an_answer_outside_the_description(
    server: str, stack: StackEndpoints, db_engine: Engine
) -> None:
    store = Store(db_engine)
    raw = description()
    # Path parameters from the seeded connectors, real plug-in names and loggers, and one of each that does not
    # exist: random strings would all end in 404.
    seeded = copy.deepcopy(raw)
    values = {
        "connector": [MIRUS, MM2, "no-such-connector"],
        "pluginName": ["MirusSourceConnector", "org.apache.kafka.connect.mirror.MirrorSourceConnector", "RegexRouter",
                       "NoSuchPlugin"],
        "task": [0, 1, 7],
        "logger": ["root", "mirus.api", "uvicorn.error", "no.such.logger"],
    }  # fmt: skip
    for item in seeded["paths"].values():
        for operation in item.values():
            for parameter in operation.get("parameters", []):
                if parameter["in"] == "path":
                    parameter["schema"] = {**parameter["schema"], "enum": values[parameter["name"]]}
    # Bodies shaped like users' (a config naming the seeded connectors and clusters, offsets of the seeded topic,
    # log levels), otherwise random maps of strings are all refused by validation.
    config = {
        "type": "object",
        "required": [
            "connector.class",
            "consumer.bootstrap.servers",
            "destination.consumer.bootstrap.servers",
            "topics",
        ],
        "properties": {
            "connector.class": {"type": "string", "enum": ["MirusSourceConnector", "MirrorSourceConnector"]},
            "consumer.bootstrap.servers": {"type": "string", "enum": [stack.source_bootstrap_servers]},
            "destination.consumer.bootstrap.servers": {"type": "string", "enum": [stack.destination_bootstrap_servers]},
            "topics": {"type": "string", "enum": [TOPIC, "seed-.*", "("]},  # "(": not a regex
            "tasks.max": {"type": "string", "enum": ["1", "2", "256", "257", "0"]},
            "emit.heartbeats.enabled": {"type": "string", "enum": ["true", "false", "maybe"]},
        },
        "additionalProperties": False,  # random names are unknown properties: negative mode sends them
    }
    schemas = seeded["components"]["schemas"]
    schemas["CreateConnectorRequest"]["properties"]["config"] = config
    schemas["CreateConnectorRequest"]["properties"]["name"]["enum"] = [MIRUS, "fuzz-created"]
    schemas["CreateConnectorRequest"]["required"] = ["name", "config"]
    paths = seeded["paths"]
    for path, method in (
        ("/connectors/{connector}/config", "put"),
        ("/connector-plugins/{pluginName}/config/validate", "put"),
    ):
        paths[path][method]["requestBody"]["content"]["application/json"]["schema"] = config
    schemas["ConnectorOffset"] = {
        "type": "object",
        "required": ["partition", "offset"],
        "properties": {
            "partition": {
                "type": "object",
                "required": ["topic", "partition"],
                "properties": {
                    "cluster": {"type": "string", "enum": ["source"]},
                    "topic": {"type": "string", "enum": [TOPIC]},
                    "partition": {"type": "integer", "minimum": 0, "maximum": 2},
                },
            },
            "offset": {
                "type": "object",
                "nullable": True,
                "required": ["offset"],
                "properties": {"offset": {"type": "integer", "minimum": -1, "maximum": 100}},
            },
        },
    }
    schemas["ConnectorOffsets"]["required"] = ["offsets"]
    paths["/admin/loggers/{logger}"]["put"]["requestBody"]["content"]["application/json"]["schema"] = {
        "type": "object",
        "required": ["level"],
        "properties": {"level": {"type": "string", "enum": ["DEBUG", "info", "WARN", "OFF", "LOUD"]}},
    }
    schema = schemathesis.openapi.from_dict(seeded)
    statuses: dict[str, Counter[int]] = defaultdict(Counter)

    def exercise(label: str) -> Callable[[schemathesis.Case], None]:
        def run(case: schemathesis.Case) -> None:
            seed(store, stack)
            before = stored(store)
            response = case.call(base_url=server, headers=AUTH, timeout=30)
            statuses[label][response.status_code] += 1
            case.validate_response(response, checks=CHECKS)
            if response.status_code >= 400:
                assert stored(store) == before, f"{label} refused with {response.status_code} but changed the store"

        return run

    for result in schema.get_all_operations():
        operation = result.ok()
        label = f"{operation.method.upper()} {operation.path}"
        declared = seeded["paths"][operation.path][operation.method.lower()]
        modes = [(schemathesis.GenerationMode.POSITIVE, 25)]
        if declared.get("parameters") or declared.get("requestBody"):  # else there is nothing to make invalid
            modes.append((schemathesis.GenerationMode.NEGATIVE, 10))
        for mode, examples in modes:
            strategy = operation.as_strategy(generation_mode=mode)
            fuzz = settings(
                max_examples=examples,
                deadline=None,
                derandomize=True,  # the same requests on every run: a CI failure can be replayed
                database=None,
                suppress_health_check=list(HealthCheck),
            )(given(case=strategy)(exercise(label)))
            fuzz()

    total = sum(sum(c.values()) for c in statuses.values())
    answered = [label for label, counts in statuses.items() if any(200 <= s < 300 for s in counts)]
    print(f"{total} requests; statuses per operation: {dict(statuses)}")
    assert len(statuses) == len(operations(raw))
    # Most operations were reached past validation and "not found" at least once.
    assert len(answered) >= 0.8 * len(statuses), sorted(set(statuses) - set(answered))
    assert requests.get(server, timeout=30).status_code == 200
    assert requests.get(f"{server}/connectors/{MIRUS}/status", headers=AUTH, timeout=30).status_code == 200
