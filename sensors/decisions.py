"""What the sensors decide, as plain functions over plain views of runs and leases (no Dagster here)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

# A failed run that lived this long had been replicating (or standing by, ready to): its crash is not part of a
# crash loop, and its replacement starts at once however many crashes came before.
HEALTHY_RUN_S = 60.0
# A failed run that lived this long and whose task heartbeated until about when it ended was replicating when it
# died (killed, its node lost): it is replaced at once, so repeated kills never leave a task waiting for a backoff.
# A crash loop of runs that get that far restarts at most once per this many seconds.
REPLICATING_RUN_S = 10.0


@dataclass(frozen=True)
class TaskRunHistory:
    """A task's runs as the sensors see them, newest first."""

    live_runs: int  # queued, starting or started: the task's owner and its warm standbys
    live_started_at: datetime | None  # when the newest live run started (None while queued)
    latest_status: str | None  # SUCCESS, FAILURE, CANCELED, ... of the newest finished run; None if never run
    latest_ended_at: datetime | None
    consecutive_failures: int  # FAILURE runs in a row, newest first, that crashed soon after they started
    latest_lived_s: float | None = None  # how long the newest finished run lived

    @property
    def live(self) -> bool:
        return self.live_runs > 0


@dataclass(frozen=True)
class Decision:
    launch: bool
    reason: str
    replace_live_run: bool = False  # the live run is silent: report it failed, a new one fences it
    runs: int = 1  # how many runs to launch


def start_decision(history: TaskRunHistory, wanted: int = 1) -> Decision:
    """The monitor's rule: an assigned task has `wanted` runs (its owner and warm standbys); missing ones are
    started unless the last run failed (the supervisor restarts those, with backoff)."""
    missing = wanted - history.live_runs
    if missing <= 0:
        return Decision(False, "running")
    if history.latest_status is None:
        return Decision(True, "assigned, never ran" if not history.live else "standby missing", runs=missing)
    if history.latest_status in ("SUCCESS", "CANCELED"):
        # Ended because it was removed, paused, fenced or terminated while still assigned: it should run.
        return Decision(True, f"assigned, last run {history.latest_status.lower()}", runs=missing)
    return Decision(False, f"last run {history.latest_status.lower()}: left to the supervisor")


def restart_decision(
    history: TaskRunHistory,
    heartbeat_at: datetime | None,
    now: datetime,
    *,
    wanted: int = 1,
    lease_timeout_s: float,
    initial_backoff_s: float,
    max_backoff_s: float,
) -> Decision:
    """The supervisor's rule: failed runs come back after a doubling, capped wait (up to `wanted` runs: the owner
    and its standbys) — at once while a live run replicates (its lease heartbeated after the failure); silent ones
    are replaced."""
    if history.live_runs >= wanted:
        started = history.live_started_at
        silent_since = max(d for d in (heartbeat_at, started) if d is not None) if started else None
        if silent_since is not None and (now - silent_since).total_seconds() > lease_timeout_s:
            return Decision(True, f"no heartbeat for {(now - silent_since).total_seconds():.0f}s", True, wanted)
        return Decision(False, "running")
    if history.latest_status != "FAILURE" or history.latest_ended_at is None:
        return Decision(False, "not failed")
    if history.live and heartbeat_at is not None and heartbeat_at > history.latest_ended_at:
        # A standby took the task over after the crash and replicates: no crash loop, whatever came before.
        return Decision(True, "standby missing (the task replicates)", runs=wanted - history.live_runs)
    if (
        heartbeat_at is not None
        and (history.latest_lived_s or 0.0) >= REPLICATING_RUN_S
        and (history.latest_ended_at - heartbeat_at).total_seconds() <= lease_timeout_s
    ):
        return Decision(True, "the failed run was replicating until it ended", runs=wanted - history.live_runs)
    wait = restart_backoff_s(history.consecutive_failures, initial_backoff_s, max_backoff_s)
    waited = (now - history.latest_ended_at).total_seconds()
    if waited < wait:
        return Decision(False, f"restart in {wait - waited:.0f}s")
    return Decision(True, f"failed {history.consecutive_failures} time(s) in a row", runs=wanted - history.live_runs)


def requested_restart(history: TaskRunHistory, restart_requested_at: datetime | None) -> bool:
    """An operator asked for a restart (REST API, CLI or `restart_connector` job) after the task's last run failed:
    it gets a new run at once, whatever the backoff says, even with automatic restarts turned off."""
    return (
        not history.live
        and history.latest_status == "FAILURE"
        and history.latest_ended_at is not None
        and restart_requested_at is not None
        and restart_requested_at > history.latest_ended_at
    )


def failure_streak(finished: Iterable[tuple[str, float | None]]) -> int:
    """Failed runs in a row among `finished` (status, seconds the run lived; newest first) that make a crash loop:
    the streak ends at a run that did not fail, and after a failed run that lived `HEALTHY_RUN_S` (counted: a
    crash after healthy replication is a first failure)."""
    streak = 0
    for status, lived_s in finished:
        if status != "FAILURE":
            break
        streak += 1
        if lived_s is not None and lived_s >= HEALTHY_RUN_S:
            break
    return streak


def restart_backoff_s(consecutive_failures: int, initial_s: float, max_s: float) -> float:
    """No wait after a first failure (a crash is usually a one-off), then initial, doubling, capped."""
    if consecutive_failures <= 1:
        return 0.0
    return min(initial_s * 2 ** (consecutive_failures - 2), max_s)
