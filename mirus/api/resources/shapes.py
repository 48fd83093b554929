"""A connector as Kafka Connect shows it: its info (config with secrets masked, tasks) and its status, read from the
store. Every resource that names a connector looks it up here, so an unknown one is the same 404 everywhere."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from mirus.api.resources.calls import not_found
from replicator.configuration import administration
from replicator.configuration.masking import mask_properties
from replicator.state.records import ConnectorRecord, UnknownConnectorError
from replicator.state.store import Store

CONNECTOR_TYPE = "source"


@dataclass
class ConnectorShapes:
    store: Store
    worker_id: str  # host:port of this API, Kafka Connect's worker id

    def record(self, name: str) -> ConnectorRecord:
        try:
            return self.store.get_connector(name)
        except UnknownConnectorError:
            raise not_found(name) from None

    def exists(self, name: str) -> bool:
        return self.store.connector_head(name) is not None

    def info(self, name: str) -> dict[str, Any]:
        record = self.record(name)
        tasks = sorted(self.store.read_assignment(name))
        return {
            "name": name,
            "config": config_strings(mask_properties(record.properties)),
            "tasks": [{"connector": name, "task": t} for t in tasks],
            "type": CONNECTOR_TYPE,
        }

    def status(self, name: str) -> dict[str, Any]:
        try:
            return self.status_body(administration.connect_status(self.store, name))
        except UnknownConnectorError:
            raise not_found(name) from None

    def status_body(self, status: administration.ConnectStatus) -> dict[str, Any]:
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

    def apply(self, action: Callable[[Store, str], None], name: str) -> None:
        try:
            action(self.store, name)
        except UnknownConnectorError:
            raise not_found(name) from None


def config_strings(props: Mapping[str, object]) -> dict[str, str]:
    """Kafka Connect configs are string maps: numbers and booleans submitted as JSON are shown as strings."""
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in props.items()}


def _stopped(partition: administration.StoppedPartition) -> dict[str, Any]:
    return {
        "topic": partition.topic,
        "partition": partition.partition,
        "state": partition.state,
        "reason": partition.reason,
        "since": partition.since.isoformat(),
        "task": partition.task_id,
    }


def _task_state(task: administration.ConnectTaskStatus) -> dict[str, Any]:
    out: dict[str, Any] = {"id": task.task_id, "state": task.state, "worker_id": task.worker}
    if task.trace:
        out["trace"] = task.trace
    return out
