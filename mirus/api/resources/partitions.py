"""`/connectors/{name}/partitions/…`: operator pauses of single partitions, an extension outside Kafka Connect's API
(docs/API.md)."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.responses import JSONResponse, Response

from mirus.api.resources.calls import ApiError, Call, json_object, not_found
from mirus.api.resources.shapes import ConnectorShapes
from replicator.configuration import administration
from replicator.state.records import PartitionPauseError, UnknownConnectorError


@dataclass
class PartitionPausesResource:
    shapes: ConnectorShapes

    def pause_partition(self, call: Call) -> Response:
        name, tp = call.path["name"], (call.path["topic"], call.path["partition"])
        body = json_object(call.body if call.body is not None else {}, "request body")
        reason = body.get("reason")
        if not isinstance(reason, str):
            raise ApiError(400, 'Request body must be {"reason": "<why the partition is paused>"}')
        try:
            administration.pause_partition(self.shapes.store, name, tp, reason)
        except UnknownConnectorError:
            raise not_found(name) from None
        except PartitionPauseError as exc:
            raise ApiError(400, str(exc)) from None
        return Response(status_code=202)

    def resume_partition(self, call: Call) -> Response:
        name, (topic, partition) = call.path["name"], (call.path["topic"], call.path["partition"])
        try:
            resumed = administration.resume_partition(self.shapes.store, name, (topic, partition))
        except UnknownConnectorError:
            raise not_found(name) from None
        if not resumed:
            raise ApiError(404, f"Partition {topic}[{partition}] of connector {name} is not paused by an operator")
        return Response(status_code=202)

    def paused_partitions(self, call: Call) -> Response:
        name = call.path["name"]
        if not self.shapes.exists(name):
            raise not_found(name)
        pauses = self.shapes.store.partition_pauses(name)
        return JSONResponse(
            [
                {"topic": t, "partition": p, "reason": row.reason, "paused_at": row.paused_at.isoformat()}
                for (t, p), row in pauses.items()
            ]
        )
