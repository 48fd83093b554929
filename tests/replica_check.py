"""The suite's one oracle of a replica: reads a source topic and its destination topic with plain consumers and
compares them record by record, per partition — content, order and counts, every duplicate counted.

It shares nothing with the engine's bookkeeping or with `mirus verify` (which is tested against it): of the product
it uses only the provenance parser, since the layout of those headers is the engine's to define. Records are read
until every source record has a copy or the time is up (then the report says what is missing); counting is by
reading, never by watermarks.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaException, TopicPartition

from replicator.topics import provenance
from tests.kafka_helpers import Cluster, Rec, client_settings

SourceRecord = tuple[int, int]  # (partition, offset)


def read_topic(
    bootstrap: Cluster,
    topic: str,
    partitions: int,
    done: Callable[[list[Rec]], bool],
    timeout: float,
    isolation: str = "read_committed",
) -> list[Rec]:
    """Every record of `topic` from the beginning until `done(records)` holds or `timeout` passes, then whatever
    arrives in one more second (duplicates after the last needed record must be seen too)."""
    consumer = Consumer(
        {
            **client_settings(bootstrap),
            "group.id": "tests-replica-check",
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            "isolation.level": isolation,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    records: list[Rec] = []
    deadline = time.monotonic() + timeout
    try:
        while not done(records) and time.monotonic() < deadline:
            records.extend(_batch(consumer, 0.5))
        tail_end = time.monotonic() + 1.0
        while time.monotonic() < tail_end:
            records.extend(_batch(consumer, 0.2))
    finally:
        consumer.close()
    return records


def _batch(consumer: Consumer, wait: float) -> list[Rec]:
    batch = []
    for msg in consumer.consume(1000, wait):
        if msg.error():
            raise KafkaException(msg.error())
        batch.append(Rec.of(msg))
    return batch


def _user_view(record: Rec) -> tuple[object, ...]:
    return record.key, record.value, tuple(provenance.user_headers(record.headers)), record.timestamp


@dataclass
class ReplicaReport:
    """What a comparison found. `problems()` lists every finding; the assertions pick what a guarantee forbids."""

    topic: str
    destination_topic: str
    source_records: int
    copies: int
    missing: dict[int, list[int]] = field(default_factory=dict)  # source partition -> offsets without a copy
    duplicated: Counter[SourceRecord] = field(default_factory=Counter)  # source record -> copies beyond the first
    out_of_order: list[str] = field(default_factory=list)  # first copies not in source order
    # A copy followed by one of a record further on than the next, which had arrived earlier: a replay that stopped
    # short of where copying had got (only a fenced owner still sending its last batch does that).
    jumps: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)  # a copy whose key, value, headers or timestamp differ
    elsewhere: list[str] = field(default_factory=list)  # a copy in another partition than its source's number
    unknown: list[str] = field(default_factory=list)  # a copy without provenance, or of no source record read
    copied: set[SourceRecord] = field(default_factory=set)  # distinct source records with at least one copy

    def problems(self, duplicates_allowed: bool, jumps_allowed: bool = False) -> list[str]:
        found = [f"partition {p}: {len(o)} missing, first {o[:5]}" for p, o in sorted(self.missing.items()) if o]
        if self.duplicated and not duplicates_allowed:
            found.append(f"{sum(self.duplicated.values())} duplicates, e.g. {sorted(self.duplicated)[:5]}")
        found += self.out_of_order[:5] + ([] if jumps_allowed else self.jumps[:5])
        return found + self.mismatched[:5] + self.elsewhere[:5] + self.unknown[:5]

    def assert_at_least_once(self, fenced_writer: bool = False) -> None:
        """Complete and unchanged; per partition in source order, except replays, which restart at or below what
        was already copied and run on from there (a task resumed from its last commit). `fenced_writer`: a replay
        may also stop short (an owner fenced while it had a batch in flight sends it after its successor began)."""
        problems = self.problems(duplicates_allowed=True, jumps_allowed=fenced_writer)
        assert not problems, f"{self.topic} -> {self.destination_topic}: " + "; ".join(problems)

    def assert_duplicates_only_after(self, committed: Mapping[int, int]) -> None:
        """Copied more than once only what a crashed task had not committed: per source partition, offsets at or
        above `committed` (its committed offset, the next one to read)."""
        early = sorted((p, o) for p, o in self.duplicated if o < committed.get(p, 0))
        assert not early, f"{self.topic}: duplicates of records committed before the crash: {early[:10]}"

    def assert_exactly_once(self) -> None:
        """Complete, unchanged, in source order, and each source record copied once."""
        problems = self.problems(duplicates_allowed=False)
        assert not problems, f"{self.topic} -> {self.destination_topic}: " + "; ".join(problems)


def check_replica(
    source_bootstrap: Cluster,
    topic: str,
    destination_bootstrap: Cluster,
    destination_topic: str | None = None,
    *,
    partitions: int,
    written: int,
    timeout: float = 60.0,
) -> ReplicaReport:
    """Compare the `written` records of `topic` (all its partitions) with their copies in `destination_topic`.

    The destination is read with `isolation.level=read_committed`, as an exactly-once reader would, until every
    source record has a copy or `timeout` passes."""
    destination_topic = destination_topic or topic
    source = read_topic(source_bootstrap, topic, partitions, lambda rs: len(rs) >= written, timeout)
    by_offset = {(r.partition, r.offset): r for r in source}
    seen: set[SourceRecord] = set()
    looked_at = 0

    def complete(records: list[Rec]) -> bool:
        nonlocal looked_at
        for record in records[looked_at:]:
            origin = provenance.parse(record.headers)
            if origin is not None:
                seen.add((origin.source_partition, origin.source_offset))
        looked_at = len(records)
        return seen >= by_offset.keys()

    copies = read_topic(destination_bootstrap, destination_topic, partitions, complete, timeout)
    report = ReplicaReport(topic, destination_topic, len(source), len(copies))

    counts: Counter[SourceRecord] = Counter()
    # (destination partition, source partition) -> the copies' origins, in destination order
    sequences: dict[tuple[int, int], list[SourceRecord]] = defaultdict(list)
    for copy in copies:
        origin = provenance.parse(copy.headers)
        key = (origin.source_partition, origin.source_offset) if origin else None
        if origin is None or origin.source_topic != topic or key not in by_offset:
            report.unknown.append(f"{destination_topic}[{copy.partition}]@{copy.offset}: of {origin}")
            continue
        counts[key] += 1
        if origin.source_partition != copy.partition:
            report.elsewhere.append(f"{topic}[{key[0]}]@{key[1]} copied to partition {copy.partition}")
        if _user_view(copy) != _user_view(by_offset[key]):
            report.mismatched.append(f"{topic}[{key[0]}]@{key[1]}: {_user_view(copy)} != {_user_view(by_offset[key])}")
        sequences[(copy.partition, key[0])].append(key)
    report.copied = set(counts)
    report.duplicated = Counter({k: n - 1 for k, n in counts.items() if n > 1})
    for p in range(partitions):
        absent = sorted(o for (q, o) in by_offset.keys() - counts.keys() if q == p)
        if absent:
            report.missing[p] = absent
    # Order is judged among the records that arrived (a missing one is reported as missing, not as a gap), by rank
    # in source order.
    rank = {key: i for p in range(partitions) for i, key in enumerate(sorted(k for k in counts if k[0] == p))}
    for (p, _), origins in sequences.items():
        sequence = [rank[key] for key in origins]
        # In order: first copies follow source order, and each copy is of the next source record or restarts a
        # replay at or below the last one (a task resumed from its last commit).
        first_copies = list(dict.fromkeys(sequence))
        if first_copies != sorted(first_copies):
            report.out_of_order.append(f"partition {p}: first copies in the order {first_copies[:20]}")
        for previous, current in itertools.pairwise(sequence):
            if current > previous + 1:
                report.jumps.append(f"partition {p}: source record #{current} right after #{previous}")
    return report
