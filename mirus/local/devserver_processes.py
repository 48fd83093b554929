"""`dagster dev`'s processes as the dev server driver (`mirus.local.devserver`) sees them: every descendant it ever
had and the members of its process group, a run worker killed with its children, and the shutdown that leaves none of
them behind."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from contextlib import suppress
from dataclasses import dataclass, field

import psutil


@dataclass(frozen=True)
class KilledWorker:
    """A run worker killed with SIGKILL: its pid, and when the signal was sent (Unix time and monotonic)."""

    pid: int
    at: float
    monotonic: float


@dataclass(frozen=True)
class ShutdownReport:
    """How `dagster dev` went away: its exit code, and the processes that had to be killed."""

    exit_code: int | None
    killed: list[str] = field(default_factory=list)  # "pid cmdline" of every process that needed SIGKILL
    elapsed_s: float = 0.0

    @property
    def clean(self) -> bool:
        return not self.killed


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _still_running(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """`psutil.wait_procs`'s survivors. A process that ends while psutil opens a handle on it can make that call
    raise FileNotFoundError (its `pidfd_open`, seen under load): the wait then goes on with the ones still running."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return psutil.wait_procs(procs, timeout=max(deadline - time.monotonic(), 0))[1]
        except FileNotFoundError:
            procs = [p for p in procs if _alive(p)]


def _describe(proc: psutil.Process) -> str:
    try:
        return f"{proc.pid} {' '.join(proc.cmdline())[:160]}"
    except psutil.Error:
        return str(proc.pid)


class DevProcesses:
    """The process tree and process group of one `dagster dev` (a group of its own: it was created for it)."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process
        self._root = psutil.Process(process.pid)
        self._seen: dict[int, psutil.Process] = {}  # every descendant ever observed, for the shutdown check

    def descendants(self) -> list[psutil.Process]:
        try:
            return self._root.children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def remember_descendants(self) -> None:
        for proc in self.descendants():
            self._seen.setdefault(proc.pid, proc)

    def kill(self, worker: psutil.Process) -> tuple[KilledWorker, list[str]]:
        """SIGKILL `worker` and its children and wait until they are gone: when, and any survivors ("pid cmdline")."""
        self.remember_descendants()
        victims = [worker, *worker.children(recursive=True)]
        at, monotonic = time.time(), time.monotonic()
        for proc in victims:
            with suppress(psutil.NoSuchProcess):
                proc.kill()
        alive = _still_running(victims, timeout=10)
        return KilledWorker(worker.pid, at, monotonic), [_describe(p) for p in alive]

    def members(self) -> list[psutil.Process]:
        """Live members of dagster dev's process group (ours alone: it was created for it), zombies excluded."""
        members = []
        for proc in psutil.process_iter():
            try:
                if os.getpgid(proc.pid) == self.process.pid and _alive(proc):
                    members.append(proc)
            except (psutil.Error, ProcessLookupError):
                continue
        return members

    def shutdown(self, timeout: float) -> tuple[ShutdownReport, list[str]]:
        """SIGINT the process group, wait, then SIGKILL whatever is left: how it went, and what survived even that
        ("pid cmdline").

        Every descendant ever seen counts, and every member of the process group: a process that left the tree
        (its parent died) is still found.
        """
        started = time.monotonic()
        self.remember_descendants()
        procs = {p.pid: p for p in [self._root, *self._seen.values(), *self.members()]}
        with suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGINT)
        with suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout)
        # dagster dev waits for its children; stragglers (run workers ending their runs) get the rest of the time.
        remaining = max(timeout - (time.monotonic() - started), 1.0)
        alive = _still_running(list(procs.values()), timeout=remaining)
        alive += [p for p in self.members() if p.pid not in {a.pid for a in alive}]
        killed = [_describe(p) for p in alive]
        for proc in alive:
            with suppress(psutil.NoSuchProcess):
                proc.kill()
        survivors = _still_running(alive, timeout=10)
        if self.process.poll() is None:
            self.process.wait(10)
        report = ShutdownReport(self.process.returncode, killed, time.monotonic() - started)
        leftovers = survivors + [p for p in self.members() if p not in survivors]
        leftovers += [p for p in procs.values() if _alive(p) and p not in leftovers]
        return report, [_describe(p) for p in leftovers]
