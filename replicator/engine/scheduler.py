"""The task loop's periodic duties, by name (as MirrorMaker 2's `Scheduler` names its jobs): each runs when its
interval has passed since it last ran, checked by the loop between batches — never on a thread of its own, so a
duty never races the records."""

from __future__ import annotations

import time

COMMITTING = "committing offsets"  # every offset.flush.interval.ms
HEARTBEATING = "heartbeating the lease"  # every task.heartbeat.interval.ms without a commit
REFRESHING = "refreshing assignment and configuration"
CHECKING_DESTINATIONS = "checking destination partitions"
READING_SIZE_LIMITS = "reading the topics' record size limits"
RESTING = "moving quiet partitions to cheap fetches"
RECORDING_METRICS = "recording metrics"


class Scheduler:
    def __init__(self) -> None:
        self.next_at: dict[str, float] = {}  # a duty not yet run is due at once

    def due(self, duty: str, interval_s: float, now: float | None = None) -> bool:
        """Whether `duty` runs now; if so, it is next due `interval_s` from now."""
        now = time.monotonic() if now is None else now
        if now < self.next_at.get(duty, 0.0):
            return False
        self.next_at[duty] = now + interval_s
        return True

    def ran(self, duty: str, interval_s: float, now: float | None = None) -> None:
        """`duty` was done another way just now (a commit heartbeats too): next due `interval_s` from now."""
        self.next_at[duty] = (time.monotonic() if now is None else now) + interval_s
