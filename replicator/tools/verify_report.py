"""What `verify_replication` found: per source partition what is missing, out of order, replayed or different at the
destination, with a verdict, a table for people and JSON for tools (`replicator.tools.verify`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Mismatch:
    """A source offset whose copy differs: `differs` is "content", "timestamp" or "content and timestamp"."""

    offset: int
    differs: str


@dataclass
class Replay:
    """Copies of one source partition went back to `start` after reaching `highest`: a restart re-sent them, from
    destination offset `at`."""

    start: int
    highest: int
    at: int

    @property
    def resent(self) -> int:
        """How many already-delivered records this replay can re-send (the most it can duplicate)."""
        return self.highest - self.start + 1


@dataclass
class PartitionResult:
    """What the destination holds of one source partition.

    `replicated`, `missing` and `duplicated` count distinct source offsets; `out_of_order` counts the times the
    copies of this partition went backwards within one destination partition (a replay of already-delivered
    records after a restart is at-least-once behaviour and is not counted); `unknown` counts copies naming an
    offset the source did not return (records deleted at the source); `after_snapshot` counts copies of records
    past the checked range (produced after the check started), which are not checked. `bound` says where reading
    the source partition stopped and why. `replays` lists each time the copies went back to an already-delivered
    offset (where a restart resumed); `elsewhere` counts copies in a destination partition whose number differs
    from the source partition's (not an error in itself: a destination with fewer partitions, or partition
    matching turned off, spreads them).
    """

    source_topic: str
    source_partition: int
    destination_topic: str
    source_records: int = 0
    replicated: int = 0
    missing: int = 0
    missing_offsets: list[int] = field(default_factory=list)
    duplicated: int = 0
    out_of_order: int = 0
    out_of_order_offsets: list[int] = field(default_factory=list)
    elsewhere: int = 0
    mismatched: int = 0
    mismatched_offsets: list[Mismatch] = field(default_factory=list)
    unknown: int = 0
    content_matched: int = 0
    after_snapshot: int = 0
    bound: str = ""
    replays: list[Replay] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.missing == 0 and self.out_of_order == 0 and self.mismatched == 0


@dataclass
class DestinationResult:
    """What was found in one destination topic, including records that belong to no verified source partition.

    `unmatched`: records without provenance headers whose content matches no source record. `foreign`: records
    whose provenance names a source topic or partition that is not mapped to this topic. `by_segments`: records
    without provenance headers attributed by the copy segments of record batches (shallow mirroring).
    """

    topic: str
    exists: bool
    partitions: int = 0
    records: int = 0
    content_matched: int = 0
    unmatched: int = 0
    foreign: int = 0
    by_segments: int = 0


@dataclass
class VerifyReport:
    """The outcome of one check.

    `ok` needs a complete read and no missing, out-of-order or mismatched source offset in any partition;
    duplicates are allowed (at-least-once delivery) and only counted.
    """

    partitions: list[PartitionResult]
    destinations: list[DestinationResult]
    complete: bool
    notes: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.complete and all(p.ok for p in self.partitions)

    @property
    def content_matching_used(self) -> bool:
        return any(d.content_matched or d.unmatched for d in self.destinations)

    @property
    def totals(self) -> dict[str, int]:
        names = (
            "source_records",
            "replicated",
            "missing",
            "duplicated",
            "out_of_order",
            "mismatched",
            "unknown",
            "elsewhere",
        )
        return {name: sum(getattr(p, name) for p in self.partitions) for name in names}

    @property
    def verdict(self) -> str:
        if not self.complete:
            return "INCOMPLETE"
        return "OK" if self.ok else "FAILED"

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "complete": self.complete,
            "verdict": self.verdict,
            "elapsed_s": round(self.elapsed_s, 3),
            "content_matching_used": self.content_matching_used,
            "totals": self.totals,
            "partitions": [{**asdict(p), "ok": p.ok} for p in self.partitions],
            "destinations": [asdict(d) for d in self.destinations],
            "notes": list(self.notes),
        }

    def to_text(self) -> str:
        header = (
            "source topic",
            "partition",
            "destination topic",
            "records",
            "replicated",
            "missing",
            "duplicated",
            "out of order",
            "mismatched",
            "status",
            "checked up to",
        )
        rows: list[tuple[object, ...]] = [
            (
                p.source_topic,
                p.source_partition,
                p.destination_topic,
                p.source_records,
                p.replicated,
                p.missing,
                p.duplicated,
                p.out_of_order,
                p.mismatched,
                "ok" if p.ok else "FAILED",
                p.bound,
            )
            for p in self.partitions
        ]
        t = self.totals
        rows.append(
            (
                "total",
                "",
                "",
                t["source_records"],
                t["replicated"],
                t["missing"],
                t["duplicated"],
                t["out_of_order"],
                t["mismatched"],
                self.verdict,
                "",
            )
        )
        lines = _table(header, rows)
        if details := self._details():
            lines += ["", "details:", *(f"  {d}" for d in details)]
        lines += ["", "destination topics:", *self._destination_lines()]
        if self.notes:
            lines += ["", "notes:", *(f"  - {n}" for n in self.notes)]
        lines += ["", f"result: {self.verdict} ({self.elapsed_s:.1f}s)"]
        return "\n".join(lines)

    def _details(self) -> list[str]:
        """What went wrong in each partition, with a sample of the offsets."""
        details: list[str] = []
        for p in self.partitions:
            name = f"{p.source_topic}[{p.source_partition}]"
            if p.missing:
                details.append(f"{name}: missing offsets {_sample(p.missing_offsets, p.missing)}")
            if p.out_of_order:
                details.append(
                    f"{name}: arrived after higher offsets {_sample(p.out_of_order_offsets, p.out_of_order)}"
                )
            if p.mismatched:
                shown = [f"{m.offset} ({m.differs})" for m in p.mismatched_offsets]
                details.append(f"{name}: mismatched offsets {_sample(shown, p.mismatched)}")
            if p.unknown:
                details.append(f"{name}: {p.unknown} destination record(s) name offsets the source did not return")
            if p.after_snapshot:
                details.append(
                    f"{name}: {p.after_snapshot} copies of records produced after the check started (not checked)"
                )
        return details

    def _destination_lines(self) -> list[str]:
        """A line per destination topic: its records, and how they were matched to the source's."""
        lines: list[str] = []
        for d in self.destinations:
            if not d.exists:
                lines.append(f"  {d.topic}: does not exist")
                continue
            lines.append(
                f"  {d.topic}: {d.partitions} partition(s), {d.records} record(s); by provenance "
                f"{d.records - d.by_segments - d.content_matched - d.unmatched}, by copy segments {d.by_segments}, "
                f"matched by content {d.content_matched}, unmatched {d.unmatched}, foreign {d.foreign}"
            )
        return lines


def _sample(items: list[Any], count: int) -> str:
    shown = ", ".join(str(i) for i in items)
    return f"{shown} (+{count - len(items)} more)" if count > len(items) else shown


def _table(header: tuple[str, ...], rows: list[tuple[object, ...]]) -> list[str]:
    cells = [[str(c) for c in row] for row in [header, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    # Text columns left-aligned, counts right-aligned.
    numeric = [all(row[i].isdigit() or row[i] == "" for row in cells[1:]) for i in range(len(header))]

    def line(row: list[str]) -> str:
        return "  ".join(c.rjust(w) if n else c.ljust(w) for c, w, n in zip(row, widths, numeric, strict=True)).rstrip()

    return [line(cells[0]), line(["-" * w for w in widths]), *(line(r) for r in cells[1:])]
