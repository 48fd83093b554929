"""What every benchmark shares, whichever clusters it runs on: this checkout's code, free ports, a private Postgres or
embedded stack, processes and what they cost, topics and offsets. `apache_kafka.py` adds what runs on Apache Kafka:
the kit's clusters or private ones, and the copiers compared there (MirrorMaker 1.0, a naive loop, the engine).

Every script imports this module before the project's own: it puts this checkout first on the path, so that
`python benchmarks/X.py` measures the code beside it, not the copy an installed package points at.
"""

from __future__ import annotations

import functools
import os
import resource
import signal
import subprocess
import sys
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path

import psutil
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from sqlalchemy import Engine, text

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mirus.local.stack import LocalStack, free_port  # noqa: E402
from mirus.waiting import wait_until  # noqa: E402
from mirus_dagster.settings import PlatformSettings  # noqa: E402
from replicator.clusters import log_offsets  # noqa: E402
from replicator.state.database import make_engine, upgrade  # noqa: E402
from replicator.state.store import Store  # noqa: E402

# `mirus` of the checkout a process starts in (`python -c` puts its working directory first on the path).
MIRUS = [sys.executable, "-c", "from mirus.cli.main import main; main()"]
MIB = 2**20
PORTS = ("source_port", "destination_port", "postgres_port")


def load_average() -> float:
    """The 1-minute load average: printed beside figures taken on a machine others share."""
    return os.getloadavg()[0]


# -- processes and what they cost --------------------------------------------------------------------------------


def task_argv(connector: str, task: int = 0) -> list[str]:
    return [*MIRUS, "task", "run", connector, str(task)]


def start_process(
    argv: list[str], env: Mapping[str, str], niceness: int = 0, log: Path | None = None, cwd: Path | str | None = None
) -> subprocess.Popen[bytes]:
    """A process in a session of its own (stopped by its pid, never by a terminal's Ctrl-C), at `niceness`, its output
    appended to `log` (or dropped)."""

    def prepare() -> None:
        # A shell may have started us with SIGINT ignored, which the child would inherit: give it back its default.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.setpriority(os.PRIO_PROCESS, 0, niceness)

    with open(log, "ab") if log else open(os.devnull, "wb") as out:
        return subprocess.Popen(
            argv,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=prepare,
        )


def dagster_run(job: str, config: str, env: Mapping[str, str], log: Path) -> subprocess.Popen[bytes]:
    """The process a run launcher starts for a run of `job`, as `dagster job execute` of the code location."""
    path = log.with_suffix(".yaml")
    path.write_text(config)
    # A Dagster home of its own (an empty one: the default storage in it), not a temporary one in the working directory.
    home = log.with_suffix(".home")
    home.mkdir()
    env = {**env, "DAGSTER_HOME": str(home)}
    argv = [sys.executable, "-m", "dagster", "job", "execute", "-m", "mirus_dagster.definitions", "-j", job]
    return start_process([*argv, "-c", str(path)], env, log=log, cwd=ROOT)


def own_cpu_s() -> float:
    """This process's CPU seconds so far, its librdkafka threads included."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def tree(root: psutil.Process) -> list[psutil.Process]:
    """`root` and its descendants (none once it is gone)."""
    try:
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def cpu_s(procs: Iterable[psutil.Process]) -> float:
    """CPU seconds these processes used so far, each alone (pass `tree(p)` for a process and its children)."""
    total = 0.0
    for proc in procs:
        with suppress(psutil.Error):  # gone, or another user's
            total += sum(proc.cpu_times()[:2])
    return total


def rss_mib(procs: Iterable[psutil.Process]) -> float:
    """The resident memory of these processes, each alone, in MiB (cheap enough to sample often)."""
    total = 0.0
    for proc in procs:
        with suppress(psutil.Error):  # gone, or another user's
            total += proc.memory_info().rss
    return total / MIB


def memory_mib(procs: Iterable[psutil.Process]) -> tuple[float, float]:
    """RSS and PSS (which counts shared pages once) of these processes, each alone, in MiB."""
    rss = pss = 0.0
    for proc in procs:
        with suppress(psutil.Error):  # gone, or another user's
            info = proc.memory_full_info()
            rss, pss = rss + info.rss, pss + info.pss
    return rss / MIB, pss / MIB


def postgres_processes() -> list[psutil.Process]:
    """Every Postgres process on this machine (a benchmark that counts them runs the only server)."""
    return [p for p in psutil.process_iter(["name"]) if p.info["name"] == "postgres"]


# -- Postgres and the embedded stack -----------------------------------------------------------------------------


@contextmanager
def platform_database(migrate: bool = True, name: str = "bench") -> Iterator[Store]:
    """`MIRUS_DATABASE_URL`, or a private embedded Postgres on a free port; at this checkout's schema unless `migrate`
    is False."""
    settings = PlatformSettings.from_env()
    if settings.database_url:
        engine = make_engine(settings.database_url)
        upgrade(engine)
        yield Store(engine)
        return
    state = Path(os.environ.get("TMPDIR", "/tmp")) / f"mirus-{name}-{os.getpid()}"
    # Clusters the stack treats as external, so that it starts Postgres alone; nothing here contacts them.
    stack = LocalStack(
        settings.model_copy(
            update={
                "state_dir": state,
                "source_bootstrap_servers": "unused:9092",
                "destination_bootstrap_servers": "unused:9092",
                "postgres_port": free_port(),
            }
        )
    )
    endpoints = stack.up()
    try:
        engine = make_engine(endpoints.database_url)
        if migrate:
            upgrade(engine)
        yield Store(engine)
        engine.dispose()
    finally:
        stack.down()


@contextmanager
def fresh_database(server: Engine, name: str, code: str | None = None) -> Iterator[str]:
    """A new database `name` on `server`'s Postgres, migrated by the code of checkout `code` (this one by default),
    dropped afterwards. Yields its URL."""
    admin = server.execution_options(isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = server.url.set(database=name).render_as_string(hide_password=False)
    env = {**os.environ, **({"PYTHONPATH": code} if code else {})}
    migrate = "import sys; from replicator.state.database import migrated_engine; migrated_engine(sys.argv[1])"
    subprocess.run([sys.executable, "-c", migrate, url], env=env, check=True, cwd=code or ROOT)
    try:
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def embedded_stack(state: Path, ports: Mapping[str, int] | None = None) -> LocalStack:
    """The embedded stack (two clusters and Postgres) on `ports`, free ones by default; a part or a port the
    environment names (MIRUS_*) is used as it says."""
    chosen = dict(ports) if ports is not None else {name: free_port() for name in PORTS}
    chosen = {name: port for name, port in chosen.items() if f"MIRUS_{name.upper()}" not in os.environ}
    return LocalStack(PlatformSettings.from_env().model_copy(update={"state_dir": state, **chosen}))


def committed(store: Store, connector: str) -> int:
    """The sum of the connector's committed offsets."""
    return sum(store.load_offsets(connector).values())


def database_writes(engine: Engine) -> tuple[int, int]:
    """Transactions committed and rows written in the current database so far (the statistics collector's)."""
    with engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT xact_commit, tup_inserted + tup_updated + tup_deleted FROM pg_stat_database "
                "WHERE datname = current_database()"
            )
        ).one()
    return int(row[0]), int(row[1])


# -- topics ------------------------------------------------------------------------------------------------------


@functools.cache
def admin(bootstrap: str) -> AdminClient:
    """The benchmark's own admin client for a cluster, made once (a client's threads outlive many requests)."""
    # Long requests: Apache Kafka 1.0 takes minutes over thousands of partitions.
    return AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 300_000})


def create_topics(
    bootstrap: str,
    topics: Mapping[str, int],
    config: Mapping[str, str] | None = None,
    batch: int = 20,
    timeout_s: float = 120.0,
    poll_s: float = 0.05,
) -> None:
    """Create `topics` (name: partitions) where they do not exist yet, `batch` to a request (Apache Kafka 1.0 creates
    thousands of partitions slowly), and wait until the cluster's metadata names every partition of each."""
    client, names = admin(bootstrap), list(topics)
    for start in range(0, len(names), batch):
        new = [NewTopic(name, topics[name], 1, config=dict(config or {})) for name in names[start : start + batch]]
        for future in client.create_topics(new, request_timeout=timeout_s).values():
            try:
                future.result(timeout_s)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise

    def whole() -> bool:
        known = client.list_topics(names[0] if len(names) == 1 else None, timeout=60).topics
        return all(name in known and len(known[name].partitions) == topics[name] for name in names)

    wait_until(whole, timeout_s, poll_s, f"{len(names)} topic(s) to be visible")


def create_topic(bootstrap: str, topic: str, partitions: int = 1) -> None:
    create_topics(bootstrap, {topic: partitions})


def delete_topics(bootstrap: str, topics: list[str]) -> None:
    for future in admin(bootstrap).delete_topics(topics).values():
        future.result(120)  # Kafka 1.0 takes long to delete thousands of partitions


def records_in(consumer: Consumer, topic: str, partitions: int) -> int:
    """The records a topic holds, by its high watermarks (exact on Apache Kafka, not on the embedded broker)."""
    return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5)[1] for p in range(partitions))


def end_offsets(bootstrap: str, topics: Iterable[str], partitions: int) -> dict[str, int]:
    """Per topic, the sum of its partitions' end offsets, asked in one ListOffsets request per broker (a consumer asks
    partition by partition, which behind a busy broker takes longer than a benchmark's window)."""
    names = list(topics)
    wanted = [(name, p) for name in names for p in range(partitions)]
    ends = log_offsets(admin(bootstrap), wanted, latest=True)
    if len(ends) < len(wanted):
        raise RuntimeError(f"{bootstrap} gave {len(ends):,} of {len(wanted):,} end offsets")
    return {name: sum(ends[(name, p)] for p in range(partitions)) for name in names}
