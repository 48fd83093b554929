"""`/admin/loggers`: the log levels of this API's process, as Kafka Connect's logging resource sets them."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from starlette.responses import JSONResponse, Response

from mirus.api.loggers import LoggerLevels, valid_level
from mirus.api.resources.calls import ApiError, Call, json_object

log = logging.getLogger(__name__)


@dataclass
class LoggersResource:
    loggers: LoggerLevels = field(default_factory=LoggerLevels)

    def list_loggers(self, call: Call) -> Response:
        return JSONResponse(self.loggers.all())

    def get_logger(self, call: Call) -> Response:
        name = call.path["logger"]
        level = self.loggers.get(name)
        if level is None:
            raise ApiError(404, f"Logger {name} not found.")
        return JSONResponse(level)

    def set_logger(self, call: Call) -> Response:
        level = json_object(call.body, "request body").get("level")
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
