"""The Kafka Connect REST API over the platform's store: same routes, JSON shapes, status codes and error bodies.

Every change goes through `replicator.configuration.connectors`, the code path of the launchpad jobs and the CLI, so the
Dagster monitor sensor shows it like any other change. Responses never carry a literal secret value.
Departures from Kafka Connect are listed in docs/API.md.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import subprocess
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import uvicorn
from confluent_kafka.admin import AdminClient
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from mirus.api import definitions
from mirus.api.auth import ApiSettings, AuthMiddleware, Credentials
from mirus.api.loggers import LoggerLevels, valid_level
from mirus.api.metrics import StoreCollector
from replicator.assignment import SourcePartition
from replicator.configuration import connectors
from replicator.configuration.connector import ConnectorConfigError, validate_submission
from replicator.configuration.masking import mask_properties
from replicator.configuration.properties import MIRUS_CONNECTOR_CLASS, MM2_CONNECTOR_CLASS, SPECS
from replicator.state.records import (
    ConnectorNotStoppedError,
    ConnectorRecord,
    ConnectorState,
    PartitionPauseError,
    TasksStillStoppingError,
    UnknownConnectorError,
)
from replicator.state.store import Store

log = logging.getLogger(__name__)

PLUGINS = (MIRUS_CONNECTOR_CLASS, MM2_CONNECTOR_CLASS)
REGEX_ROUTER = "org.apache.kafka.connect.transforms.RegexRouter"
BYTE_ARRAY_CONVERTER = "org.apache.kafka.connect.converters.ByteArrayConverter"
# The other plug-ins a connector config may name (`connectorsOnly=false`), with their config definitions.
OTHER_PLUGINS: dict[str, tuple[str, list[dict[str, Any]]]] = {
    REGEX_ROUTER: ("transformation", definitions.regex_router_definitions()),
    BYTE_ARRAY_CONVERTER: ("converter", []),
}
CONNECTOR_TYPE = "source"
# Larger request bodies are refused with 413 before they are read: a connector config with a few CA bundles in
# it is well under this.
MAX_BODY_BYTES = 1024 * 1024
# Set by deploy/Dockerfile from its build argument of the same name: `GET /`'s commit.
ENV_COMMIT = "MIRUS_COMMIT"


class ApiError(Exception):
    """Becomes Kafka Connect's error response: `{"error_code": status, "message": message}`."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _error(status: int, message: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error_code": status, "message": message}, status_code=status, headers=headers)


def _not_found(name: str) -> ApiError:
    return ApiError(404, f"Connector {name} not found")


def _invalid(exc: ConnectorConfigError) -> ApiError:
    lines = "\n".join(f"{name}: {reason}" for name, reason in exc.errors)
    return ApiError(
        400,
        f"Connector configuration is invalid and contains the following {len(exc.errors)} error(s):\n{lines}\n"
        "You can also find the above list of errors at the endpoint "
        "`/connector-plugins/{connectorType}/config/validate`",
    )


@dataclass
class Call:
    """What a handler gets: path parameters, query parameters (repeated ones as lists) and the JSON body."""

    path: dict[str, Any]
    query: dict[str, list[str]]
    body: Any = None
    base_url: str = ""

    def flag(self, name: str, default: bool = False) -> bool:
        values = self.query.get(name, [str(default)])
        value = values[-1].lower()
        if value not in ("true", "false"):
            raise ApiError(400, f"query parameter {name} must be true or false, got {values[-1]!r}")
        return value == "true"


@dataclass
class ConnectApi:
    store: Store
    worker_id: str  # host:port of this API, Kafka Connect's worker id
    destination_bootstrap_servers: str | None = None
    _cluster_id: str | None = field(default=None, init=False)
    loggers: LoggerLevels = field(default_factory=LoggerLevels, init=False)

    # -- shapes --------------------------------------------------------------------------------------------

    def _record(self, name: str) -> ConnectorRecord:
        try:
            return self.store.get_connector(name)
        except UnknownConnectorError:
            raise _not_found(name) from None

    def info(self, name: str) -> dict[str, Any]:
        record = self._record(name)
        tasks = sorted(self.store.read_assignment(name))
        return {
            "name": name,
            "config": _config_strings(mask_properties(record.properties)),
            "tasks": [{"connector": name, "task": t} for t in tasks],
            "type": CONNECTOR_TYPE,
        }

    def status(self, name: str) -> dict[str, Any]:
        try:
            return self._status_body(connectors.connect_status(self.store, name))
        except UnknownConnectorError:
            raise _not_found(name) from None

    def _status_body(self, status: connectors.ConnectStatus) -> dict[str, Any]:
        connector: dict[str, Any] = {"state": status.state, "worker_id": self.worker_id}
        if status.trace:
            connector["trace"] = status.trace
        body: dict[str, Any] = {
            "name": status.name,
            "connector": connector,
            "tasks": [_task_state(t) for t in status.tasks],
            "type": CONNECTOR_TYPE,
        }
        if status.partitions:  # an extension (docs/API.md): partitions that do not replicate, and why
            body["partitions"] = [_stopped(p) for p in status.partitions]
        return body

    # -- routes --------------------------------------------------------------------------------------------

    def root(self, call: Call) -> Response:
        return JSONResponse({"version": _version(), "commit": _commit(), "kafka_cluster_id": self.cluster_id()})

    def list_connectors(self, call: Call) -> Response:
        expand = call.query.get("expand")
        if not expand:
            return JSONResponse([r.name for r in self.store.list_connectors()])
        statuses = {s.name: s for s in connectors.connect_statuses(self.store)}  # one query for all
        out: dict[str, dict[str, Any]] = {}
        for name, status in statuses.items():
            expansions: dict[str, Any] = {}
            try:
                if "status" in expand:
                    expansions["status"] = self._status_body(status)
                if "info" in expand:
                    expansions["info"] = self.info(name)
            except ApiError:
                continue  # deleted while we looked
            out[name] = expansions
        return JSONResponse(out)

    def create_connector(self, call: Call) -> Response:
        body = _object(call.body, "request body")
        name = body.get("name")
        if not isinstance(name, str) or not name.strip():
            raise ApiError(400, 'Connector name must be set in the request body ("name")')
        config = dict(_object(body.get("config"), "config"))
        _check_name(config, name)
        state = str(body.get("initial_state") or ConnectorState.RUNNING).upper()
        if state not in (ConnectorState.RUNNING, ConnectorState.PAUSED, "STOPPED"):
            raise ApiError(400, f"initial_state must be RUNNING, PAUSED or STOPPED, got {body.get('initial_state')!r}")
        if self._exists(name):
            raise ApiError(409, f"Connector {name} already exists")
        stored = self._put(config, ConnectorState.PAUSED if state == "STOPPED" else ConnectorState(state))
        return JSONResponse(self.info(stored.name), status_code=201, headers=_location(call, stored.name))

    def get_connector(self, call: Call) -> Response:
        return JSONResponse(self.info(call.path["name"]))

    def get_config(self, call: Call) -> Response:
        return JSONResponse(self.info(call.path["name"])["config"])

    def put_config(self, call: Call) -> Response:
        name = call.path["name"]
        config = dict(_object(call.body, "request body"))
        _check_name(config, name)
        stored = self._put(config, ConnectorState.RUNNING)
        if stored.created:
            return JSONResponse(self.info(name), status_code=201, headers=_location(call, name))
        return JSONResponse(self.info(name))

    def get_status(self, call: Call) -> Response:
        return JSONResponse(self.status(call.path["name"]))

    def task_configs(self, name: str) -> dict[int, dict[str, str]]:
        """Each task's config: the connector's (secrets masked) and the partitions assigned to the task."""
        config = _config_strings(mask_properties(self._record(name).properties))
        return {
            task_id: {**config, "partitions": json.dumps([{"topic": t, "partition": p} for t, p in partitions])}
            for task_id, partitions in sorted(self.store.read_assignment(name).items())
        }

    def get_tasks(self, call: Call) -> Response:
        name = call.path["name"]
        return JSONResponse(
            [{"id": {"connector": name, "task": t}, "config": c} for t, c in self.task_configs(name).items()]
        )

    def get_tasks_config(self, call: Call) -> Response:
        """Kafka Connect's deprecated form of `get_tasks`: `{"<connector>-<task>": config}`."""
        name = call.path["name"]
        return JSONResponse({f"{name}-{t}": c for t, c in self.task_configs(name).items()})

    def get_task_status(self, call: Call) -> Response:
        name, task_id = call.path["name"], call.path["task"]
        for task in self.status(name)["tasks"]:
            if task["id"] == task_id:
                return JSONResponse(task)
        raise ApiError(404, f"Unknown task: {name}-{task_id}")

    def get_topics(self, call: Call) -> Response:
        name = call.path["name"]
        self._record(name)
        topics = sorted({t for parts in self.store.read_assignment(name).values() for t, _ in parts})
        return JSONResponse({name: {"topics": topics}})

    def reset_topics(self, call: Call) -> Response:
        """Kafka Connect forgets the topics a connector used; the topics listed here are those assigned now, so no
        topic the connector stopped using is ever listed and there is nothing to forget (docs/API.md)."""
        self._record(call.path["name"])
        return Response(status_code=202)

    def restart_connector(self, call: Call) -> Response:
        name = call.path["name"]
        include_tasks, only_failed = call.flag("includeTasks"), call.flag("onlyFailed")
        self._apply(connectors.restart_connector, name)
        if not include_tasks and not only_failed:
            return Response(status_code=204)
        status = self.status(name)
        status["connector"]["state"] = "RESTARTING"
        for task in status["tasks"]:
            if include_tasks and (not only_failed or task["state"] == "FAILED"):
                task["state"] = "RESTARTING"
        return JSONResponse(status, status_code=202)

    def restart_task(self, call: Call) -> Response:
        name, task_id = call.path["name"], call.path["task"]
        if not self._exists(name):
            raise _not_found(name)
        if task_id not in self.store.read_assignment(name):
            raise ApiError(404, f"Unknown task: {name}-{task_id}")
        self._apply(connectors.restart_connector, name)
        return Response(status_code=204)

    def pause(self, call: Call) -> Response:
        self._apply(connectors.pause_connector, call.path["name"])
        return Response(status_code=202)

    def resume(self, call: Call) -> Response:
        self._apply(connectors.resume_connector, call.path["name"])
        return Response(status_code=202)

    # -- operator pauses of single partitions (an extension: outside Kafka Connect's API, docs/API.md) -----------

    def pause_partition(self, call: Call) -> Response:
        name, tp = call.path["name"], (call.path["topic"], call.path["partition"])
        body = _object(call.body if call.body is not None else {}, "request body")
        reason = body.get("reason")
        if not isinstance(reason, str):
            raise ApiError(400, 'Request body must be {"reason": "<why the partition is paused>"}')
        try:
            connectors.pause_partition(self.store, name, tp, reason)
        except UnknownConnectorError:
            raise _not_found(name) from None
        except PartitionPauseError as exc:
            raise ApiError(400, str(exc)) from None
        return Response(status_code=202)

    def resume_partition(self, call: Call) -> Response:
        name, (topic, partition) = call.path["name"], (call.path["topic"], call.path["partition"])
        try:
            resumed = connectors.resume_partition(self.store, name, (topic, partition))
        except UnknownConnectorError:
            raise _not_found(name) from None
        if not resumed:
            raise ApiError(404, f"Partition {topic}[{partition}] of connector {name} is not paused by an operator")
        return Response(status_code=202)

    def paused_partitions(self, call: Call) -> Response:
        name = call.path["name"]
        if not self._exists(name):
            raise _not_found(name)
        pauses = self.store.partition_pauses(name)
        return JSONResponse(
            [
                {"topic": t, "partition": p, "reason": row.reason, "paused_at": row.paused_at.isoformat()}
                for (t, p), row in pauses.items()
            ]
        )

    def delete(self, call: Call) -> Response:
        self._apply(connectors.delete_connector, call.path["name"])
        return Response(status_code=204)

    def plugins(self, call: Call) -> Response:
        listed = [{"class": c, "type": CONNECTOR_TYPE, "version": _version()} for c in PLUGINS]
        if not call.flag("connectorsOnly", default=True):
            listed += [{"class": c, "type": kind, "version": _version()} for c, (kind, _) in OTHER_PLUGINS.items()]
        return JSONResponse(listed)

    def plugin_config(self, call: Call) -> Response:
        plugin = call.path["plugin"]
        if any(_plugin_matches(c, plugin) for c in PLUGINS):
            return JSONResponse(definitions.definitions())
        other = next((keys for c, (_, keys) in OTHER_PLUGINS.items() if _plugin_matches(c, plugin)), None)
        if other is None:
            raise ApiError(404, f"Unknown plugin {plugin}.")
        return JSONResponse(other)

    def validate(self, call: Call) -> Response:
        plugin = call.path["plugin"]
        cls = next((c for c in PLUGINS if _plugin_matches(c, plugin)), None)
        if cls is None:
            raise ApiError(404, f"Failed to find any class that implements Connector and which name matches {plugin}")
        config = dict(_object(call.body, "request body"))
        included = config.get("connector.class")
        if included is not None and not _plugin_matches(str(included), plugin):
            raise ApiError(400, f"Included connector type {included} does not match request type {plugin}")
        submitted = {"connector.class": cls, **config}
        checked = submitted if submitted.get("name") else {**submitted, "name": "validation"}
        try:
            validate_submission(checked)
            errors: list[tuple[str, str]] = []
        except ConnectorConfigError as exc:
            errors = exc.errors
        return JSONResponse(definitions.validation(cls, submitted, errors))

    def get_offsets(self, call: Call) -> Response:
        name = call.path["name"]
        properties = self._record(name).properties
        offsets = sorted(self.store.load_offsets(name).items())
        if not _is_mm2(properties):
            return JSONResponse(
                {
                    "offsets": [
                        {"partition": {"topic": t, "partition": p}, "offset": {"offset": o}} for (t, p), o in offsets
                    ]
                }
            )
        # MirrorMaker 2 stores the offset of the last record it replicated; ours is the next one to replicate.
        cluster = str(properties.get("source.cluster.alias") or SPECS["source.cluster.alias"].default)
        return JSONResponse(
            {
                "offsets": [
                    {"partition": {"cluster": cluster, "topic": t, "partition": p}, "offset": {"offset": o - 1}}
                    for (t, p), o in offsets
                ]
            }
        )

    def alter_offsets(self, call: Call) -> Response:
        name = call.path["name"]
        self._alter(name, _parse_offsets(call.body))
        return JSONResponse({"message": "The offsets for this connector have been altered successfully"})

    def reset_offsets(self, call: Call) -> Response:
        self._alter(call.path["name"], None)
        return JSONResponse({"message": "The offsets for this connector have been reset successfully"})

    def list_loggers(self, call: Call) -> Response:
        return JSONResponse(self.loggers.all())

    def get_logger(self, call: Call) -> Response:
        name = call.path["logger"]
        level = self.loggers.get(name)
        if level is None:
            raise ApiError(404, f"Logger {name} not found.")
        return JSONResponse(level)

    def set_logger(self, call: Call) -> Response:
        level = _object(call.body, "request body").get("level")
        if level is None:
            raise ApiError(400, "Desired 'level' parameter was not specified in request.")
        if not valid_level(level):
            raise ApiError(404, f"invalid log level '{level}'.")
        scope = (call.query.get("scope") or ["worker"])[-1].lower()
        if scope not in ("worker", "cluster"):
            log.warning("Received invalid scope '%s' in request to adjust logging level; will default to worker", scope)
        changed = self.loggers.set(call.path["logger"], level)
        log.info("log level of %s set to %s (scope %s)", call.path["logger"], level, scope)
        return Response(status_code=204) if scope == "cluster" else JSONResponse(changed)

    def metrics(self, call: Call) -> Response:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(StoreCollector(self.store))
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    # -- helpers -------------------------------------------------------------------------------------------

    def _exists(self, name: str) -> bool:
        return self.store.connector_head(name) is not None

    def _put(self, config: dict[str, Any], state: ConnectorState) -> connectors.StoredConnector:
        try:
            return connectors.put_connector(self.store, config, state)
        except ConnectorConfigError as exc:
            raise _invalid(exc) from None

    def _apply(self, action: Callable[[Store, str], None], name: str) -> None:
        try:
            action(self.store, name)
        except UnknownConnectorError:
            raise _not_found(name) from None

    def _alter(self, name: str, offsets: dict[SourcePartition, int | None] | None) -> None:
        try:
            connectors.alter_offsets(self.store, name, offsets)
        except UnknownConnectorError:
            raise _not_found(name) from None
        except TasksStillStoppingError as exc:
            raise ApiError(409, str(exc)) from None
        except ConnectorNotStoppedError as exc:
            raise ApiError(
                400,
                f"{exc}. Connectors must be paused (PUT /connectors/{name}/pause, or /stop) before their offsets "
                "can be modified",
            ) from None

    def cluster_id(self) -> str | None:
        """The destination cluster's id (Kafka Connect reports the cluster its worker writes to): the one the
        metadata watcher recorded for the connectors when they all write to one cluster (read with the connectors'
        own security settings there, so a secured destination needs none here), else asked of the platform's
        destination (`MIRUS_DESTINATION_BOOTSTRAP_SERVERS`)."""
        recorded = self.store.destination_cluster_ids()
        if len(recorded) == 1:
            return next(iter(recorded))
        if self._cluster_id is None and self.destination_bootstrap_servers:
            try:
                admin = AdminClient({"bootstrap.servers": self.destination_bootstrap_servers})
                self._cluster_id = admin.list_topics(timeout=2).cluster_id
            except Exception as exc:  # an unreachable cluster must not break the version probe
                log.warning("destination cluster id unavailable: %s", exc)
        return self._cluster_id


# -- pure helpers ----------------------------------------------------------------------------------------------


@functools.cache
def _commit() -> str:
    """The git commit the package was installed from: the image's build argument (deploy/Dockerfile, whose build
    context has no `.git`), else pip's record of a VCS install, else the source checkout's HEAD (editable installs);
    "unknown" for an install from a tree without git history."""
    if built := os.environ.get(ENV_COMMIT, "").strip():
        return built
    try:
        direct = metadata.distribution("mirus-dagster").read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        direct = None
    commit = (json.loads(direct).get("vcs_info") or {}).get("commit_id") if direct else None
    if commit:
        return str(commit)
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head.stdout.strip() or "unknown"


@functools.cache
def _version() -> str:
    try:
        return metadata.version("mirus-dagster")
    except metadata.PackageNotFoundError:
        return "unknown"


def _config_strings(props: Mapping[str, object]) -> dict[str, str]:
    """Kafka Connect configs are string maps: numbers and booleans submitted as JSON are shown as strings."""
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in props.items()}


def _stopped(partition: connectors.StoppedPartition) -> dict[str, Any]:
    return {
        "topic": partition.topic,
        "partition": partition.partition,
        "state": partition.state,
        "reason": partition.reason,
        "since": partition.since.isoformat(),
        "task": partition.task_id,
    }


def _task_state(task: connectors.ConnectTaskStatus) -> dict[str, Any]:
    out: dict[str, Any] = {"id": task.task_id, "state": task.state, "worker_id": task.worker}
    if task.trace:
        out["trace"] = task.trace
    return out


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ApiError(400, f"{what} must be a JSON object")
    return value


def _check_name(config: dict[str, Any], name: str) -> None:
    given = config.setdefault("name", name)
    if given != name:
        raise ApiError(400, f"Connector name configuration ({given}) doesn't match connector name in the URL ({name})")


def _location(call: Call, name: str) -> dict[str, str]:
    return {"Location": f"{call.base_url.rstrip('/')}/connectors/{name}"}


def _is_mm2(properties: Mapping[str, object]) -> bool:
    return _plugin_matches(MM2_CONNECTOR_CLASS, str(properties.get("connector.class", "")))


def _plugin_matches(cls: str, requested: str) -> bool:
    simple = cls.rsplit(".", 1)[-1]
    return requested in (cls, simple, simple.removesuffix("Connector"))


def _parse_offsets(body: Any) -> dict[SourcePartition, int | None]:
    """KIP-875's `{"offsets": [{"partition": {...}, "offset": {"offset": N} | null}]}`, in either connector's format.

    Mirus's partition `{"topic", "partition"}` carries N = the next source offset to replicate, as stored here.
    MirrorMaker 2's `{"cluster", "topic", "partition"}` carries the offset of the last record it replicated (its
    task seeks to N + 1), so N + 1 is stored: the record at N is not copied again. -1 there means "none yet".
    """
    entries = _object(body, "request body").get("offsets")
    if not isinstance(entries, list):
        raise ApiError(400, 'The request body must contain an "offsets" list')
    out: dict[SourcePartition, int | None] = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("partition"), dict):
            raise ApiError(400, f'offsets[{i}]: must be an object with a "partition" object')
        partition = entry["partition"]
        unknown = set(partition) - {"topic", "partition", "cluster"}
        topic, number = partition.get("topic"), partition.get("partition")
        mm2 = "cluster" in partition
        if (
            unknown
            or not isinstance(topic, str)
            or not topic
            or not _int_at_least(number, 0)
            or (mm2 and not isinstance(partition["cluster"], str))
        ):
            raise ApiError(
                400,
                f'offsets[{i}].partition: expected {{"topic": <name>, "partition": <number >= 0>}} (Mirus) or '
                f'{{"cluster": <alias>, "topic": <name>, "partition": <number >= 0>}} (MirrorMaker 2), '
                f"got {json.dumps(partition)}",
            )
        offset = entry.get("offset")
        lowest = -1 if mm2 else 0
        if offset is None:
            out[(topic, number)] = None
        elif isinstance(offset, dict) and set(offset) == {"offset"} and _int_at_least(offset["offset"], lowest):
            out[(topic, number)] = offset["offset"] + 1 if mm2 else offset["offset"]
        else:
            raise ApiError(
                400,
                f'offsets[{i}].offset: expected {{"offset": <number >= {lowest}>}} or null, got {json.dumps(offset)}',
            )
    return out


def _int_at_least(value: Any, lowest: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and lowest <= value < 2**63 - 1


# -- the application -------------------------------------------------------------------------------------------

Handler = Callable[[Call], Response]


async def _read_body(request: Request) -> bytes:
    """The body, or `ApiError` 413 as soon as it is known to exceed `MAX_BODY_BYTES` (declared or streamed)."""
    too_large = ApiError(413, f"Request body is larger than {MAX_BODY_BYTES} bytes")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


def _refused(request: Request, status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
    """The error response, logged. Messages name properties and reasons, never values of secrets (the config
    parser redacts them); only their first line is logged."""
    log.log(
        logging.WARNING if status == 413 else logging.INFO,
        "refused %s %s from %s: %d %s",
        request.method,
        request.url.path,
        request.client.host if request.client else "?",
        status,
        message.splitlines()[0] if message else "",
    )
    return _error(status, message, headers)


def _endpoint(handler: Handler, *, reads_body: bool) -> Callable[[Request], Any]:
    async def endpoint(request: Request) -> Response:
        try:
            body = None
            if reads_body:
                raw = await _read_body(request)
                try:
                    body = json.loads(raw) if raw else None
                except ValueError as exc:
                    raise ApiError(400, f"Request body is not valid JSON: {exc}") from None
            query: dict[str, list[str]] = defaultdict(list)
            for key, value in request.query_params.multi_items():
                query[key].append(value)
            call = Call(dict(request.path_params), dict(query), body, str(request.base_url))
            return await run_in_threadpool(handler, call)
        except ApiError as exc:
            return _refused(request, exc.status, exc.message)

    return endpoint


def create_app(store: Store, settings: ApiSettings, destination_bootstrap_servers: str | None = None) -> Any:
    """The ASGI application; `Credentials` resolves the auth references now, so a bad one fails at start."""
    api = ConnectApi(store, f"{settings.host}:{settings.port}", destination_bootstrap_servers)
    routes = [
        ("GET", "/", api.root),
        ("GET", "/metrics", api.metrics),
        ("GET", "/connectors", api.list_connectors),
        ("POST", "/connectors", api.create_connector),
        ("GET", "/connectors/{name}", api.get_connector),
        ("DELETE", "/connectors/{name}", api.delete),
        ("GET", "/connectors/{name}/config", api.get_config),
        ("PUT", "/connectors/{name}/config", api.put_config),
        ("GET", "/connectors/{name}/status", api.get_status),
        ("GET", "/connectors/{name}/tasks", api.get_tasks),
        ("GET", "/connectors/{name}/tasks-config", api.get_tasks_config),
        ("GET", "/connectors/{name}/tasks/{task:int}/status", api.get_task_status),
        ("POST", "/connectors/{name}/tasks/{task:int}/restart", api.restart_task),
        ("GET", "/connectors/{name}/topics", api.get_topics),
        ("PUT", "/connectors/{name}/topics/reset", api.reset_topics),
        ("POST", "/connectors/{name}/restart", api.restart_connector),
        ("PUT", "/connectors/{name}/pause", api.pause),
        ("PUT", "/connectors/{name}/stop", api.pause),
        ("PUT", "/connectors/{name}/resume", api.resume),
        ("GET", "/connectors/{name}/partitions/paused", api.paused_partitions),
        ("PUT", "/connectors/{name}/partitions/{topic}/{partition:int}/pause", api.pause_partition),
        ("PUT", "/connectors/{name}/partitions/{topic}/{partition:int}/resume", api.resume_partition),
        ("GET", "/connectors/{name}/offsets", api.get_offsets),
        ("PATCH", "/connectors/{name}/offsets", api.alter_offsets),
        ("DELETE", "/connectors/{name}/offsets", api.reset_offsets),
        ("GET", "/connector-plugins", api.plugins),
        ("GET", "/connector-plugins/{plugin}/config", api.plugin_config),
        ("PUT", "/connector-plugins/{plugin}/config/validate", api.validate),
        ("GET", "/admin/loggers", api.list_loggers),
        ("GET", "/admin/loggers/{logger}", api.get_logger),
        ("PUT", "/admin/loggers/{logger}", api.set_logger),
    ]
    # Routes sharing a path are tried in turn; a method no route takes gets 405.
    starlette_routes = [
        Route(path, _endpoint(handler, reads_body=method in ("POST", "PUT", "PATCH")), methods=[method])
        for method, path, handler in routes
    ]

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return _refused(request, exc.status_code, exc.detail, exc.headers)

    app = Starlette(routes=starlette_routes, exception_handlers={HTTPException: http_error})
    return AuthMiddleware(app, Credentials(settings))


def serve(store: Store, settings: ApiSettings, destination_bootstrap_servers: str | None = None) -> None:
    """Run the API in this process until interrupted."""
    app = create_app(store, settings, destination_bootstrap_servers)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="info")
