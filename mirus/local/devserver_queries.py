"""What the dev server driver (`mirus.local.devserver`) asks `dagster dev`'s GraphQL API, and a run as that API
shows it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

FINISHED = frozenset({"SUCCESS", "FAILURE", "CANCELED"})

WORKSPACE_QUERY = """
query Workspace {
  workspaceOrError {
    __typename
    ... on Workspace {
      locationEntries {
        name
        loadStatus
        locationOrLoadError {
          __typename
          ... on RepositoryLocation { name repositories { name jobs { name } } }
          ... on PythonError { message stack }
        }
      }
    }
    ... on PythonError { message stack }
  }
}
"""

RUNS_QUERY = """
query Runs($filter: RunsFilter, $limit: Int) {
  runsOrError(filter: $filter, limit: $limit) {
    __typename
    ... on Runs {
      results { runId jobName status creationTime startTime endTime tags { key value } }
    }
    ... on InvalidPipelineRunsFilterError { message }
    ... on PythonError { message stack }
  }
}
"""

LOGS_QUERY = """
query Logs($runId: ID!, $afterCursor: String) {
  logsForRun(runId: $runId, afterCursor: $afterCursor) {
    __typename
    ... on EventConnection {
      cursor
      hasMore
      events { __typename ... on MessageEvent { message timestamp } }
    }
    ... on RunNotFoundError { message }
    ... on PythonError { message stack }
  }
}
"""

TICKS_QUERY = """
query Ticks($selector: SensorSelector!, $after: Float) {
  sensorOrError(sensorSelector: $selector) {
    __typename
    ... on Sensor {
      id sensorState { status ticks(afterTimestamp: $after, limit: 100) { tickId status timestamp } }
    }
    ... on SensorNotFoundError { message }
    ... on PythonError { message stack }
  }
}
"""

STOP_SENSOR_MUTATION = """
mutation Stop($id: String!) { stopSensor(id: $id) { __typename ... on PythonError { message } } }
"""

RESET_SENSOR_MUTATION = """
mutation Reset($selector: SensorSelector!) {
  resetSensor(sensorSelector: $selector) { __typename ... on PythonError { message } }
}
"""


@dataclass(frozen=True)
class RunInfo:
    """A run as the GraphQL API shows it."""

    run_id: str
    job_name: str
    status: str  # QUEUED, STARTING, STARTED, SUCCESS, FAILURE, CANCELING, CANCELED, ...
    tags: dict[str, str]
    creation_time: float
    start_time: float | None
    end_time: float | None

    @property
    def finished(self) -> bool:
        return self.status in FINISHED

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> RunInfo:
        return cls(
            run_id=data["runId"],
            job_name=data["jobName"],
            status=data["status"],
            tags={t["key"]: t["value"] for t in data["tags"]},
            creation_time=data["creationTime"],
            start_time=data["startTime"],
            end_time=data["endTime"],
        )
