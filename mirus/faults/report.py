"""What a fault run (`mirus.faults.harness`) found: the faults it injected, each kill's re-send bound and what was
re-sent, the independent read of both clusters, and whether the run passes."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

from mirus.faults.plan import FaultPlan
from replicator.tools.verify_report import VerifyReport


@dataclass
class FaultEvent:
    kind: str
    at_s: float  # since the load started
    lasted_s: float
    detail: str = ""


@dataclass
class KillCheck:
    """One SIGKILL: what the task had not committed, and what its successor re-sent."""

    task: int
    at_s: float
    uncommitted: int  # records the source held beyond the task's committed offsets: the most it may re-send
    resent: int = 0  # measured at the destination: the replays that started at those committed offsets
    committed: dict[str, int] = field(default_factory=dict)
    ends: dict[str, int] = field(default_factory=dict)
    written: dict[str, int] = field(default_factory=dict)  # each destination partition's end when the task died

    @property
    def within_bound(self) -> bool:
        return self.resent <= self.uncommitted


@dataclass
class FaultReport:
    plan: FaultPlan
    produced: int
    load_seconds: float
    events: list[FaultEvent]
    kills: list[KillCheck]
    task_restarts: int
    drained: bool
    drain_seconds: float
    verify: VerifyReport

    @property
    def duplicates(self) -> int:
        return self.verify.totals["duplicated"]

    @property
    def ok(self) -> bool:
        return (
            self.drained
            and self.verify.ok
            and self.verify.totals["source_records"] == self.produced
            and self.verify.totals["elsewhere"] == 0  # partition matching: each partition keeps its number
            and all(k.within_bound for k in self.kills)
            and (not self.plan.exactly_once or self.duplicates == 0)
        )

    def to_json(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "plan": {**asdict(self.plan), "work_dir": str(self.plan.work_dir) if self.plan.work_dir else None},
            "produced": self.produced,
            "load_seconds": round(self.load_seconds, 1),
            "events": [asdict(e) for e in self.events],
            "kills": [{**asdict(k), "within_bound": k.within_bound} for k in self.kills],
            "task_restarts": self.task_restarts,
            "drained": self.drained,
            "drain_seconds": round(self.drain_seconds, 1),
            "verify": self.verify.to_json(),
        }

    def to_text(self) -> str:
        t = self.verify.totals
        counts: dict[str, int] = {}
        for event in self.events:
            counts[event.kind] = counts.get(event.kind, 0) + 1
        rate = self.produced / self.load_seconds if self.load_seconds else 0.0
        lines = [
            f"load: {self.produced:,} records in {self.load_seconds:.0f} s ({rate:,.0f}/s) over "
            f"{self.plan.partitions} partitions, {self.plan.tasks} task processes",
            "faults: " + (", ".join(f"{k} x{n}" for k, n in sorted(counts.items())) or "none"),
            f"task process restarts: {self.task_restarts}",
            f"drained: {'yes' if self.drained else 'NO'} ({self.drain_seconds:.1f} s after the load stopped)",
            f"independent read: {t['source_records']:,} source records, {t['replicated']:,} replicated, "
            f"{t['missing']} missing, {t['out_of_order']} out of order, {t['mismatched']} changed, "
            f"{t['duplicated']:,} duplicated ({100 * t['duplicated'] / max(t['source_records'], 1):.2f} %), "
            f"{t['elsewhere']} in another partition",
            f"mode: {'exactly-once (read_committed reader)' if self.plan.exactly_once else 'at-least-once'}"
            + (", start.after.destination.copies" if self.plan.start_after_copies else "")
            + (", copy.mode=batches" if self.plan.copy_batches else ""),
        ]
        if self.kills:
            resent = sum(k.resent for k in self.kills)
            bound = sum(k.uncommitted for k in self.kills)
            worst = max(self.kills, key=lambda k: k.resent)
            per_task_rate = rate / self.plan.tasks if rate else 0.0
            seconds = f" ≈ {worst.resent / per_task_rate:.2f} s of that task's traffic" if per_task_rate else ""
            lines.append(
                f"kills: {len(self.kills)}; re-sent after kills {resent:,} (bound {bound:,}); "
                f"median per kill {statistics.median(k.resent for k in self.kills):,.0f}; "
                f"most after one kill {worst.resent:,}{seconds}; "
                f"all within bound: {'yes' if all(k.within_bound for k in self.kills) else 'NO'}"
            )
        for p in self.verify.partitions:
            if not p.ok:
                lines.append(
                    f"  {p.source_topic}[{p.source_partition}]: missing {p.missing_offsets}, arrived after higher "
                    f"offsets {p.out_of_order_offsets}, changed {[m.offset for m in p.mismatched_offsets]}"
                )
        lines += [f"  {e.at_s:7.1f} s  {e.kind:<8} {e.lasted_s:5.1f} s  {e.detail}" for e in self.events]
        lines.append(f"result: {'OK' if self.ok else 'FAILED'}")
        return "\n".join(lines)
