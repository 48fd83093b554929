"""`/connectors/{name}/offsets`: read, alter and reset a connector's source offsets (KIP-875), in Mirus's format or
MirrorMaker 2's."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from starlette.responses import JSONResponse, Response

from mirus.api.resources.calls import ApiError, Call, json_object, not_found
from mirus.api.resources.plugins import plugin_matches
from mirus.api.resources.shapes import ConnectorShapes
from replicator.assignment import SourcePartition
from replicator.configuration import administration
from replicator.configuration.properties import MM2_CONNECTOR_CLASS, SPECS
from replicator.state.records import ConnectorNotStoppedError, TasksStillStoppingError, UnknownConnectorError


@dataclass
class OffsetsResource:
    shapes: ConnectorShapes

    def get_offsets(self, call: Call) -> Response:
        name = call.path["name"]
        properties = self.shapes.record(name).properties
        offsets = sorted(self.shapes.store.load_offsets(name).items())
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

    def _alter(self, name: str, offsets: dict[SourcePartition, int | None] | None) -> None:
        try:
            administration.alter_offsets(self.shapes.store, name, offsets)
        except UnknownConnectorError:
            raise not_found(name) from None
        except TasksStillStoppingError as exc:
            raise ApiError(409, str(exc)) from None
        except ConnectorNotStoppedError as exc:
            raise ApiError(
                400,
                f"{exc}. Connectors must be paused (PUT /connectors/{name}/pause, or /stop) before their offsets "
                "can be modified",
            ) from None


def _is_mm2(properties: Mapping[str, object]) -> bool:
    return plugin_matches(MM2_CONNECTOR_CLASS, str(properties.get("connector.class", "")))


def _parse_offsets(body: Any) -> dict[SourcePartition, int | None]:
    """KIP-875's `{"offsets": [{"partition": {...}, "offset": {"offset": N} | null}]}`, in either connector's format.

    Mirus's partition `{"topic", "partition"}` carries N = the next source offset to replicate, as stored here.
    MirrorMaker 2's `{"cluster", "topic", "partition"}` carries the offset of the last record it replicated (its
    task seeks to N + 1), so N + 1 is stored: the record at N is not copied again. -1 there means "none yet".
    """
    entries = json_object(body, "request body").get("offsets")
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
