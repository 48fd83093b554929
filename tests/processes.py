"""Replicator processes as an operator runs them outside Dagster: `mirus task run` and `mirus worker run`, each in
its own process with its output in a file, stopped as a service manager stops them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from mirus_dagster.settings import StackEndpoints

MIRUS = [sys.executable, "-c", "from mirus.cli.main import main; main()"]
STOP_WITHIN_S = 10.0  # a stop that takes longer is a SIGKILL under Kubernetes' and Docker's defaults


class ReplicatorProcess:
    """`mirus ARGS...` in its own process, on the stack's database."""

    def __init__(self, stack: StackEndpoints, args: list[str], log: Path) -> None:
        env = {**os.environ, "MIRUS_DATABASE_URL": stack.database_url}
        self.log = log
        with log.open("w") as out:
            self.process = subprocess.Popen([*MIRUS, *args], env=env, stdout=out, stderr=subprocess.STDOUT)

    @classmethod
    def task(cls, stack: StackEndpoints, connector: str, log: Path, task_id: int = 0) -> ReplicatorProcess:
        """`mirus task run CONNECTOR TASK_ID`: owner if the task is free, standby otherwise."""
        return cls(stack, ["task", "run", connector, str(task_id)], log)

    @classmethod
    def worker(cls, stack: StackEndpoints, index: int, workers: int, log: Path) -> ReplicatorProcess:
        return cls(stack, ["worker", "run", str(index), "--workers", str(workers)], log)

    def output(self) -> str:
        return self.log.read_text()

    def send(self, sig: signal.Signals) -> None:
        self.process.send_signal(sig)

    def stop(self, sig: signal.Signals = signal.SIGINT) -> float:
        """Send `sig` and wait for the process to end; the seconds it took (raises past 30 s, after a SIGKILL)."""
        if self.process.poll() is not None:
            return 0.0
        started = time.monotonic()
        self.process.send_signal(sig)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"{self.process.args[3:]} did not end within 30 s of {sig.name}") from None
        return time.monotonic() - started
