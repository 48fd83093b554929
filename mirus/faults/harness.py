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
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from confluent_kafka import Message, Producer
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from mirus.faults.brokers import BrokerProcess, KafkaKit, tansu_broker
from mirus.faults.proxy import TcpProxy
from mirus.local.stack import LocalStack, free_port
from mirus.waiting import wait_until
from mirus_dagster.settings import PlatformSettings
from replicator.assignment import SourcePartition
from replicator.configuration.connector import validate_submission
from replicator.state.database import make_engine, upgrade
from replicator.state.store import Store
from replicator.tools.verify import verify_replication
from replicator.tools.verify_report import VerifyReport

FaultKind = Literal["kill", "postgres", "network", "broker", "refuse"]
EMBEDDED_FAULTS: tuple[FaultKind, ...] = ("kill", "postgres", "network")
ALL_FAULTS: tuple[FaultKind, ...] = (*EMBEDDED_FAULTS, "broker", "refuse")
KAFKA_ONLY: frozenset[str] = frozenset({"broker", "refuse"})
MAX_MESSAGE_BYTES = 1_000_012  # Apache Kafka's default
REFUSED_MESSAGE_BYTES = 512  # smaller than any batch of the load: every produce request is refused
THIRTY_DAYS_MS = 30 * 24 * 3600 * 1000
TASK_RESTART_DELAY_S = 1.0  # as the task_supervisor sensor: a dead task gets a new process at once (≈1 s)


@dataclass(frozen=True)
class FaultPlan:
    duration_s: float = 60.0  # how long load and faults run
    rate: int = 500  # records per second into the source topic
    partitions: int = 4
    tasks: int = 2
    faults: tuple[FaultKind, ...] = EMBEDDED_FAULTS
    gap_s: tuple[float, float] = (2.0, 6.0)  # quiet time between two faults
    outage_s: tuple[float, float] = (3.0, 7.0)  # how long Postgres, the network or a refusal lasts
    apache_kafka: bool = False
    seed: int = 0
    work_dir: Path | None = None
    drain_timeout_s: float = 180.0
    # The engine never gives a record up for time; a value here makes it (a cut longer than this times out).
    producer_message_timeout_ms: int | None = None
    exactly_once: bool = False
    resume_after_copies: bool = False  # resume.after.destination.copies: a kill re-sends nothing

    def __post_init__(self) -> None:
        unknown = set(self.faults) - set(ALL_FAULTS)
        if unknown:
            raise ValueError(f"unknown fault kinds: {', '.join(sorted(unknown))} (known: {', '.join(ALL_FAULTS)})")
        needs_kafka = KAFKA_ONLY & set(self.faults)
        if needs_kafka and not self.apache_kafka:
            raise ValueError(f"faults {', '.join(sorted(needs_kafka))} need Apache Kafka (--apache-kafka)")
        if self.exactly_once and not self.apache_kafka:
            # Measured on Tansu 0.6: records of aborted transactions are returned to read_committed readers.
            raise ValueError(
                "--exactly-once needs Apache Kafka (--apache-kafka): the embedded broker shows aborted "
                "transactions' records to read_committed readers"
            )


@dataclass
class FaultEvent:
    kind: str
    at_s: float  # since the load started
    lasted_s: float
    detail: str = ""


@dataclass
class KillCheck:
    """One SIGKILL: what the task had not committed, and what its successor re-sent."""

    task: int
    at_s: float
    uncommitted: int  # records the source held beyond the task's committed offsets: the most it may re-send
    resent: int = 0  # measured at the destination: the replays that started at those committed offsets
    committed: dict[str, int] = field(default_factory=dict)
    ends: dict[str, int] = field(default_factory=dict)

    @property
    def within_bound(self) -> bool:
        return self.resent <= self.uncommitted


@dataclass
class FaultReport:
    plan: FaultPlan
    produced: int
    load_seconds: float
    events: list[FaultEvent]
    kills: list[KillCheck]
    task_restarts: int
    drained: bool
    drain_seconds: float
    verify: VerifyReport

    @property
    def duplicates(self) -> int:
        return self.verify.totals["duplicated"]

    @property
    def ok(self) -> bool:
        return (
            self.drained
            and self.verify.ok
            and self.verify.totals["source_records"] == self.produced
            and self.verify.totals["elsewhere"] == 0  # partition matching: each partition keeps its number
            and all(k.within_bound for k in self.kills)
            and (not self.plan.exactly_once or self.duplicates == 0)
        )

    def to_json(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "plan": {**asdict(self.plan), "work_dir": str(self.plan.work_dir) if self.plan.work_dir else None},
            "produced": self.produced,
            "load_seconds": round(self.load_seconds, 1),
            "events": [asdict(e) for e in self.events],
            "kills": [{**asdict(k), "within_bound": k.within_bound} for k in self.kills],
            "task_restarts": self.task_restarts,
            "drained": self.drained,
            "drain_seconds": round(self.drain_seconds, 1),
            "verify": self.verify.to_json(),
        }

    def to_text(self) -> str:
        t = self.verify.totals
        counts: dict[str, int] = {}
        for event in self.events:
            counts[event.kind] = counts.get(event.kind, 0) + 1
        rate = self.produced / self.load_seconds if self.load_seconds else 0.0
        lines = [
            f"load: {self.produced:,} records in {self.load_seconds:.0f} s ({rate:,.0f}/s) over "
            f"{self.plan.partitions} partitions, {self.plan.tasks} task processes",
            "faults: " + (", ".join(f"{k} x{n}" for k, n in sorted(counts.items())) or "none"),
            f"task process restarts: {self.task_restarts}",
            f"drained: {'yes' if self.drained else 'NO'} ({self.drain_seconds:.1f} s after the load stopped)",
            f"independent read: {t['source_records']:,} source records, {t['replicated']:,} replicated, "
            f"{t['missing']} missing, {t['out_of_order']} out of order, {t['mismatched']} changed, "
            f"{t['duplicated']:,} duplicated ({100 * t['duplicated'] / max(t['source_records'], 1):.2f} %), "
            f"{t['elsewhere']} in another partition",
            f"mode: {'exactly-once (read_committed reader)' if self.plan.exactly_once else 'at-least-once'}"
            + (", resume.after.destination.copies" if self.plan.resume_after_copies else ""),
        ]
        if self.kills:
            resent = sum(k.resent for k in self.kills)
            bound = sum(k.uncommitted for k in self.kills)
            worst = max(self.kills, key=lambda k: k.resent)
            per_task_rate = rate / self.plan.tasks if rate else 0.0
            seconds = f" ≈ {worst.resent / per_task_rate:.2f} s of that task's traffic" if per_task_rate else ""
            lines.append(
                f"kills: {len(self.kills)}; re-sent after kills {resent:,} (bound {bound:,}); "
                f"median per kill {statistics.median(k.resent for k in self.kills):,.0f}; "
                f"most after one kill {worst.resent:,}{seconds}; "
                f"all within bound: {'yes' if all(k.within_bound for k in self.kills) else 'NO'}"
            )
        for p in self.verify.partitions:
            if not p.ok:
                lines.append(
                    f"  {p.source_topic}[{p.source_partition}]: missing {p.missing_offsets}, arrived after higher "
                    f"offsets {p.out_of_order_offsets}, changed {[m.offset for m in p.mismatched_offsets]}"
                )
        lines += [f"  {e.at_s:7.1f} s  {e.kind:<8} {e.lasted_s:5.1f} s  {e.detail}" for e in self.events]
        lines.append(f"result: {'OK' if self.ok else 'FAILED'}")
        return "\n".join(lines)


# -- the load ------------------------------------------------------------------------------------------------


class Load:
    """Writes `rate` records/s round-robin into the source topic and knows each partition's acknowledged end.

    Records carry what replication must keep: keys (some null), values (some null), duplicate headers and
    CreateTime timestamps thirty days old.
    """

    def __init__(self, bootstrap: str, topic: str, partitions: int, rate: int) -> None:
        self.topic = topic
        self.partitions = partitions
        self.rate = rate
        self.ends = dict.fromkeys(range(partitions), 0)  # next offset per partition, from acknowledgements
        self.errors: list[str] = []
        self._producer = Producer(
            {"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5}
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fault-load", daemon=True)
        self.started = self.stopped = 0.0
        self.sent = 0

    def start(self) -> None:
        self.started = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        if self._producer.flush(60) or self.errors:
            raise RuntimeError(f"the load could not write every record to the source: {self.errors[:3]}")
        self.stopped = time.monotonic()

    @property
    def produced(self) -> int:
        return sum(self.ends.values())

    def _delivered(self, err: object, msg: Message) -> None:
        if err is not None:
            self.errors.append(str(err))
        else:
            p, offset = msg.partition(), msg.offset()
            assert p is not None and offset is not None  # set on every delivered record
            self.ends[p] = max(self.ends[p], offset + 1)

    def _run(self) -> None:
        tick = 0.01
        per_tick = self.rate * tick
        due = 0.0
        next_tick = time.monotonic()
        while not self._stop.is_set():
            due += per_tick
            while due >= 1:
                due -= 1
                i = self.sent
                self._produce(
                    i % self.partitions,
                    None if i % 7 == 0 else b"key-%d" % i,
                    None if i % 11 == 0 else b"value-%d-" % i + b"x" * 80,
                    [("trace", b"%d" % i), ("trace", b"again"), ("empty", None)],
                    int(time.time() * 1000) - THIRTY_DAYS_MS,
                )
                self.sent += 1
            self._producer.poll(0)
            next_tick += tick
            self._stop.wait(max(0.0, next_tick - time.monotonic()))

    def _produce(
        self,
        partition: int,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, str | bytes | None]],
        timestamp: int,
    ) -> None:
        while True:
            try:
                self._producer.produce(
                    self.topic, value, key, partition, on_delivery=self._delivered, timestamp=timestamp, headers=headers
                )
                return
            except BufferError:
                self._producer.poll(0.05)


# -- the task processes --------------------------------------------------------------------------------------


class TaskProcesses:
    """One `mirus task run` process per task, restarted after it dies (kill -9, a database outage at start)."""

    def __init__(self, connector: str, tasks: int, env: dict[str, str], log_dir: Path) -> None:
        self.connector = connector
        self.env = env
        self.log_dir = log_dir
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.restarts = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        for task_id in range(tasks):
            self._spawn(task_id)
        self._watcher = threading.Thread(target=self._watch, name="fault-task-watcher", daemon=True)
        self._watcher.start()

    def _spawn(self, task_id: int) -> None:
        log = open(self.log_dir / f"task-{task_id}.log", "ab")  # noqa: SIM115 - the child keeps it open
        argv = [sys.executable, "-m", "mirus.cli.main", "task", "run", self.connector, str(task_id)]
        self.procs[task_id] = subprocess.Popen(
            argv,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            # Ctrl-C must stop the task even when this harness was started with SIGINT ignored (in the background).
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        log.close()

    def _watch(self) -> None:
        while not self._stopping.wait(0.2):
            with self._lock:
                dead = [t for t, p in self.procs.items() if p.poll() is not None]
            for task_id in dead:
                if self._stopping.wait(TASK_RESTART_DELAY_S):
                    return
                with self._lock:
                    if self.procs[task_id].poll() is not None:
                        self._spawn(task_id)
                        self.restarts += 1

    def kill(self, task_id: int) -> None:
        with self._lock:
            proc = self.procs[task_id]
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait()

    def stop(self) -> None:
        """Stop every task as an operator would (Ctrl-C): each flushes, commits and releases its partitions."""
        self._stopping.set()
        self._watcher.join(10)
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc in self.procs.values():
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# -- the run -------------------------------------------------------------------------------------------------


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
                **({"resume.after.destination.copies": "true"} if self.plan.resume_after_copies else {}),
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
            if time.monotonic() + gap >= deadline:
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
            # Read after the process is gone: nothing can be committed any more until its successor runs.
            committed = self.store.load_offsets(self.name, assignment[task_id])
            ends = {p: load.ends[p] for _t, p in assignment[task_id]}
            kills.append(
                KillCheck(
                    task=task_id,
                    at_s=round(at, 1),
                    uncommitted=sum(ends[p] - committed.get((self.topic, p), 0) for p in ends),
                    committed={str(p): committed.get((self.topic, p), 0) for p in ends},
                    ends={str(p): e for p, e in ends.items()},
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
    successor resumes at the committed offset, or later if the replay began with records never delivered) and goes
    back only over records delivered before that end (a replay reaching past it re-sends what a later producer
    replacement had in flight, not what the killed task had read)."""
    available = {p.source_partition: list(p.replays) for p in report.partitions if p.source_topic == topic}
    for kill in kills:
        for partition, committed in kill.committed.items():
            replays = available.get(int(partition), [])
            end = kill.ends[partition]
            match = next((r for r in replays if committed <= r.start <= end and r.highest < end), None)
            if match is not None:
                replays.remove(match)
                kill.resent += match.resent
