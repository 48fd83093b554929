"""The Kafka Connect REST API over the platform's store: same routes, JSON shapes, status codes and error bodies.

Every change goes through `replicator.configuration.administration`, the code path of the launchpad jobs and the CLI,
so the Dagster run_starter sensor shows it like any other change. Responses never carry a literal secret value.
Departures from Kafka Connect are listed in docs/API.md. The resources answering each route are in
`mirus.api.resources`; this module routes requests to them and turns their `ApiError`s into error responses.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from mirus.api.auth import ApiSettings, AuthMiddleware, Credentials
from mirus.api.resources.admin import LoggersResource
from mirus.api.resources.calls import ApiError, Call
from mirus.api.resources.connectors import ConnectorsResource
from mirus.api.resources.offsets import OffsetsResource
from mirus.api.resources.partitions import PartitionPausesResource
from mirus.api.resources.plugins import PluginsResource
from mirus.api.resources.root import ENV_COMMIT, RootResource
from mirus.api.resources.shapes import ConnectorShapes
from mirus.api.resources.tasks import TasksResource
from replicator.state.store import Store

__all__ = ["ENV_COMMIT", "ConnectApi", "create_app", "serve"]

log = logging.getLogger(__name__)

# Larger request bodies are refused with 413 before they are read: a connector config with a few CA bundles in
# it is well under this.
MAX_BODY_BYTES = 1024 * 1024

Handler = Callable[[Call], Response]


@dataclass
class ConnectApi:
    """The resources of one API, over one store, and the route of each of their handlers."""

    store: Store
    worker_id: str  # host:port of this API, Kafka Connect's worker id
    destination_bootstrap_servers: str | None = None
    root: RootResource = field(init=False)
    connectors: ConnectorsResource = field(init=False)
    tasks: TasksResource = field(init=False)
    partitions: PartitionPausesResource = field(init=False)
    offsets: OffsetsResource = field(init=False)
    plugins: PluginsResource = field(init=False)
    loggers: LoggersResource = field(init=False)

    def __post_init__(self) -> None:
        shapes = ConnectorShapes(self.store, self.worker_id)
        self.root = RootResource(self.store, self.destination_bootstrap_servers)
        self.connectors = ConnectorsResource(shapes)
        self.tasks = TasksResource(shapes)
        self.partitions = PartitionPausesResource(shapes)
        self.offsets = OffsetsResource(shapes)
        self.plugins = PluginsResource()
        self.loggers = LoggersResource()

    def routes(self) -> list[tuple[str, str, Handler]]:
        root, connectors, tasks, partitions = self.root, self.connectors, self.tasks, self.partitions
        offsets, plugins, loggers = self.offsets, self.plugins, self.loggers
        return [
            ("GET", "/", root.root),
            ("GET", "/metrics", root.metrics),
            ("GET", "/connectors", connectors.list_connectors),
            ("POST", "/connectors", connectors.create_connector),
            ("GET", "/connectors/{name}", connectors.get_connector),
            ("DELETE", "/connectors/{name}", connectors.delete),
            ("GET", "/connectors/{name}/config", connectors.get_config),
            ("PUT", "/connectors/{name}/config", connectors.put_config),
            ("GET", "/connectors/{name}/status", connectors.get_status),
            ("GET", "/connectors/{name}/tasks", tasks.get_tasks),
            ("GET", "/connectors/{name}/tasks-config", tasks.get_tasks_config),
            ("GET", "/connectors/{name}/tasks/{task:int}/status", tasks.get_task_status),
            ("POST", "/connectors/{name}/tasks/{task:int}/restart", tasks.restart_task),
            ("GET", "/connectors/{name}/topics", connectors.get_topics),
            ("PUT", "/connectors/{name}/topics/reset", connectors.reset_topics),
            ("POST", "/connectors/{name}/restart", connectors.restart_connector),
            ("PUT", "/connectors/{name}/pause", connectors.pause),
            ("PUT", "/connectors/{name}/stop", connectors.pause),
            ("PUT", "/connectors/{name}/resume", connectors.resume),
            ("GET", "/connectors/{name}/partitions/paused", partitions.paused_partitions),
            ("PUT", "/connectors/{name}/partitions/{topic}/{partition:int}/pause", partitions.pause_partition),
            ("PUT", "/connectors/{name}/partitions/{topic}/{partition:int}/resume", partitions.resume_partition),
            ("GET", "/connectors/{name}/offsets", offsets.get_offsets),
            ("PATCH", "/connectors/{name}/offsets", offsets.alter_offsets),
            ("DELETE", "/connectors/{name}/offsets", offsets.reset_offsets),
            ("GET", "/connector-plugins", plugins.plugins),
            ("GET", "/connector-plugins/{plugin}/config", plugins.plugin_config),
            ("PUT", "/connector-plugins/{plugin}/config/validate", plugins.validate),
            ("GET", "/admin/loggers", loggers.list_loggers),
            ("GET", "/admin/loggers/{logger}", loggers.get_logger),
            ("PUT", "/admin/loggers/{logger}", loggers.set_logger),
        ]


def _error(status: int, message: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error_code": status, "message": message}, status_code=status, headers=headers)


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
    # Routes sharing a path are tried in turn; a method no route takes gets 405.
    starlette_routes = [
        Route(path, _endpoint(handler, reads_body=method in ("POST", "PUT", "PATCH")), methods=[method])
        for method, path, handler in api.routes()
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
