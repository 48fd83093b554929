"""Session-wide platform for the tests, and which broker proves what.

- `stack`: the embedded stack (two Tansu clusters and Postgres), or external clusters and Postgres from the
  environment (MIRUS_SOURCE_BOOTSTRAP_SERVERS, MIRUS_DESTINATION_BOOTSTRAP_SERVERS, MIRUS_DATABASE_URL). Most tests
  run here: records, keys, headers, timestamps, offsets, idempotent and transactional producers, topic creation and
  the whole Dagster layer behave on the embedded broker as on Apache Kafka.
- `apache_kafka`: two Apache Kafka 1.0 clusters from the kit (`../shared/apache-kafka/kafka`, or $MIRUS_KAFKA_HOME),
  started once per session on free ports and stopped by pid, with the session's Postgres. The tests of what the
  embedded broker does not do as Kafka does run here: read_committed isolation (exactly-once), topic configs
  reported by DescribeConfigs (config copying and sync), CreatePartitions (partition growth), replication-factor
  checks (creation failures), max.message.bytes (destination refusals), and broker restarts that keep their data.
  A missing kit is a test error that says where it was looked for, never a skip.
- `secured_kafka` (tests/discovery/conftest.py): two more clusters from the same kit, secured as production ones are
  (SASL_SSL, SCRAM, mutual TLS, ACLs enforced).
- Tests of a gap itself (a destination that cannot add partitions) start an embedded broker of their own, so that
  they prove the same thing whichever clusters `stack` points at.

Three pytest-xdist workers run the suite on 2 cores (`-n 3`, pyproject.toml): most of it waits on brokers, Postgres
and processes, not on a core (two workers took 25½ minutes, three 19, on 11-30). Each worker has the session fixtures
above of its own, in its own temporary folder, on free ports from a range of its own; a module runs whole on one worker
(`ModuleScheduling`).
"""

from __future__ import annotations

import compileall
import os
import re
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from sqlalchemy import Engine
from xdist.scheduler import LoadScopeScheduling

from mirus.faults.brokers import JVM_OPTIONS_ENV, KafkaKit
from mirus.local.stack import FREE_PORTS_ENV, LocalStack, free_port, free_port_range
from mirus_dagster.constants import ENV_REPLICATOR_WORKERS
from mirus_dagster.dagster_resources import PlatformDatabase, SupervisorPolicy
from mirus_dagster.settings import PlatformSettings, StackEndpoints
from replicator.configuration.secrets import ENV_ALLOWED_ENV
from replicator.state.database import make_engine, upgrade
from replicator.state.store import Store
from tests.fixtures.early_build import CONTAINER_TESTS, EarlyImageBuild, runs_container_tests
from tests.fixtures.jvm import SHORT_LIVED_JVM_OPTIONS


def private_stack_settings(state_dir: Path) -> PlatformSettings:
    """Settings for a private stack on free ports; external parts from the environment are kept."""
    settings = PlatformSettings.from_env()
    return settings.model_copy(
        update={
            "state_dir": state_dir,
            "source_port": free_port(),
            "destination_port": free_port(),
            "postgres_port": free_port(),
        }
    )


# The suite's deployment allows these variables in `${env:...}` references (the default is MIRUS_SECRET_.*);
# set in the process environment so that `mirus task run` and `dagster dev` started by tests inherit it.
os.environ[ENV_ALLOWED_ENV] = r"MIRUS_SECRET_.*|MIRUS_TEST_.*|KAFKA_.*|TEST_.*|EMPTY_VAR|OUTER|INNER"
# The Dagster layer's tests prove the rules of runs per task and per standby (a setting away from the default); the
# default shape, worker runs, is what `mirus dev` runs as the README writes it (tests/local/test_first_hour.py, which
# starts it without any MIRUS_ variable) and what tests/engine/test_workers.py and the container tests run.
os.environ[ENV_REPLICATOR_WORKERS] = "0"
# Each worker chooses its servers' ports from a range of its own (mirus.local.stack.free_port): two workers choosing
# at once never choose the same port.
if worker := os.environ.get("PYTEST_XDIST_WORKER"):
    _low, _high = free_port_range()
    _share = (_high - _low) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    _first = _low + int(worker.removeprefix("gw")) * _share
    os.environ[FREE_PORTS_ENV] = f"{_first}-{_first + _share}"
# The kit's brokers here serve thousands of records for minutes, on 2 cores shared with everything else: C1 alone and
# the serial collector took tests/engine/test_batch_path.py from 58 and 54 CPU-s to 41 and 40 (11-30), in the same
# wall time. The fault runs the suite starts inherit it.
os.environ[JVM_OPTIONS_ENV] = SHORT_LIVED_JVM_OPTIONS
# A shell that starts the suite in the background starts it with SIGINT ignored, and every in-process Dagster run on
# the main thread copies SIGINT's handler to SIGTERM when it ends (`dagster._utils.interrupts.capture_interrupts`):
# every process the suite started after that ignored SIGTERM, Dagster's own compute-log tailers among them, whose
# clean-up then waited 30 s each and in-process runs never finished (seen on a background run of .ci/run).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
if signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


class ModuleScheduling(LoadScopeScheduling):
    """Whole modules to the workers, so that a module fixture (a `dagster dev`, the compose deployment and its
    images) starts once; tests/reports/ as one unit, so that one Spark session (tests/reports/conftest.py) serves
    it. A worker takes the next unit when it is about to run out; the container module last, once nothing else is
    left (its images are built from the session's start). Its services and run containers keep both cores busy:
    beside other modules it took 470-680 s and the suite 26:31-29:24, alone at the end 300-360 s and the suite
    25:41-27:11 (11-30)."""

    def _split_scope(self, nodeid: str) -> str:
        module = nodeid.split("::", 1)[0]
        return "tests/reports/" if module.startswith("tests/reports/") else module

    def _assign_work_unit(self, node: Any) -> None:
        if CONTAINER_TESTS in self.workqueue and len(self.workqueue) > 1:
            self.workqueue.move_to_end(CONTAINER_TESTS)
        super()._assign_work_unit(node)


_early_build: EarlyImageBuild | None = None


def pytest_sessionstart(session: pytest.Session) -> None:
    """The images' build started early (tests/fixtures/early_build.py), by the process that starts the workers."""
    global _early_build
    config = session.config
    if hasattr(config, "workerinput") or config.option.collectonly:
        return
    _compile_project()
    if runs_container_tests(config):
        _early_build = EarlyImageBuild()


def _compile_project() -> None:
    """The suite starts hundreds of processes that import this project (tasks, workers, Dagster's code servers and
    runs). An editable install ships no bytecode of its own, and where PYTHONDONTWRITEBYTECODE is set (this machine's
    images set it) every one of them compiled the modules it imports again: a task's start 1.26 → 1.16 s of CPU
    (11-30, 15 alternating starts). Compiled once here, they are read by all."""
    root = Path(__file__).resolve().parents[1]
    for package in ("replicator", "mirus", "mirus_dagster", "reports", "assets", "sensors"):
        compileall.compile_dir(root / package, quiet=1)


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _early_build is not None:
        _early_build.finish()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _early_build is not None:
        terminalreporter.write_line(f"the platform's images, early: {_early_build.outcome}")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> ModuleScheduling:
    return ModuleScheduling(config, log)


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StackEndpoints]:
    """Both clusters and Postgres, started once per worker, stopped at its end."""
    local = LocalStack(private_stack_settings(tmp_path_factory.mktemp("stack")))
    endpoints = local.up()
    try:
        yield endpoints
    finally:
        local.down()


@pytest.fixture(scope="session")
def kafka_kit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaKit]:
    """The kit behind `apache_kafka`: its ZooKeeper and its two brokers, source then destination."""
    kit = KafkaKit(tmp_path_factory.mktemp("apache-kafka"), free_port())
    try:
        kit.start_zookeeper()
        for name in ("source", "destination"):
            kit.broker(name, free_port(), None, free_port()).start()
        yield kit
    finally:
        kit.stop()


@pytest.fixture(scope="session")
def apache_kafka(stack: StackEndpoints, kafka_kit: KafkaKit) -> StackEndpoints:
    """Two Apache Kafka 1.0 clusters (source and destination) and the session's Postgres."""
    source, destination = kafka_kit.brokers
    return StackEndpoints(source.bootstrap, destination.bootstrap, stack.database_url)


@pytest.fixture(scope="session")
def db_engine(stack: StackEndpoints) -> Iterator[Engine]:
    engine = make_engine(stack.database_url)
    upgrade(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def store(db_engine: Engine) -> Store:
    return Store(db_engine)


@pytest.fixture
def unique(request: pytest.FixtureRequest) -> Iterator[str]:
    """A name no other test uses: for topics, connectors and groups.

    The test's connectors in the shared store are deleted after it: a monitor or supervisor tick in a later test
    reads every stored connector, and one left pointing at a cluster that is gone costs that tick a timeout."""
    slug = re.sub(r"[^a-zA-Z0-9]+", "-", request.node.name).strip("-").lower()[:40]
    name = f"{slug}-{uuid.uuid4().hex[:8]}"
    yield name
    if "db_engine" in request.fixturenames:
        store = Store(request.getfixturevalue("db_engine"))
        for record in store.list_connectors():
            if record.name.startswith(name):
                store.delete_connector(record.name)


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    """A Dagster instance of its own (a temporary directory: `instance.root_directory`) for in-process runs."""
    with dg.instance_for_test() as instance:
        # Each run start re-applies logging.config.dictConfig (for YAML-defined handlers, none here). Two runs in
        # threads of one process then deadlock on logging's locks; real runs are separate processes. Skip it.
        # Deliberate monkeypatch of this instance's method: mypy refuses assigning to a method.
        instance.get_yaml_python_handlers = list  # type: ignore[method-assign]
        yield instance


@pytest.fixture
def resources(stack: StackEndpoints, db_engine: Engine) -> dict[str, object]:
    return {"platform": PlatformDatabase(database_url=stack.database_url), "supervisor": SupervisorPolicy()}
