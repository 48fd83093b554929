"""`/connectors` and `/connectors/{name}`: list, create, read, reconfigure, pause, resume, restart and delete a
connector, and the topics it uses. Every change goes through `replicator.configuration.administration`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.responses import JSONResponse, Response

from mirus.api.resources.calls import ApiError, Call, json_object
from mirus.api.resources.shapes import ConnectorShapes
from replicator.configuration import administration
from replicator.configuration.connector import ConnectorConfigError
from replicator.state.records import ConnectorState


@dataclass
class ConnectorsResource:
    shapes: ConnectorShapes

    def list_connectors(self, call: Call) -> Response:
        expand = call.query.get("expand")
        if not expand:
            return JSONResponse([r.name for r in self.shapes.store.list_connectors()])
        statuses = {s.name: s for s in administration.connect_statuses(self.shapes.store)}  # one query for all
        out: dict[str, dict[str, Any]] = {}
        for name, status in statuses.items():
            expansions: dict[str, Any] = {}
            try:
                if "status" in expand:
                    expansions["status"] = self.shapes.status_body(status)
                if "info" in expand:
                    expansions["info"] = self.shapes.info(name)
            except ApiError:
                continue  # deleted while we looked
            out[name] = expansions
        return JSONResponse(out)

    def create_connector(self, call: Call) -> Response:
        body = json_object(call.body, "request body")
        name = body.get("name")
        if not isinstance(name, str) or not name.strip():
            raise ApiError(400, 'Connector name must be set in the request body ("name")')
        config = dict(json_object(body.get("config"), "config"))
        _check_name(config, name)
        state = str(body.get("initial_state") or ConnectorState.RUNNING).upper()
        if state not in (ConnectorState.RUNNING, ConnectorState.PAUSED, "STOPPED"):
            raise ApiError(400, f"initial_state must be RUNNING, PAUSED or STOPPED, got {body.get('initial_state')!r}")
        if self.shapes.exists(name):
            raise ApiError(409, f"Connector {name} already exists")
        stored = self._put(config, ConnectorState.PAUSED if state == "STOPPED" else ConnectorState(state))
        return JSONResponse(self.shapes.info(stored.name), status_code=201, headers=_location(call, stored.name))

    def get_connector(self, call: Call) -> Response:
        return JSONResponse(self.shapes.info(call.path["name"]))

    def get_config(self, call: Call) -> Response:
        return JSONResponse(self.shapes.info(call.path["name"])["config"])

    def put_config(self, call: Call) -> Response:
        name = call.path["name"]
        config = dict(json_object(call.body, "request body"))
        _check_name(config, name)
        stored = self._put(config, ConnectorState.RUNNING)
        if stored.created:
            return JSONResponse(self.shapes.info(name), status_code=201, headers=_location(call, name))
        return JSONResponse(self.shapes.info(name))

    def get_status(self, call: Call) -> Response:
        return JSONResponse(self.shapes.status(call.path["name"]))

    def get_topics(self, call: Call) -> Response:
        name = call.path["name"]
        self.shapes.record(name)
        topics = sorted({t for parts in self.shapes.store.read_assignment(name).values() for t, _ in parts})
        return JSONResponse({name: {"topics": topics}})

    def reset_topics(self, call: Call) -> Response:
        """Kafka Connect forgets the topics a connector used; the topics listed here are those assigned now, so no
        topic the connector stopped using is ever listed and there is nothing to forget (docs/API.md)."""
        self.shapes.record(call.path["name"])
        return Response(status_code=202)

    def restart_connector(self, call: Call) -> Response:
        name = call.path["name"]
        include_tasks, only_failed = call.flag("includeTasks"), call.flag("onlyFailed")
        self.shapes.apply(administration.restart_connector, name)
        if not include_tasks and not only_failed:
            return Response(status_code=204)
        status = self.shapes.status(name)
        status["connector"]["state"] = "RESTARTING"
        for task in status["tasks"]:
            if include_tasks and (not only_failed or task["state"] == "FAILED"):
                task["state"] = "RESTARTING"
        return JSONResponse(status, status_code=202)

    def pause(self, call: Call) -> Response:
        self.shapes.apply(administration.pause_connector, call.path["name"])
        return Response(status_code=202)

    def resume(self, call: Call) -> Response:
        self.shapes.apply(administration.resume_connector, call.path["name"])
        return Response(status_code=202)

    def delete(self, call: Call) -> Response:
        self.shapes.apply(administration.delete_connector, call.path["name"])
        return Response(status_code=204)

    def _put(self, config: dict[str, Any], state: ConnectorState) -> administration.StoredConnector:
        try:
            return administration.put_connector(self.shapes.store, config, state)
        except ConnectorConfigError as exc:
            raise _invalid(exc) from None


def _invalid(exc: ConnectorConfigError) -> ApiError:
    lines = "\n".join(f"{name}: {reason}" for name, reason in exc.errors)
    return ApiError(
        400,
        f"Connector configuration is invalid and contains the following {len(exc.errors)} error(s):\n{lines}\n"
        "You can also find the above list of errors at the endpoint "
        "`/connector-plugins/{connectorType}/config/validate`",
    )


def _check_name(config: dict[str, Any], name: str) -> None:
    given = config.setdefault("name", name)
    if given != name:
        raise ApiError(400, f"Connector name configuration ({given}) doesn't match connector name in the URL ({name})")


def _location(call: Call, name: str) -> dict[str, str]:
    return {"Location": f"{call.base_url.rstrip('/')}/connectors/{name}"}
