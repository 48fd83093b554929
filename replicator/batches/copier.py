"""Partitions copied as record batches: fetch (read_committed) → drop what read_committed drops → judge each batch →
rewrite its header → produce in order with this producer's sequences → report where the copies went.

Each copied partition is a lane: its source position, the destination partition of the same number, that topic's
`max.message.bytes`. A step serves every lane once. A batch that cannot pass stops its lane and is handed back with
its reason and the offset the record path takes over at (`HandBack`); nothing after it is copied, so order holds,
and `start` opens the lane again further on. A failed produce leaves the lane at the failed batch with that batch's
sequence: the next step fetches and sends the same batches with the same sequences, and the broker drops what it
already wrote. A problem Kafka calls not retriable closes the lane (reported in the step); a retriable one is tried
again at the next step.

While a step's batches are produced, the next step's fetch is already on its way (from where the lanes will be once
every batch is acknowledged): the source and the destination work at once, as a broker's replica fetcher does. A
fetch from a position that did not come true (a produce failed, a lane stopped or moved) is left unused. A fetch that
waits for records is sent the same way, and a step waits for its answer `step_wait_ms` at most: a fetch may wait at
its broker longer than the task's loop can (`max_wait_ms`), and the next step waits for the same fetch again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import NamedTuple

from replicator.batches.record_batch import (
    AbortedTransaction,
    Reason,
    RecordBatch,
    committed,
    next_sequence,
    rewrite,
    split,
    truncated_length,
)
from replicator.batches.wire import UNKNOWN, Fetched, KafkaWire, Partition, Problem, Produced, ProducerIdentity

PARTITION_FETCH_BYTES = 4 * 1_048_576
# After a step that copied a little, the next fetch waits for GATHER_BYTES (as a consumer's fetch.min.bytes does) up to
# GATHER_MS, or GATHER_MS_PER_LANE a lane when longer: records trickling in at a few thousand a second come a step per
# 10 ms, not a step per batch (a step over 4 partitions at 5,000 records/s took 63 % of a core). Kafka before 1.1 has no
# fetch sessions: a fetch names, and its answer carries, every lane, so over 1,000 lanes a fetch each 10 ms took 37.5 %
# of a core and the source broker 91 %. So "a little" grows with the lanes too (GATHER_BYTES_PER_LANE, about a
# one-record batch a lane): a step over 5,000 lanes costs ~45 ms of CPU before it copies anything, and under 5,000
# records/s spread over them steps that each copied more than GATHER_BYTES came 6 a second. Over that many lanes the
# copier waits itself, then asks for what is there: Kafka 1.0 asked to wait for those bytes answered a 250 ms wait after
# 400 to 660 ms, its CPU at 90 %; waiting here, the fetch took 320 to 510 ms. An idle lane still waits `max_wait_ms`.
GATHER_BYTES = 64 * 1024
GATHER_BYTES_PER_LANE = 256
GATHER_MS = 10
GATHER_MS_PER_LANE = 0.05
# A batch sent again with its sequence: Kafka since 1.0 answers with the offset it wrote the batch at; brokers that
# answer DUPLICATE_SEQUENCE_NUMBER instead (Kafka 0.11, Tansu) wrote it too, at an offset they do not say.
DUPLICATE_SEQUENCE_NUMBER = 46
UNKNOWN_OFFSET = -1


@dataclass(frozen=True, slots=True)
class Segment:
    """Source offsets `source_offset` .. +`count` written at destination offsets `destination_offset` .. +`count`
    (UNKNOWN_OFFSET: a duplicate the broker dropped without saying where the first copy is)."""

    source_offset: int
    destination_offset: int
    count: int

    def continued_by(self, other: Segment) -> bool:
        return (
            UNKNOWN_OFFSET not in (self.destination_offset, other.destination_offset)
            and other.source_offset == self.source_offset + self.count
            and other.destination_offset == self.destination_offset + self.count
        )


def merged(segments: Iterable[Segment]) -> list[Segment]:
    """Contiguous segments (in source and destination alike) as one."""
    out: list[Segment] = []
    for segment in segments:
        if out and out[-1].continued_by(segment):
            last = out[-1]
            out[-1] = Segment(last.source_offset, last.destination_offset, last.count + segment.count)
        else:
            out.append(segment)
    return out


@dataclass(frozen=True, slots=True)
class HandBack:
    """The batch a lane stopped at and why; the record path copies from `offset` on."""

    offset: int
    reason: Reason
    batch: RecordBatch


@dataclass
class Step:
    """What one step did, per source partition."""

    segments: dict[Partition, list[Segment]] = field(default_factory=dict)
    handed_back: dict[Partition, HandBack] = field(default_factory=dict)
    problems: dict[Partition, Problem] = field(default_factory=dict)
    high_watermarks: dict[Partition, int] = field(default_factory=dict)  # as each fetch answered
    positions: dict[Partition, int] = field(default_factory=dict)  # of the lanes that copied or skipped batches
    bytes_copied: dict[Partition, int] = field(default_factory=dict)
    # Per partition, each acknowledged batch's timestamp (LogAppendTime's, else its first record's) and records.
    timestamps: dict[Partition, list[tuple[int, int]]] = field(default_factory=dict)
    records: int = 0
    bytes: int = 0


@dataclass
class Lane:
    destination: Partition
    max_message_bytes: int
    position: int
    fetch_bytes: int


@dataclass
class Plan:
    """A lane's batches for one step, their rewritten bytes, and what ends the plan."""

    batches: list[RecordBatch] = field(default_factory=list)
    rewritten: list[bytes | bytearray] = field(default_factory=list)
    end: int = 0  # the position once every batch was acknowledged
    hand_back: HandBack | None = None


class Sent(NamedTuple):
    """A fetch on its way: the positions it asked from, its answer, how long it may wait at its broker."""

    positions: dict[Partition, int]
    answer: Future[dict[Partition, Fetched]]
    max_wait_ms: int


class BatchCopier:
    """Copies lanes (source partitions) from `source` to `destination` as record batches, with one idempotent
    producer id at the destination (InitProducerId at construction unless given)."""

    def __init__(
        self,
        source: KafkaWire,
        destination: KafkaWire,
        *,
        producer: ProducerIdentity | None = None,
        max_wait_ms: int = 500,
        partition_fetch_bytes: int = PARTITION_FETCH_BYTES,
        ours: Callable[[int], bool] = lambda _producer_id: False,
    ) -> None:
        self.source = source
        self.destination = destination
        self.producer = producer or destination.init_producer_id()
        # Whether a batch's producer id is one this platform's flows write the source cluster with: such a batch is
        # a copy of another cluster's records, skipped (the cycle guard of the batch path).
        self.ours = ours
        self.max_wait_ms = max_wait_ms  # how long a fetch waits at its broker for records
        self.step_wait_ms = max_wait_ms + 1_000  # how long a step waits for a fetch's answer to arrive
        self.gathering = False  # the last step copied less than `_gather_bytes()`, but something
        self.partition_fetch_bytes = partition_fetch_bytes
        self.lanes: dict[Partition, Lane] = {}
        self.writers: dict[Partition, Partition] = {}  # the source partition each lane's destination partition copies
        self.sequences: dict[Partition, int] = {}  # per destination partition, kept while a lane is closed
        # The next step's fetch: sent while this step's batches are produced, or waiting for records.
        self.ahead: Sent | None = None
        self._fetching = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batch-fetch")

    def close(self) -> None:
        """Send no more fetches ahead (one on its way ends with its wait, unused)."""
        self.ahead = None
        self._fetching.shutdown(wait=False, cancel_futures=True)

    def start(self, source: Partition, offset: int, destination_topic: str, max_message_bytes: int) -> None:
        """Copy `source` from `offset` on to the partition of the same number of `destination_topic`."""
        destination = Partition(destination_topic, source.partition)
        if self.writers.get(destination, source) != source:
            raise ValueError(f"{destination} is already the destination of another partition")
        self.stop(source)
        self.lanes[source] = Lane(destination, max_message_bytes, offset, self.partition_fetch_bytes)
        self.writers[destination] = source
        self.sequences.setdefault(destination, 0)

    def stop(self, source: Partition) -> None:
        """Copy `source` no more (its destination partition's sequence is kept)."""
        if (lane := self.lanes.pop(source, None)) is not None:
            del self.writers[lane.destination]

    def waiting_ms(self) -> int:
        """How long the fetch on its way may still wait at its broker (its `max_wait_ms`); 0 when none is."""
        return 0 if self.ahead is None or self.ahead.answer.done() else self.ahead.max_wait_ms

    def step(self) -> Step:
        step = Step()
        if not self.lanes:
            return step
        fetched = self._fetched({p: lane.position for p, lane in self.lanes.items()})
        if fetched is None:  # the fetch waiting for records has not answered within `step_wait_ms`
            return step
        plans: dict[Partition, Plan] = {}
        for source, result in fetched.items():
            if result.problem is not None:
                self._failed(source, result.problem, step)
            else:
                step.high_watermarks[source] = result.high_watermark
                if result.records:  # (most lanes of a step over thousands of partitions have none)
                    plans[source] = self._plan(self.lanes[source], result.records, result.aborted)
        batches = {self.lanes[p].destination: plan.rewritten for p, plan in plans.items() if plan.rewritten}
        self.gathering = 0 < sum(len(b) for rewritten in batches.values() for b in rewritten) < self._gather_bytes()
        if batches:
            self._fetch_ahead(plans)
        produced = self.destination.produce(batches) if batches else {}
        for source, plan in plans.items():
            self._settle(source, plan, produced.get(self.lanes[source].destination, []), step)
        return step

    def _fetched(self, positions: dict[Partition, int]) -> dict[Partition, Fetched] | None:
        """The records from `positions`: what the fetch on its way brought where it asked from there, and the rest
        fetched now without waiting when that fetch brought records; otherwise a fetch of every lane that waits for
        records is sent. None while the fetch on its way has not answered within `step_wait_ms`."""
        results: dict[Partition, Fetched] = {}
        if self.ahead is not None:
            try:
                answered = self.ahead.answer.result(timeout=self.step_wait_ms / 1000)
            except TimeoutError:
                return None
            asked, self.ahead = self.ahead.positions, None
            if asked == positions:  # (most steps: every lane where the fetch asked from, all answered)
                results = answered
            else:
                results = {p: f for p, f in answered.items() if p in positions and asked.get(p) == positions[p]}
        rest = {} if results.keys() == positions.keys() else {p: o for p, o in positions.items() if p not in results}
        if not rest:
            return results
        if any(f.records for f in results.values()):
            results.update(self._fetch(rest, self._sizes(rest), 0, 1))
            return results
        self._send(positions)
        return self._fetched(positions)

    def _waits(self) -> tuple[int, int, int]:
        """How long a fetch waits before it is sent, then at its broker, and for how many bytes."""
        if not self.gathering:
            return 0, self.max_wait_ms, 1
        wait_ms = min(self.max_wait_ms, max(GATHER_MS, round(len(self.lanes) * GATHER_MS_PER_LANE)))
        if self._gather_bytes() > GATHER_BYTES:
            return wait_ms, self.max_wait_ms, 1
        return 0, wait_ms, GATHER_BYTES

    def _gather_bytes(self) -> int:
        return max(GATHER_BYTES, len(self.lanes) * GATHER_BYTES_PER_LANE)

    def _fetch_ahead(self, plans: dict[Partition, Plan]) -> None:
        """Send the next step's fetch, from where each lane stands once this step's batches are acknowledged."""
        positions = {
            p: plans[p].end if p in plans else lane.position
            for p, lane in self.lanes.items()
            if p not in plans or plans[p].hand_back is None
        }
        if positions:
            self._send(positions)

    def _send(self, positions: dict[Partition, int]) -> None:
        """A fetch from `positions` on the fetching thread (the sizes are read here: the lanes change in this
        thread only)."""
        pause_ms, max_wait_ms, min_bytes = self._waits()
        sizes = self._sizes(positions)
        answer = self._fetching.submit(self._fetch, positions, sizes, max_wait_ms, min_bytes, pause_ms)
        self.ahead = Sent(positions, answer, pause_ms + max_wait_ms)

    def _sizes(self, positions: dict[Partition, int]) -> dict[Partition, int]:
        return {p: self.lanes[p].fetch_bytes for p in positions}

    def _fetch(
        self,
        positions: dict[Partition, int],
        sizes: dict[Partition, int],
        max_wait_ms: int,
        min_bytes: int,
        pause_ms: int = 0,
    ) -> dict[Partition, Fetched]:
        if pause_ms:
            time.sleep(pause_ms / 1000)
        return self.source.fetch(positions, partition_max_bytes=sizes, max_wait_ms=max_wait_ms, min_bytes=min_bytes)

    def _plan(self, lane: Lane, records: bytes, aborted: Sequence[AbortedTransaction]) -> Plan:
        batches, complete = split(records)
        if not batches:
            # Nothing whole: a broker that cuts even a partition's first batch gets asked for all of it next time.
            lane.fetch_bytes = max(lane.fetch_bytes, truncated_length(records, complete) or 0)
            return Plan(end=lane.position)
        lane.fetch_bytes = self.partition_fetch_bytes
        plan = Plan(end=max(lane.position, batches[-1].next_offset))
        sequence = self.sequences[lane.destination]
        position = lane.position
        for batch in committed(batches, aborted):
            if batch.producer_id >= 0 and batch.next_offset > position and self.ours(batch.producer_id):
                continue  # a copy this platform wrote: never written back (the plan's end moves past it)
            if reason := batch.why_not(position, lane.max_message_bytes):
                plan.hand_back = HandBack(max(position, batch.base_offset), reason, batch)
                break
            plan.batches.append(batch)
            plan.rewritten.append(rewrite(batch, self.producer.producer_id, self.producer.epoch, sequence))
            sequence = next_sequence(sequence, batch.records_count)
            position = batch.next_offset
        return plan

    def _settle(self, source: Partition, plan: Plan, produced: Sequence[Produced], step: Step) -> None:
        """Acknowledged batches become segments and move the lane and its sequence on; the first failed one stops
        the lane there (the batches after it were refused or never sent)."""
        lane = self.lanes[source]
        segments: list[Segment] = []
        # The run of contiguous copies being gathered into one segment (a busy lane brings a batch a record).
        run_source = run_destination = run_count = 0
        records = size = 0
        timestamps = []
        for i, batch in enumerate(plan.batches):
            result = produced[i] if i < len(produced) else Produced(Problem(UNKNOWN, "not sent", True))
            if result.problem is not None and result.problem.code != DUPLICATE_SEQUENCE_NUMBER:
                lane.position = batch.base_offset
                self._failed(source, result.problem, step)
                break
            written_at = result.base_offset if result.problem is None else UNKNOWN_OFFSET
            count = batch.records_count
            if (
                run_count
                and UNKNOWN_OFFSET not in (written_at, run_destination)
                and batch.base_offset == run_source + run_count
                and written_at == run_destination + run_count
            ):
                run_count += count
            else:
                if run_count:
                    segments.append(Segment(run_source, run_destination, run_count))
                run_source, run_destination, run_count = batch.base_offset, written_at, count
            records += count
            size += len(batch.data)
            timestamps.append((batch.timestamp, count))
        else:
            if plan.hand_back is not None:
                step.handed_back[source] = plan.hand_back
                self.stop(source)
            else:
                lane.position = step.positions[source] = plan.end
        if run_count:
            segments.append(Segment(run_source, run_destination, run_count))
            self.sequences[lane.destination] = next_sequence(self.sequences[lane.destination], records)
            step.segments[source] = segments
            step.records += records
            step.bytes += size
            step.bytes_copied[source] = size
            step.timestamps[source] = timestamps

    def _failed(self, source: Partition, problem: Problem, step: Step) -> None:
        step.problems[source] = problem
        if not problem.retriable:
            self.stop(source)
