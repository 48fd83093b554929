"""The fault run: replicate a steady load through one connector while its surroundings fail, then verify.

Parts: a source cluster, a destination cluster reached only through a `TcpProxy`, Postgres (the embedded one,
restartable), and `mirus task run` processes — one per task, restarted by the harness when they die, as the
`task_supervisor` sensor does in a deployment. Faults, one at a time in a seeded random order:

- `kill`      SIGKILL of a random task process
- `postgres`  the platform database stops (immediate shutdown) and starts again a few seconds later
- `network`   the proxy resets every connection to the destination and refuses new ones, then lets them through
- `broker`    the destination broker stops (controlled shutdown, data kept) and starts again (Apache Kafka only)
- `refuse`    the destination topic's `max.message.bytes` drops below the size of a batch, so the destination
              refuses the records, then it is raised again (Apache Kafka only: the embedded broker does not
              enforce the limit)

Afterwards the load stops, the harness waits until the engine reports every record committed, stops the
tasks and reads both clusters with `replicator.tools.verify` — the engine's bookkeeping only decides when to look.
The at-least-once duplicate bound is checked per kill: the restarted task may re-send at most what the source
held beyond the partition's committed offset when the process died. With `exactly_once` the connector runs with
`exactly.once.support=required`, the reader uses `read_committed`, and the run passes only with zero duplicates.

The plan is `plan.py`, the load `load.py`, the task processes `task_processes.py`, what a run found `report.py`.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from mirus.faults.brokers import BrokerProcess, KafkaKit, tansu_broker
from mirus.faults.load import Load
from mirus.faults.plan import ALL_FAULTS, EMBEDDED_FAULTS, FaultKind, FaultPlan
from mirus.faults.proxy import TcpProxy
from mirus.faults.report import FaultEvent, FaultReport, KillCheck
from mirus.faults.task_processes import TaskProcesses
from mirus.local.stack import LocalStack, free_port
from mirus.waiting import wait_until
from mirus_dagster.settings import PlatformSettings
from replicator.assignment import SourcePartition
from replicator.clusters import ClusterAdmin, log_offsets
from replicator.configuration.connector import validate_submission
from replicator.state.database import make_engine, upgrade
from replicator.state.store import Store
from replicator.tools.verify import verify_replication
from replicator.tools.verify_report import VerifyReport

# The plan and the report are imported from here by `mirus faults run` and the fault tests.
__all__ = ["ALL_FAULTS", "EMBEDDED_FAULTS", "FaultKind", "FaultPlan", "FaultReport", "FaultRun"]

MAX_MESSAGE_BYTES = 1_000_012  # Apache Kafka's default
REFUSED_MESSAGE_BYTES = 512  # smaller than any batch of the load: every produce request is refused


class FaultRun:
    def __init__(self, plan: FaultPlan, log: Callable[[str], None] = print) -> None:
        self.plan = plan
        self.log = log
        self.rng = random.Random(plan.seed)
        self.name = f"faults-{uuid.uuid4().hex[:8]}"
        self.topic = self.name
        self.destination_topic = f"{self.name}.copy"
        self._cleanup: list[Callable[[], object]] = []

    def run(self) -> FaultReport:
        import tempfile

        with contextlib.ExitStack() as stack:
            work = self.plan.work_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="mirus-faults-")))
            work.mkdir(parents=True, exist_ok=True)
            stack.callback(self._run_cleanup)
            self._start_parts(work)
            return self._replicate_under_faults(work)

    def _run_cleanup(self) -> None:
        for step in reversed(self._cleanup):
            with contextlib.suppress(Exception):
                step()

    # -- parts --------------------------------------------------------------------------------------------

    def _start_parts(self, work: Path) -> None:
        self.proxy = TcpProxy(("127.0.0.1", free_port()))  # the target port is fixed below, before any client
        self._cleanup.append(self.proxy.close)
        if self.plan.apache_kafka:
            kit = KafkaKit(work / "kafka", free_port())
            self._cleanup.append(kit.stop)
            kit.start_zookeeper()
            source = kit.broker("source", free_port(), None, free_port())
            self.destination = kit.broker("destination", self.proxy.target[1], self.proxy.port, free_port())
            source.start()
            self.destination.start()
            source_bootstrap = source.bootstrap
        else:
            self.destination = tansu_broker(
                "destination", self.proxy.target[1], self.proxy.port, work / "logs" / "destination.log"
            )
            self._cleanup.append(self.destination.stop)
            self.destination.start()
            source_bootstrap = None
        settings = PlatformSettings.from_env().model_copy(
            update={
                "state_dir": work / "stack",
                "source_port": free_port(),
                "postgres_port": free_port(),
                "source_bootstrap_servers": source_bootstrap,
                "destination_bootstrap_servers": self.proxy.address,
                "database_url": None,
            }
        )
        self.local = LocalStack(settings)
        self._cleanup.append(self.local.down)
        self.endpoints = self.local.up()
        self.engine = make_engine(self.endpoints.database_url)
        self._cleanup.append(self.engine.dispose)
        upgrade(self.engine)
        self.store = Store(self.engine)

        topic_config = {"retention.ms": "-1"}  # the load's timestamps are thirty days old
        self._create(self.endpoints.source_bootstrap_servers, self.topic, topic_config)
        self._create(self.proxy.address, self.destination_topic, topic_config)

    def _create(self, bootstrap: str, topic: str, config: dict[str, str]) -> None:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for future in admin.create_topics([NewTopic(topic, self.plan.partitions, 1, config=config)]).values():
            future.result(timeout=30)
        wait_until(
            lambda: topic in admin.list_topics(timeout=5).topics, 30, 0.2, f"topic {topic} to appear on {bootstrap}"
        )

    def _register_connector(self) -> dict[int, list[SourcePartition]]:
        timeout = self.plan.producer_message_timeout_ms
        config = validate_submission(
            {
                "name": self.name,
                "connector.class": "com.salesforce.mirus.MirusSourceConnector",
                "consumer.bootstrap.servers": self.endpoints.source_bootstrap_servers,
                "destination.consumer.bootstrap.servers": self.proxy.address,
                "topics.whitelist": self.topic,
                "destination.topic.name.suffix": ".copy",
                "tasks.max": str(self.plan.tasks),
                **({"producer.message.timeout.ms": str(timeout)} if timeout is not None else {}),
                **({"exactly.once.support": "required"} if self.plan.exactly_once else {}),
                **({"start.after.destination.copies": "true"} if self.plan.start_after_copies else {}),
                **({"copy.mode": "batches"} if self.plan.copy_batches else {}),
            }
        )
        self.store.put_connector(config.name, config.raw, config.tasks_max)
        assignment = {
            t: [(self.topic, p) for p in range(self.plan.partitions) if p % self.plan.tasks == t]
            for t in range(self.plan.tasks)
        }
        self.store.write_assignment(config.name, assignment)
        return assignment

    # -- the run itself -----------------------------------------------------------------------------------

    def _replicate_under_faults(self, work: Path) -> FaultReport:
        assignment = self._register_connector()
        env = {**os.environ, **self.endpoints.as_env()}
        (work / "logs").mkdir(parents=True, exist_ok=True)
        load = Load(self.endpoints.source_bootstrap_servers, self.topic, self.plan.partitions, self.plan.rate)
        tasks = TaskProcesses(self.name, self.plan.tasks, env, work / "logs")
        self._cleanup.append(tasks.stop)
        load.start()
        events: list[FaultEvent] = []
        kills: list[KillCheck] = []
        deadline = load.started + self.plan.duration_s
        kinds: list[FaultKind] = []
        while True:
            gap = self.rng.uniform(*self.plan.gap_s)
            # The first round always ends, past the deadline if need be: a slow broker restart must not leave a
            # planned kind out of a short run.
            if time.monotonic() + gap >= deadline and len(events) >= len(self.plan.faults):
                break
            time.sleep(gap)
            if not kinds:  # every kind once per round, in a random order: each one is exercised in a short run
                kinds = list(self.plan.faults)
                self.rng.shuffle(kinds)
            kind = kinds.pop()
            started = time.monotonic()
            detail = self._inject(kind, tasks, assignment, load, kills)
            event = FaultEvent(kind, round(started - load.started, 1), round(time.monotonic() - started, 1), detail)
            self.log(f"{event.at_s:7.1f} s  {kind:<8} {event.lasted_s:5.1f} s  {detail}")
            events.append(event)
        remaining = deadline - time.monotonic()
        if remaining > 0:
            time.sleep(remaining)
        load.stop()
        self.log(f"load stopped: {load.produced:,} records; waiting for the engine to commit them all")
        drain_started = time.monotonic()
        drained = self._wait_committed(load.ends, self.plan.drain_timeout_s)
        drain_seconds = time.monotonic() - drain_started
        tasks.stop()
        self.log("verifying with an independent reader")
        report = verify_replication(
            {"bootstrap.servers": self.endpoints.source_bootstrap_servers},
            {"bootstrap.servers": self.proxy.address},
            {self.topic: self.destination_topic},
            timeout_s=300,
            idle_s=3.0,
            # Copies made as batches carry no provenance header: where they went is in Postgres.
            segments=[s for segments in self.store.load_segments(self.name).values() for s in segments],
        )
        _attribute_replays(kills, report, self.topic)
        result = FaultReport(
            plan=self.plan,
            produced=load.produced,
            load_seconds=load.stopped - load.started,
            events=events,
            kills=kills,
            task_restarts=tasks.restarts,
            drained=drained,
            drain_seconds=drain_seconds,
            verify=report,
        )
        (work / "report.json").write_text(json.dumps(result.to_json(), indent=2, default=str))
        return result

    def _inject(
        self,
        kind: FaultKind,
        tasks: TaskProcesses,
        assignment: dict[int, list[SourcePartition]],
        load: Load,
        kills: list[KillCheck],
    ) -> str:
        outage = self.rng.uniform(*self.plan.outage_s)
        if kind == "kill":
            task_id = self.rng.randrange(self.plan.tasks)
            at = time.monotonic() - load.started
            tasks.kill(task_id)
            # Read after the process is gone: nothing can be committed or copied any more until its successor runs.
            committed = self.store.load_offsets(self.name, assignment[task_id])
            ends = {p: load.ends[p] for _t, p in assignment[task_id]}
            admin = ClusterAdmin({"bootstrap.servers": self.proxy.address})
            written = log_offsets(admin, [(self.destination_topic, p) for p in ends], latest=True)
            kills.append(
                KillCheck(
                    task=task_id,
                    at_s=round(at, 1),
                    uncommitted=sum(ends[p] - committed.get((self.topic, p), 0) for p in ends),
                    committed={str(p): committed.get((self.topic, p), 0) for p in ends},
                    ends={str(p): e for p, e in ends.items()},
                    written={str(p): end for (_t, p), end in written.items()},
                )
            )
            return f"task {task_id} (SIGKILL); {kills[-1].uncommitted} records beyond its committed offsets"
        if kind == "postgres":
            self.local.stop_part("postgres", signal.SIGQUIT)  # immediate shutdown: crash recovery at start
            time.sleep(outage)
            self.local.up()
            return "immediate shutdown, then started again"
        if kind == "network":
            self.proxy.cut()
            time.sleep(outage)
            self.proxy.restore()
            return "every connection to the destination reset and refused, then restored"
        if kind == "broker":
            assert isinstance(self.destination, BrokerProcess)
            self.destination.stop()
            time.sleep(outage)
            self.destination.start()
            return "destination broker stopped (data kept) and started again"
        if kind == "refuse":
            self._set_max_message_bytes(REFUSED_MESSAGE_BYTES)
            time.sleep(outage)
            self._set_max_message_bytes(MAX_MESSAGE_BYTES)
            return f"destination max.message.bytes={REFUSED_MESSAGE_BYTES}: every batch refused, then raised again"
        raise ValueError(kind)

    def _set_max_message_bytes(self, limit: int) -> None:
        # AlterConfigs (Kafka 1.0 has no incremental variant) replaces the topic's overrides: repeat them all.
        admin = AdminClient({"bootstrap.servers": self.proxy.address})
        resource = ConfigResource(
            ConfigResource.Type.TOPIC,
            self.destination_topic,
            set_config={"retention.ms": "-1", "max.message.bytes": str(limit)},
        )
        for future in admin.alter_configs([resource]).values():
            future.result(timeout=30)

    def _wait_committed(self, ends: dict[int, int], timeout: float) -> bool:
        wanted = {(self.topic, p): end for p, end in ends.items()}

        def committed_all() -> bool:
            try:
                committed = self.store.load_offsets(self.name)
            except Exception:  # the database may still be recovering from the last fault
                committed = {}
            return all(committed.get(tp, 0) >= end for tp, end in wanted.items())

        try:
            return wait_until(committed_all, timeout, 0.5, "every offset committed")
        except TimeoutError:
            return False


def _attribute_replays(kills: list[KillCheck], report: VerifyReport, topic: str) -> None:
    """Give each kill the replay its successor caused: per partition, in destination order, the first replay not yet
    given to a kill that starts between the kill's committed offset and the source's end at that moment (the
    successor resumes at the committed offset, or later if the replay began with records never delivered), goes
    back only over records delivered before that end (a replay reaching past it re-sends what a later producer
    replacement had in flight, not what the killed task had read), and begins with the successor's first copy, where
    the destination partition ended when the task died (a replay elsewhere is a replaced producer's: the killed
    task's before, or the successor's own later)."""
    available = {p.source_partition: list(p.replays) for p in report.partitions if p.source_topic == topic}
    for kill in kills:
        for partition, committed in kill.committed.items():
            replays = available.get(int(partition), [])
            end, written = kill.ends[partition], kill.written.get(partition)
            match = next(
                (r for r in replays if committed <= r.start <= end and r.highest < end and written in (None, r.at)),
                None,
            )
            if match is not None:
                replays.remove(match)
                kill.resent += match.resent
