"""`/connectors/{name}/tasks…`: each task's config (the connector's, secrets masked, and its partitions), status and
restart."""

from __future__ import annotations

import json
from dataclasses import dataclass

from starlette.responses import JSONResponse, Response

from mirus.api.resources.calls import ApiError, Call, not_found
from mirus.api.resources.shapes import ConnectorShapes, config_strings
from replicator.configuration import administration
from replicator.configuration.masking import mask_properties


@dataclass
class TasksResource:
    shapes: ConnectorShapes

    def task_configs(self, name: str) -> dict[int, dict[str, str]]:
        """Each task's config: the connector's (secrets masked) and the partitions assigned to the task."""
        config = config_strings(mask_properties(self.shapes.record(name).properties))
        return {
            task_id: {**config, "partitions": json.dumps([{"topic": t, "partition": p} for t, p in partitions])}
            for task_id, partitions in sorted(self.shapes.store.read_assignment(name).items())
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
        for task in self.shapes.status(name)["tasks"]:
            if task["id"] == task_id:
                return JSONResponse(task)
        raise ApiError(404, f"Unknown task: {name}-{task_id}")

    def restart_task(self, call: Call) -> Response:
        name, task_id = call.path["name"], call.path["task"]
        if not self.shapes.exists(name):
            raise not_found(name)
        if task_id not in self.shapes.store.read_assignment(name):
            raise ApiError(404, f"Unknown task: {name}-{task_id}")
        self.shapes.apply(administration.restart_connector, name)
        return Response(status_code=204)
