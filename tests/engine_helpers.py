"""Running replicator tasks in tests: a connector in the store, a task in a thread, and waiting on outcomes; the
failure message of an in-process Dagster run."""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, text

from mirus_dagster.settings import StackEndpoints
from replicator.assignment import SourcePartition
from replicator.configuration.connector import ConnectorConfig, validate_submission
from replicator.engine.metrics import TopicCounters
from replicator.engine.ownership import run_owned
from replicator.engine.source_reader import DEFAULT_LIMITS, TierLimits
from replicator.engine.task import ReplicationTask, TaskExit
from replicator.state.database import make_engine, upgrade
from replicator.state.head_notices import HeadNotices
from replicator.state.records import MetricRow
from replicator.state.store import Store

if TYPE_CHECKING:
    import dagster as dg


def connector_properties(stack: StackEndpoints, name: str, **extra: Any) -> dict[str, Any]:
    """Mirus-style properties between the test stack's two clusters."""
    return {
        "name": name,
        "connector.class": "com.salesforce.mirus.MirusSourceConnector",
        "consumer.bootstrap.servers": stack.source_bootstrap_servers,
        "destination.consumer.bootstrap.servers": stack.destination_bootstrap_servers,
        "offset.flush.interval.ms": "200",
        **extra,
    }


def step_failure_message(result: dg.ExecuteInProcessResult, with_causes: bool = False) -> str:
    """The error message of the first failed step of an in-process Dagster run (asserting there is one), and with
    `with_causes` the messages of the errors that caused it, one a line."""
    failures = result.get_step_failure_events()
    assert failures, "no step of the run failed"
    error = failures[0].step_failure_data.error
    assert error is not None, "the failed step carries no error"
    messages = [error.message]
    while with_causes and (error := error.cause or error.context) is not None:
        messages.append(error.message)
    return "\n".join(messages)


def private_database(stack: StackEndpoints, name: str) -> Engine:
    """A migrated database of its own on the stack's Postgres, for tests that break its tables on purpose."""
    admin = make_engine(stack.database_url).execution_options(isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name.replace("-", "_")}"'))
    admin.dispose()
    engine = make_engine(stack.database_url.rsplit("/", 1)[0] + f"/{name.replace('-', '_')}")
    upgrade(engine)
    return engine


def metric_row(topic: str, end: datetime, records: int, histogram: dict[str, int] | None = None) -> MetricRow:
    """A sample of `records` records of 10 bytes, each 50 ms late, with a lag of 7."""
    counters = TopicCounters()
    counters.add(records, records * 10)
    counters.add_latencies(1_000, [950] * records)
    return MetricRow(
        task_id=0,
        topic=topic,
        interval_start=end - timedelta(seconds=10),
        interval_end=end,
        records=records,
        bytes=records * 10,
        latency_min_ms=50,
        latency_max_ms=50,
        latency_sum_ms=50 * records,
        latency_count=records,
        latency_histogram=histogram or counters.cumulative_histogram(),
        lag=7,
    )


def insert_partition_sample(conn: Connection, connector: str, partition: int, row: MetricRow) -> None:
    """A sample as stored before migration 0006, one per partition."""
    values = {
        **{k: v for k, v in asdict(row).items() if k != "resent"},  # a column since migration 0011
        "connector": connector,
        "partition": partition,
        "latency_histogram": json.dumps(row.latency_histogram),
    }
    placeholders = ", ".join(
        "CAST(:latency_histogram AS jsonb)" if k == "latency_histogram" else f":{k}" for k in values
    )
    conn.execute(text(f"INSERT INTO metric_samples ({', '.join(values)}) VALUES ({placeholders})"), values)


def create_connector(
    store: Store, properties: Mapping[str, Any], assignment: Mapping[int, Sequence[SourcePartition]]
) -> ConnectorConfig:
    config = validate_submission(properties)
    store.put_connector(config.name, config.raw, config.tasks_max)
    store.write_assignment(config.name, assignment)
    return config


@dataclass
class TaskThread:
    """A task running in a background thread, stoppable like a terminated run."""

    task: ReplicationTask
    stop: threading.Event = field(default_factory=threading.Event)
    outcome: TaskExit | None = None
    error: BaseException | None = None
    events: list[str] = field(default_factory=list)
    thread: threading.Thread | None = None
    owned: bool = False  # as a run does: standing by while another instance owns the task (replicator.engine.ownership)

    @classmethod
    def start(
        cls,
        store: Store,
        connector: str,
        task_id: int = 0,
        owner: str = "test",
        *,
        owned: bool = False,
        reader_limits: TierLimits = DEFAULT_LIMITS,
        notices: HeadNotices | None = None,
    ) -> TaskThread:
        task = ReplicationTask(
            store, connector, task_id, owner, metrics_interval_s=1.0, reader_limits=reader_limits, notices=notices
        )
        runner = cls(task=task, owned=owned)
        runner.task.on_event = runner.events.append
        runner.thread = threading.Thread(target=runner._run, daemon=True, name=f"{connector}-{task_id}")
        runner.thread.start()
        return runner

    def _run(self) -> None:
        try:
            if self.owned:
                self.outcome = run_owned(self.task, self.stop.is_set)
            else:
                self.outcome = self.task.run(self.stop.is_set)
        except BaseException as exc:
            self.error = exc

    def finish(self, timeout: float = 60.0) -> TaskExit | None:
        """Ask the task to stop and wait until it has flushed, committed and closed."""
        self.stop.set()
        return self.join(timeout)

    def join(self, timeout: float = 60.0) -> TaskExit | None:
        assert self.thread is not None
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"task did not end within {timeout}s; events: {self.events[-5:]}"
        if self.error is not None:
            raise self.error
        return self.outcome
