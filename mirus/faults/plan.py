"""What a fault run (`mirus.faults.harness`) is asked to do: how long, how hard, which faults, in which mode."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

FaultKind = Literal["kill", "postgres", "network", "broker", "refuse"]
EMBEDDED_FAULTS: tuple[FaultKind, ...] = ("kill", "postgres", "network")
ALL_FAULTS: tuple[FaultKind, ...] = (*EMBEDDED_FAULTS, "broker", "refuse")
KAFKA_ONLY: frozenset[str] = frozenset({"broker", "refuse"})


@dataclass(frozen=True)
class FaultPlan:
    duration_s: float = 60.0  # how long load and faults run, at least: the first round of faults always ends
    rate: int = 500  # records per second into the source topic
    partitions: int = 4
    tasks: int = 2
    faults: tuple[FaultKind, ...] = EMBEDDED_FAULTS
    gap_s: tuple[float, float] = (2.0, 6.0)  # quiet time between two faults
    outage_s: tuple[float, float] = (3.0, 7.0)  # how long Postgres, the network or a refusal lasts
    apache_kafka: bool = False
    seed: int = 0
    work_dir: Path | None = None
    drain_timeout_s: float = 180.0
    # The engine never gives a record up for time; a value here makes it (a cut longer than this times out).
    producer_message_timeout_ms: int | None = None
    exactly_once: bool = False
    start_after_copies: bool = False  # start.after.destination.copies: a kill re-sends nothing
    copy_batches: bool = False  # copy.mode=batches: batches copied as bytes where they can pass

    def __post_init__(self) -> None:
        unknown = set(self.faults) - set(ALL_FAULTS)
        if unknown:
            raise ValueError(f"unknown fault kinds: {', '.join(sorted(unknown))} (known: {', '.join(ALL_FAULTS)})")
        needs_kafka = KAFKA_ONLY & set(self.faults)
        if needs_kafka and not self.apache_kafka:
            raise ValueError(f"faults {', '.join(sorted(needs_kafka))} need Apache Kafka (--apache-kafka)")
        if self.exactly_once and not self.apache_kafka:
            raise ValueError(
                "--exactly-once needs Apache Kafka (--apache-kafka): the embedded broker shows aborted "
                "transactions' records to read_committed readers"
            )
