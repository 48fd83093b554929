"""A task's share of its connector's throttle (`replication.throttle.bytes.per.second`, `...records.per.second`):
token buckets the forwarder asks before it reads a batch, so that over the limit the task stops reading — the
backlog waits in the source — rather than dropping or holding records (uReplicator's rate limit).

A batch is counted once read, so a bucket may go into debt by one batch; the forwarder then reads nothing until
the debt is paid off and 20 ms of budget is back, and reads batches no larger than the budget left, so the debt
stays small and the rate holds over any window of a second or more."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

from replicator.configuration.connector import ConnectorConfig
from replicator.partition_reader import Record

THROTTLE_PROPERTIES = frozenset({"replication.throttle.bytes.per.second", "replication.throttle.records.per.second"})
# A bucket holds at most this many seconds of its rate: what an idle task may send at once when records arrive.
BURST_S = 0.2
# Reading resumes once this many seconds of the rate are available: a batch at a time, not a record per turn of
# the loop (whose own cost would then bound the rate, and spend a core doing it).
QUANTUM_S = 0.02


class Bucket:
    __slots__ = ("at", "capacity", "rate", "threshold", "tokens")

    def __init__(self, rate: float, now: float, least: float) -> None:
        self.rate = rate
        self.capacity = max(rate * BURST_S, least)
        self.threshold = max(rate * QUANTUM_S, least)  # tokens needed before reading again
        self.tokens = self.capacity
        self.at = now

    def refill(self, now: float) -> float:
        self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.rate)
        self.at = now
        return self.tokens

    def wait_s(self) -> float:
        """How long until the bucket allows reading again (0 if it does)."""
        return max(0.0, (self.threshold - self.tokens) / self.rate)


class Throttle:
    """The task's buckets: records and bytes a second, either or both."""

    def __init__(self, records_per_s: float, bytes_per_s: float) -> None:
        now = time.monotonic()
        self.records = Bucket(records_per_s, now, 1) if records_per_s > 0 else None
        self.bytes = Bucket(bytes_per_s, now, 1) if bytes_per_s > 0 else None
        self.record_size = 1024.0  # bytes a record, as the batches read so far had them (a first guess before)

    @classmethod
    def of(cls, records_per_s: int, bytes_per_s: int, tasks: int) -> Throttle | None:
        """The share of one of `tasks` tasks of the connector's limits (0: none); None without any."""
        if records_per_s <= 0 and bytes_per_s <= 0:
            return None
        return cls(records_per_s / max(tasks, 1), bytes_per_s / max(tasks, 1))

    def allowance(self, batch: int) -> int:
        """How many records may be read now, at most `batch`; 0 while a bucket is in debt."""
        now = time.monotonic()
        allowed = batch
        if self.records is not None:
            tokens = self.records.refill(now)
            if tokens < self.records.threshold:
                return 0
            allowed = min(allowed, int(tokens))
        if self.bytes is not None:
            tokens = self.bytes.refill(now)
            if tokens < self.bytes.threshold:
                return 0
            allowed = min(allowed, max(1, math.ceil(tokens / self.record_size)))
        return allowed

    def wait_s(self) -> float:
        """How long until every bucket allows reading again."""
        return max(b.wait_s() for b in (self.records, self.bytes) if b is not None)

    def take(self, msgs: Sequence[Record]) -> None:
        """Count a batch read."""
        if self.records is not None:
            self.records.tokens -= len(msgs)
        if self.bytes is not None:
            size = 0
            for msg in msgs:
                value, key = msg.value(), msg.key()
                size += (len(value) if value else 0) + (len(key) if key else 0)
            self.bytes.tokens -= size
            if msgs:
                self.record_size = max(1.0, size / len(msgs))


class ThrottleShare:
    """This task's share of the connector's throttle, as the forwarder asks it before each batch (`current`): made
    again by whoever learns that the configuration (`ReplicationTask.rebuild`) or the number of the connector's tasks
    (`AssignmentFollower.refresh`) changed. It outlives the clients, so neither reaches the other."""

    def __init__(self) -> None:
        self.current: Throttle | None = None

    def share(self, config: ConnectorConfig, tasks: int) -> None:
        """One of `tasks` tasks' share of `config`'s limits, with buckets that start full."""
        self.current = Throttle.of(
            config.replication_throttle_records_per_second, config.replication_throttle_bytes_per_second, tasks
        )


def only_throttle_changed(old: ConnectorConfig, new: ConnectorConfig) -> bool:
    """Whether a new version of a configuration changes its throttle and nothing else: the task then keeps its
    clients. (The same configuration stored again rebuilds them, as before: it may be meant to re-read secrets.)"""

    def rest(raw: dict[str, object]) -> dict[str, object]:
        return {k: v for k, v in raw.items() if k not in THROTTLE_PROPERTIES}

    return rest(old.raw) == rest(new.raw) and old.raw != new.raw
