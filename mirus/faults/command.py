"""`mirus faults run`: replicate under injected faults and verify the outcome (exit code 0 only if all held)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

import click

from mirus.faults.harness import FaultRun
from mirus.faults.plan import ALL_FAULTS, EMBEDDED_FAULTS, FaultKind, FaultPlan


@click.group()
def faults() -> None:
    """Fault injection: prove that replication loses nothing while its surroundings fail."""


@faults.command("run")
@click.option(
    "--duration",
    type=click.FloatRange(min=5),
    default=60.0,
    show_default=True,
    help="Seconds of load, at least: the first round of faults always ends.",
)
@click.option("--rate", type=click.IntRange(min=1), default=500, show_default=True, help="Records per second.")
@click.option("--partitions", type=click.IntRange(min=1), default=4, show_default=True)
@click.option("--tasks", type=click.IntRange(min=1), default=2, show_default=True, help="Task processes.")
@click.option(
    "--faults",
    "kinds",
    default=None,
    help=f"Comma-separated fault kinds from {', '.join(ALL_FAULTS)} "
    f"[default: {', '.join(EMBEDDED_FAULTS)}; all of them with --apache-kafka].",
)
@click.option(
    "--apache-kafka",
    is_flag=True,
    help="Run ZooKeeper and two Apache Kafka brokers from $MIRUS_KAFKA_HOME (default: the "
    "kit beside the checkout, ../shared/apache-kafka/kafka, else ~/.cache/apache-kafka/kafka) "
    "instead of the embedded broker: needed for broker restarts with data kept and for refusals.",
)
@click.option(
    "--exactly-once",
    is_flag=True,
    help="Replicate with exactly.once.support=required and require zero duplicates (needs --apache-kafka: the "
    "embedded broker shows aborted transactions' records to read_committed readers).",
)
@click.option(
    "--start-after-destination-copies",
    "start_after_copies",
    is_flag=True,
    help="Replicate with start.after.destination.copies=true: a killed task's successor starts after the copies "
    "at the destination, so a kill re-sends nothing.",
)
@click.option(
    "--copy-batches",
    "copy_batches",
    is_flag=True,
    help="Replicate with copy.mode=batches: record batches copied as bytes wherever they can pass.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the fault schedule.")
@click.option("--work-dir", type=click.Path(path_type=Path), help="Keep logs and data here (default: a temp dir).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def run(
    duration: float,
    rate: int,
    partitions: int,
    tasks: int,
    kinds: str | None,
    apache_kafka: bool,
    exactly_once: bool,
    start_after_copies: bool,
    copy_batches: bool,
    seed: int,
    work_dir: Path | None,
    as_json: bool,
) -> None:
    """Load a connector while killing its task processes, restarting Postgres, cutting the network to the
    destination (and, on Apache Kafka, restarting the destination broker and making it refuse records); then
    count lost, out-of-order and duplicated records with an independent reader."""
    chosen = tuple(k.strip() for k in kinds.split(",") if k.strip()) if kinds else None
    try:
        plan = FaultPlan(
            duration_s=duration,
            rate=rate,
            partitions=partitions,
            tasks=tasks,
            apache_kafka=apache_kafka,
            faults=cast(tuple[FaultKind, ...], chosen) or (ALL_FAULTS if apache_kafka else EMBEDDED_FAULTS),
            seed=seed,
            work_dir=work_dir,
            exactly_once=exactly_once,
            start_after_copies=start_after_copies,
            copy_batches=copy_batches,
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--faults") from None
    report = FaultRun(plan, log=lambda line: click.echo(line, err=as_json)).run()
    click.echo(json.dumps(report.to_json(), indent=2, default=str) if as_json else report.to_text())
    raise SystemExit(0 if report.ok else 1)
