"""The partition book: what a task knows about each source partition it owns — where it reads, the runs of records
in flight and their acknowledgements, where a commit may go, pauses and their backoff — and which assigned
partitions it still waits to claim from another task."""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Callable, Iterable

from replicator.assignment import SourcePartition
from replicator.clusters import SizeLimit
from replicator.topics import provenance

UNASSIGNED_PARTITION = -1  # librdkafka: let the producer's partitioner choose
RETRY_BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 60.0)
# `paused_reason` of a partition whose record failed because the producer failed, not because the destination
# refused it: the rest of the batch skips the partition, and the new producer reads it again at once, no backoff.
AWAITING_NEW_PRODUCER = "awaiting the replacement of a failed producer"
NO_SIZE_CHECK = sys.maxsize  # `PartitionState.size_check` of a partition whose records are not measured


class InFlight:
    """Records of one source partition produced one after another and not yet acknowledged.

    Where the destination partition is fixed and acknowledgements stand for every earlier record of it (an
    idempotent producer with gapless ordering, or a transaction that commits only whole), only the last record of
    the run carries a delivery callback: one acknowledgement for the run. Elsewhere every record is its own run.
    """

    __slots__ = ("count", "done", "first", "size", "tail_sent", "timestamps")

    def __init__(self, first: int) -> None:
        self.first = first  # source offset of the run's first record: nothing from here on is acknowledged yet
        self.count = 0
        self.size = 0  # key + value bytes
        self.timestamps: list[int] = []  # CreateTime / LogAppendTime of each record that has one (ms)
        self.tail_sent = False  # whether a record carrying the run's callback was produced
        self.done = False


class PartitionState:
    """What the task knows about one owned source partition."""

    __slots__ = (
        "committed", "destination_durable", "destination_next", "destination_partition",
        "destination_topic", "durable", "failed_at", "failures", "in_flight", "open_run",
        "ordered", "partition", "paused_reason", "pending", "position", "produce", "recheck_limit",
        "refused_against", "retry_at", "routed", "size_check", "size_limit", "source_prefix", "topic", "tp",
    )  # fmt: skip

    def __init__(self, tp: SourcePartition, start: int | None, destination_topic: str, source_cluster: str) -> None:
        self.tp = tp
        self.topic, self.partition = tp
        self.destination_topic = destination_topic
        self.destination_partition = UNASSIGNED_PARTITION
        self.routed = False  # whether destination metadata has decided `destination_partition` yet
        # `produce` of the producer writing `destination_topic` (`replicator.engine.producers`), once routed.
        self.produce: Callable[..., None] = _not_routed
        self.ordered = False  # whether one acknowledgement stands for a whole run (see InFlight)
        self.source_prefix = provenance.source_prefix(source_cluster, self.topic, self.partition)
        self.pending: deque[InFlight] = deque()  # produced and not yet acknowledged, in send order
        self.open_run: InFlight | None = None  # the run the next produced record joins
        self.position = start  # next source offset to forward; None until the first record arrives
        self.committed: int | None = start
        # Exactly-once: the next source offset and destination offset as of the last committed transaction.
        self.durable: int | None = start
        self.destination_durable: int | None = None
        self.destination_next: int | None = None  # after the last acknowledged copy
        self.failed_at: int | None = None  # first offset the destination refused since the last resume
        self.in_flight = 0  # records produced whose acknowledgement (or refusal) is still to come
        self.failures = 0
        self.paused_reason: str | None = None
        self.retry_at = 0.0
        # The destination topic's record size limit, and the key + value size above which a record is measured
        # against it before it is produced (`replicator.engine.record_limits`; never, while the limit is unknown).
        self.size_limit: SizeLimit | None = None
        self.size_check = NO_SIZE_CHECK
        self.recheck_limit = False  # refused for its size: the limit is read again before the partition is retried
        self.refused_against: SizeLimit | None = None  # the limit its waiting record exceeds, measured by the task

    def committable(self) -> int | None:
        """The first source offset not yet replicated: everything before it is acknowledged."""
        head = self.pending[0].first if self.pending else self.position
        if self.failed_at is not None and (head is None or self.failed_at < head):
            return self.failed_at
        return head

    def forget_in_flight(self) -> None:
        """Before re-reading from `committable()`: nothing produced so far is awaited any more."""
        self.pending.clear()
        self.open_run = None
        self.failed_at = None

    def route(self, partition: int, ordered_acks: bool) -> None:
        """Write to destination `partition` from now on (UNASSIGNED_PARTITION: the producer's partitioner)."""
        self.destination_partition = partition
        self.routed = True
        self.ordered = partition != UNASSIGNED_PARTITION and ordered_acks


def _not_routed(*_args: object) -> None:
    raise RuntimeError("a record was produced before its destination partition was decided")


class PartitionBook:
    """The partitions a task owns (`states`), those of them paused (`paused`), and those assigned to it that another
    live task still owns (`waiting`)."""

    def __init__(self) -> None:
        self.states: dict[SourcePartition, PartitionState] = {}
        self.paused: dict[SourcePartition, PartitionState] = {}
        self.waiting: set[SourcePartition] = set()
        # Counts batches read and runs acknowledged: while it stands still, no partition's position or committable
        # offset moved, so an idle task's commits and lag readings need not visit its thousands of partitions.
        self.touched = 0

    def add(self, state: PartitionState) -> None:
        self.states[state.tp] = state

    def remove(self, tp: SourcePartition) -> None:
        self.states.pop(tp, None)
        self.paused.pop(tp, None)

    def clear(self) -> None:
        self.states = {}
        self.paused = {}

    def position(self, tp: SourcePartition) -> int | None:
        """The next offset of `tp` to read (None: nothing read or stored yet)."""
        return self.states[tp].position

    def pause(self, state: PartitionState, reason: str) -> None:
        """Hold `state` back for its next backoff (1, 2, 4 … 60 s as its failures repeat)."""
        state.paused_reason = reason
        self.paused[state.tp] = state
        state.failures += 1
        state.retry_at = time.monotonic() + RETRY_BACKOFF_S[min(state.failures - 1, len(RETRY_BACKOFF_S) - 1)]

    def unpause(self, state: PartitionState) -> str | None:
        """Lift `state`'s pause; returns why it was paused."""
        reason, state.paused_reason = state.paused_reason, None
        self.paused.pop(state.tp, None)
        return reason

    def due_for_retry(self, now: float) -> list[PartitionState]:
        """Paused partitions whose backoff is over and whose records are all answered."""
        return [s for s in self.paused.values() if s.in_flight == 0 and now >= s.retry_at]

    @staticmethod
    def read_again(state: PartitionState) -> int | None:
        """Read a partition again from its first unacknowledged offset (returned; the reader seeks there): nothing
        produced is awaited any more."""
        restart = state.committable()
        state.forget_in_flight()
        state.position = restart
        return restart

    def changed(self, offset_of: Callable[[PartitionState], int | None]) -> dict[SourcePartition, int]:
        """Each partition's offset to commit, by `offset_of`, where it differs from the last one committed."""
        offsets = {}
        for state in self.states.values():
            offset = offset_of(state)
            if offset is not None and offset != state.committed:
                offsets[state.tp] = offset
        return offsets

    def committed(self, offsets: dict[SourcePartition, int]) -> None:
        for tp, offset in offsets.items():
            state = self.states.get(tp)
            if state is not None:  # (a partition may have been dropped while its commit was under way)
                state.committed = offset
                if state.paused_reason is None:
                    state.failures = 0  # progress since the last refusal: the next one starts its backoff over

    def lags(self, watermarks: Callable[[SourcePartition], tuple[int, int]]) -> dict[SourcePartition, int | None]:
        """Each partition's lag behind its high watermark, from what was acknowledged."""
        lags: dict[SourcePartition, int | None] = {}
        for state in self.states.values():
            _low, high = watermarks(state.tp)
            done = state.committable()
            # Watermarks are only a hint (some brokers report them wrongly): never negative, unknown when absent.
            lags[state.tp] = max(high - done, 0) if high >= 0 and done is not None else None
        return lags


def describe(partitions: Iterable[SourcePartition], limit: int = 8) -> str:
    """`topic[0], topic[1] … (+n)`, for events."""
    listed = list(partitions)
    shown = ", ".join(f"{t}[{p}]" for t, p in listed[:limit])
    return shown + (f" … (+{len(listed) - limit})" if len(listed) > limit else "")
