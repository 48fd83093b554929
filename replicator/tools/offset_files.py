"""Mirus's offset tool formats, byte for byte, so that files written by either tool are read by the other.

- CSV, no header: `connector-id,topic,partition,offset`; an empty last field is a null offset.
- JSON Lines: `{"connectorId":"…","topic":"…","partition":1,"offset":123}`; `"offset":null` allowed.

An offset is the next source offset to replicate (Kafka Connect's and Mirus's meaning, and a consumer group's).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

Format = Literal["csv", "json"]


@dataclass(frozen=True, order=True)
class OffsetLine:
    connector: str
    topic: str
    partition: int
    offset: int | None


class OffsetFileError(ValueError):
    """The file is malformed; the message lists every bad line by number."""


def write_offsets(lines: Iterable[OffsetLine], fmt: Format) -> str:
    out = io.StringIO()
    if fmt == "csv":
        writer = csv.writer(out, lineterminator="\n")
        for line in lines:
            writer.writerow([line.connector, line.topic, line.partition, "" if line.offset is None else line.offset])
    else:
        for line in lines:
            record = {
                "connectorId": line.connector,
                "topic": line.topic,
                "partition": line.partition,
                "offset": line.offset,
            }
            out.write(json.dumps(record, separators=(",", ":")) + "\n")
    return out.getvalue()


def read_offsets(text: str, fmt: Format) -> list[OffsetLine]:
    """Every line of an offset file; blank lines are skipped. Raises `OffsetFileError` naming every bad line."""
    lines: list[OffsetLine] = []
    problems: list[str] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            lines.append(_csv_line(raw) if fmt == "csv" else _json_line(raw))
        except ValueError as exc:
            problems.append(f"line {number}: {exc}")
    if problems:
        raise OffsetFileError("\n".join(problems))
    return lines


def _csv_line(raw: str) -> OffsetLine:
    fields = next(csv.reader([raw]))
    if len(fields) != 4:
        raise ValueError(f"expected connector-id,topic,partition,offset, got {len(fields)} field(s)")
    connector, topic, partition, offset = (f.strip() for f in fields)
    return _checked(connector, topic, _integer(partition, "partition"), None if offset == "" else _integer(offset))


def _json_line(raw: str) -> OffsetLine:
    try:
        record = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc.msg}") from None
    if not isinstance(record, dict) or set(record) != {"connectorId", "topic", "partition", "offset"}:
        raise ValueError('expected {"connectorId":..,"topic":..,"partition":..,"offset":..}')
    partition, offset = record["partition"], record["offset"]
    for what, value in (("partition", partition), ("offset", offset)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise ValueError(f"{what} must be a whole number, got {json.dumps(value)}")
    if partition is None:
        raise ValueError("partition must be a whole number, got null")
    return _checked(record["connectorId"], record["topic"], partition, offset)


def _integer(text: str, what: str = "offset") -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{what} must be a whole number, got {text!r}") from None


def _checked(connector: object, topic: object, partition: int, offset: int | None) -> OffsetLine:
    if not isinstance(connector, str) or not connector:
        raise ValueError("connector id must be a non-empty string")
    if not isinstance(topic, str) or not topic:
        raise ValueError("topic must be a non-empty string")
    if partition < 0:
        raise ValueError(f"partition must be >= 0, got {partition}")
    if offset is not None and offset < 0:
        raise ValueError(f"offset must be >= 0 or empty, got {offset}")
    return OffsetLine(connector, topic, partition, offset)
