"""What every resource takes and raises: the parsed request (`Call`) and Kafka Connect's error response (`ApiError`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class ApiError(Exception):
    """Becomes Kafka Connect's error response: `{"error_code": status, "message": message}`."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


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


def not_found(name: str) -> ApiError:
    return ApiError(404, f"Connector {name} not found")


def json_object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ApiError(400, f"{what} must be a JSON object")
    return value
