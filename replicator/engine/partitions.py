"""The partition book: what a task knows about each source partition it owns — where it reads, the runs of records
in flight and their acknowledgements, where a commit may go, pauses and their backoff — and which assigned
partitions it still waits to claim from another task."""

from __future__ import annotations

import math
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable

from replicator.assignment import SourcePartition
from replicator.clusters import SizeLimit
from replicator.topics import provenance

UNASSIGNED_PARTITION = -1  # librdkafka: let the producer's partitioner choose
RETRY_BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 60.0)
# `paused_reason` of a partition whose record was refused, until the loop decides what the refusal does: the rest of
# the batch skips the partition.
AWAITING_DECISION = "a refused record awaits its decision"
# `paused_reason` of a partition whose record failed because the producer failed, not because the destination
# refused it: the rest of the batch skips the partition, and the new producer reads it again at once, no backoff.
AWAITING_NEW_PRODUCER = "awaiting the replacement of a failed producer"
AWAITING = (AWAITING_DECISION, AWAITING_NEW_PRODUCER)
NO_SIZE_CHECK = sys.maxsize  # `PartitionState.size_check` of a partition whose records are not measured


class InFlight:
    """Records of one source partition produced one after another and not yet acknowledged.

    Where the destination partition is fixed and acknowledgements stand for every earlier record of it (an
    idempotent producer with gapless ordering, or a transaction that commits only whole), only the last record of
    the run carries a delivery callback: one acknowledgement for the run. Elsewhere every record is its own run.
    """

    __slots__ = ("count", "destination_end", "done", "first", "last", "size", "tail_sent", "timestamps")

    def __init__(self, first: int) -> None:
        self.first = first  # source offset of the run's first record: nothing from here on is acknowledged yet
        self.last = first - 1  # source offset of the run's last record produced so far
        self.count = 0
        self.size = 0  # key + value bytes
        self.timestamps: list[int] = []  # CreateTime / LogAppendTime of each record that has one (ms)
        self.tail_sent = False  # whether a record carrying the run's callback was produced
        self.done = False
        self.destination_end: int | None = None  # after its last copy at the destination, once acknowledged there

    def add(self, offset: int, size: int, timestamp: int) -> None:
        """A record produced in this run (the forwarder's one call per record; `timestamp` 0: none)."""
        self.last = offset
        self.count += 1
        self.size += size
        if timestamp:
            self.timestamps.append(timestamp)


class PartitionState:
    """What the task knows about one owned source partition: the partition's ledger. Its fields change only through
    its methods below (tests/engine/test_engine_parts.py finds writes elsewhere).

    Offsets are source offsets unless their name says destination:
      next_offset                 the next source record to forward
      first_unacknowledged()      the first record not yet at the destination: everything before it is acknowledged
      committed_offset            as stored in Postgres by the last commit
      durable_offset              exactly once: after the last committed destination transaction (what may be stored)
      next_destination_offset     at the destination, after the copy of the record before first_unacknowledged()
                                  (or before that: never after a copy still to be acknowledged)
      durable_destination_offset  exactly once: after the last committed transaction's copy, at the destination
    """

    __slots__ = (
        "committed_offset", "destination_partition", "destination_topic", "durable_destination_offset",
        "durable_offset", "failures", "in_flight", "next_destination_offset", "next_offset", "open_run", "ordered",
        "partition", "paused_reason", "pending", "produce", "recheck_limit", "refused_against", "refused_from",
        "retry_at", "routed", "size_check", "size_limit", "source_prefix", "topic", "tp",
    )  # fmt: skip

    def __init__(self, tp: SourcePartition, start: int | None, destination_topic: str, source_cluster: str) -> None:
        self.tp = tp
        self.topic, self.partition = tp
        self.destination_topic = destination_topic
        self.destination_partition = UNASSIGNED_PARTITION
        self.routed = False  # whether destination metadata has decided `destination_partition` yet
        # `produce` of the producer writing `destination_topic` (`replicator.engine.deliveries`), once routed.
        self.produce: Callable[..., None] = _not_routed
        self.ordered = False  # whether one acknowledgement stands for a whole run (see InFlight)
        self.source_prefix = provenance.source_prefix(source_cluster, self.topic, self.partition)
        self.pending: deque[InFlight] = deque()  # produced and not yet acknowledged, in send order
        self.open_run: InFlight | None = None  # the run the next produced record joins
        self.next_offset = start  # None until the first record arrives
        self.committed_offset: int | None = start
        self.durable_offset: int | None = start
        self.durable_destination_offset: int | None = None
        self.next_destination_offset: int | None = None
        self.refused_from: int | None = None  # first offset the destination refused since the last resume
        self.in_flight = 0  # records in runs sent whose acknowledgement (or refusal) is still to come
        self.failures = 0
        self.paused_reason: str | None = None
        self.retry_at = 0.0
        # The destination topic's record size limit, and the key + value size above which a record is measured
        # against it before it is produced (`replicator.engine.record_limits`; never, while the limit is unknown).
        self.size_limit: SizeLimit | None = None
        self.size_check = NO_SIZE_CHECK
        self.recheck_limit = False  # refused for its size: the limit is read again before the partition is retried
        self.refused_against: SizeLimit | None = None  # the limit its waiting record exceeds, measured by the task

    def first_unacknowledged(self) -> int | None:
        """The first source offset not yet replicated: everything before it is acknowledged."""
        head = self.pending[0].first if self.pending else self.next_offset
        if self.refused_from is not None and (head is None or self.refused_from < head):
            return self.refused_from
        return head

    # -- where it starts and goes -------------------------------------------------------------------------------

    def starts_at(self, offset: int) -> None:
        """A partition never committed starts at `offset` (per auto.offset.reset), as if committed there."""
        self.next_offset = self.durable_offset = offset

    def route(self, partition: int, ordered_acks: bool, produce: Callable[..., None] | None = None) -> None:
        """Write to destination `partition` from now on (UNASSIGNED_PARTITION: the producer's partitioner), through
        `produce` when given."""
        self.destination_partition = partition
        self.routed = True
        self.ordered = partition != UNASSIGNED_PARTITION and ordered_acks
        if produce is not None:
            self.produce = produce

    def write_through(self, produce: Callable[..., None]) -> None:
        """Its destination topic's producer was made again (or closed while idle)."""
        self.produce = produce

    def sized(self, limit: SizeLimit | None, size_check: int) -> None:
        """Its destination topic's record size limit, and the size above which a record is measured against it."""
        self.size_limit, self.size_check = limit, size_check

    # -- forwarding: a run opened, its records added (`InFlight.add`), sent whole or cut short -----------------

    def open(self, offset: int) -> InFlight:
        """A new run, starting at `offset`."""
        run = self.open_run = InFlight(offset)
        self.pending.append(run)
        return run

    def sent(self, run: InFlight) -> None:
        """The run's last record, carrying its callback, was produced."""
        run.tail_sent = True
        self.open_run = None
        self.in_flight += run.count
        self.next_offset = run.last + 1

    def cut(self, run: InFlight) -> None:
        """The run ends before a record just refused (forgotten if it holds nothing yet); its records so far carry
        no callback (`Deliveries.conclude_cut_runs`)."""
        self.open_run = None
        if run.count:
            self.in_flight += run.count
            self.next_offset = run.last + 1
        else:
            self.pending.pop()

    def copied_as_batches(self, next_offset: int, next_destination_offset: int | None) -> None:
        """The batch path copied the partition up to `next_offset` (control batches and aborted transactions
        included), acknowledged at once; its next copy goes to `next_destination_offset`, where known."""
        self.next_offset = next_offset
        if next_destination_offset is not None:
            self.next_destination_offset = next_destination_offset

    def skipped(self, offset: int) -> None:
        """A record not copied (it came from the destination cluster): the partition moves past it."""
        self.next_offset = offset + 1

    # -- acknowledged, refused ------------------------------------------------------------------------------------

    def acknowledged(self, run: InFlight, destination_offset: int | None) -> None:
        """The destination acknowledged the run (its last copy at `destination_offset`, where known)."""
        self.in_flight -= run.count
        run.done = True
        # (None only without acknowledgements, acks=0, which an ordered state rules out, or for a run cut short.)
        if destination_offset is not None and self.ordered:
            run.destination_end = destination_offset + 1
        # The destination offset moves with the acknowledged head alone, so that it always pairs with
        # `first_unacknowledged()` or comes before it. A run acknowledged behind an unanswered one (a record timed
        # out, then the next run delivered) would otherwise put it past copies that a commit says are still to be
        # made: a start would find nothing there to skip and write them again.
        pending = self.pending
        while pending and pending[0].done:
            end = pending.popleft().destination_end
            if end is not None:
                self.next_destination_offset = end

    def unanswered(self, run: InFlight) -> None:
        """The run was refused, or given up with its producer: it stays in `pending`, nothing past it committed."""
        self.in_flight -= run.count

    def cut_runs(self) -> list[InFlight]:
        """The runs cut short, whose records carry no callback: each marked sent, for the deliveries to
        acknowledge or give up (`Deliveries.conclude_cut_runs`)."""
        self.open_run = None
        cut = [run for run in self.pending if not run.tail_sent]
        for run in cut:
            run.tail_sent = True
        return cut

    def refused(self, offset: int, too_large: bool) -> None:
        """The destination (or the task, before sending) refused the record at `offset`: skipped until decided."""
        if self.refused_from is None or offset < self.refused_from:
            self.refused_from = offset
        if too_large:
            self.recheck_limit = True  # raised meanwhile, the limit lets the retry through
        if self.paused_reason is None:
            self.paused_reason = AWAITING_DECISION

    @property
    def awaiting(self) -> bool:
        """Skipped for a refusal not yet decided, or until a new producer: not paused by a decision or a hand."""
        return self.paused_reason in AWAITING

    def too_large(self) -> None:
        """Its waiting record exceeds the topic's limit as the task measured it."""
        self.refused_against = self.size_limit

    # -- paused, held, read again ---------------------------------------------------------------------------------

    def awaiting_new_producer(self) -> None:
        """Its record failed because the producer failed: the rest of a batch skips it until the new producer."""
        if self.paused_reason is None or self.paused_reason is AWAITING_DECISION:
            self.paused_reason = AWAITING_NEW_PRODUCER

    def paused_for(self, reason: str, now: float) -> None:
        """Held back for its next backoff (1, 2, 4 … 60 s as its failures repeat)."""
        self.paused_reason = reason
        self.failures += 1
        self.retry_at = now + RETRY_BACKOFF_S[min(self.failures - 1, len(RETRY_BACKOFF_S) - 1)]

    def held(self, reason: str) -> None:
        """Held by an operator: never retried by time."""
        self.paused_reason = reason
        self.retry_at = math.inf

    def retry_now(self) -> None:
        """Retried at the next turn (an operator resumed it)."""
        self.retry_at = 0.0

    def unpaused(self) -> str | None:
        """Its pause lifted; returns why it was paused."""
        reason, self.paused_reason = self.paused_reason, None
        return reason

    def limit_read(self) -> None:
        """Its size limit was read again before a retry."""
        self.recheck_limit = False

    def still_too_large(self) -> None:
        """Its waiting record exceeds the limit just read: it waits for its next backoff and another reading."""
        self.recheck_limit = True

    def within_limit(self) -> None:
        """Retried: its waiting record is no longer known to exceed its topic's limit."""
        self.refused_against = None

    def read_again(self) -> int | None:
        """Read again from its first unacknowledged offset (returned): nothing produced is awaited any more."""
        restart = self.first_unacknowledged()
        self.pending.clear()
        self.open_run = None
        self.refused_from = None
        self.next_offset = restart
        return restart

    # -- committed ------------------------------------------------------------------------------------------------

    def committed(self, offset: int) -> None:
        """Postgres holds `offset`."""
        self.committed_offset = offset
        if self.paused_reason is None:
            self.failures = 0  # progress since the last refusal: the next one starts its backoff over

    def made_durable(self) -> None:
        """Exactly once: a destination transaction committed everything acknowledged."""
        self.durable_offset = self.first_unacknowledged()
        self.durable_destination_offset = self.next_destination_offset

    def durable_at(self, offset: int) -> None:
        """Exactly once: the destination holds a committed copy up to `offset` (a commit whose answer was lost)."""
        self.durable_offset = offset

    def rewound(self) -> None:
        """Exactly once: the transaction was aborted: read again from the last committed one, nothing in flight."""
        if self.awaiting:
            self.paused_reason = None
        self.read_again()
        self.in_flight = 0
        self.next_offset = self.durable_offset
        self.next_destination_offset = self.durable_destination_offset


def _not_routed(*_args: object) -> None:
    raise RuntimeError("a record was produced before its destination partition was decided")


class PartitionBook:
    """The partitions a task owns (`states`), those of them paused (`paused`), and those assigned to it that another
    live task still owns (`waiting`)."""

    def __init__(self) -> None:
        self.states: dict[SourcePartition, PartitionState] = {}
        self.paused: dict[SourcePartition, PartitionState] = {}
        self.waiting: set[SourcePartition] = set()
        self.removals = 0  # partitions removed (or the book cleared): the batch path's lanes follow
        # Counts batches read and runs acknowledged: while it stands still, no partition's position or committable
        # offset moved, so an idle task's commits and lag readings need not visit its thousands of partitions.
        self.touched = 0

    def add(self, state: PartitionState) -> None:
        self.states[state.tp] = state

    def remove(self, tp: SourcePartition) -> None:
        self.states.pop(tp, None)
        self.paused.pop(tp, None)
        self.removals += 1

    def clear(self) -> None:
        self.states = {}
        self.paused = {}
        self.removals += 1

    def next_offset(self, tp: SourcePartition) -> int | None:
        """The next offset of `tp` to read (None: nothing read or stored yet)."""
        return self.states[tp].next_offset

    def pause(self, state: PartitionState, reason: str) -> None:
        """Hold `state` back for its next backoff (1, 2, 4 … 60 s as its failures repeat)."""
        state.paused_for(reason, time.monotonic())
        self.paused[state.tp] = state

    def hold(self, state: PartitionState, reason: str) -> None:
        """Hold `state` until an operator resumes it (with a failure's pause, if any: the resume retries it)."""
        state.held(reason)
        self.paused[state.tp] = state

    def unpause(self, state: PartitionState) -> str | None:
        """Lift `state`'s pause; returns why it was paused."""
        self.paused.pop(state.tp, None)
        return state.unpaused()

    def due_for_retry(self, now: float) -> list[PartitionState]:
        """Paused partitions whose backoff is over and whose records are all answered."""
        return [s for s in self.paused.values() if s.in_flight == 0 and now >= s.retry_at]

    def changed(self, offset_of: Callable[[PartitionState], int | None]) -> dict[SourcePartition, int]:
        """Each partition's offset to commit, by `offset_of`, where it differs from the last one committed."""
        offsets = {}
        for state in self.states.values():
            offset = offset_of(state)
            if offset is not None and offset != state.committed_offset:
                offsets[state.tp] = offset
        return offsets

    def committed(self, offsets: dict[SourcePartition, int]) -> None:
        for tp, offset in offsets.items():
            state = self.states.get(tp)
            if state is not None:  # (a partition may have been dropped while its commit was under way)
                state.committed(offset)

    def lags(self, watermarks: Callable[[SourcePartition], tuple[int, int]]) -> dict[SourcePartition, int | None]:
        """Each partition's lag behind its high watermark, from what was acknowledged."""
        lags: dict[SourcePartition, int | None] = {}
        for state in self.states.values():
            _low, high = watermarks(state.tp)
            done = state.first_unacknowledged()
            # Watermarks are only a hint (some brokers report them wrongly): never negative, unknown when absent.
            lags[state.tp] = max(high - done, 0) if high >= 0 and done is not None else None
        return lags


def describe(partitions: Iterable[SourcePartition], limit: int = 8) -> str:
    """`topic[0], topic[1] … (+n)`, for events."""
    listed = list(partitions)
    shown = ", ".join(f"{t}[{p}]" for t, p in listed[:limit])
    return shown + (f" … (+{len(listed) - limit})" if len(listed) > limit else "")
