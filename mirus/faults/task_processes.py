"""The task processes of a fault run (`mirus.faults.harness`): one `mirus task run` per task, restarted when it dies,
as the `task_supervisor` sensor does in a deployment."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

TASK_RESTART_DELAY_S = 1.0  # as the task_supervisor sensor: a dead task gets a new process at once (≈1 s)


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
