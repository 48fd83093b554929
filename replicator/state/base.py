"""What every part of the store shares: the engine, the fencing check, typed rows, partition lists as SQL."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, cast

from sqlalchemy import (
    CursorResult,
    Engine,
    Integer,
    Text,
    bindparam,
    func,
    select,
    tuple_,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Result
from sqlalchemy.orm import Session

from replicator.assignment import SourcePartition
from replicator.state.records import FencedError, Lease
from replicator.state.schema import (
    PartitionStatus,
    TaskLease,
)


def rowcount(result: Result[Any]) -> int:
    """How many rows an UPDATE or DELETE run by `Session.execute` matched. SQLAlchemy types that method's result as
    a `Result`; for these statements it is a `CursorResult`, which has the count."""
    return cast("CursorResult[Any]", result).rowcount


def partition_rows(partitions: Iterable[SourcePartition]) -> Any:
    """Partitions as (topic, partition) rows from two array parameters: an IN list of pairs grows the statement
    with every partition, and 10,000 of them exceed Postgres's stack depth."""
    pairs = sorted(set(partitions))
    topics = bindparam(None, [t for t, _ in pairs], type_=ARRAY(Text))
    numbers = bindparam(None, [p for _, p in pairs], type_=ARRAY(Integer))
    return func.unnest(topics, numbers).table_valued("topic", "partition").render_derived()


def status_rows_of(partitions: Iterable[SourcePartition]) -> Any:
    """`partition_status` rows of `partitions` (a WHERE condition)."""
    pairs = partition_rows(partitions)
    return tuple_(PartitionStatus.topic, PartitionStatus.partition).in_(select(pairs.c.topic, pairs.c.partition))


def typed_row(kind: type[Any], orm: object) -> Any:
    """A typed row (dataclass `kind`) from an ORM object: the fields of `kind`, by name."""
    return kind(**{name: getattr(orm, name) for name in kind.__dataclass_fields__})


def by_topic_order(values: Mapping[SourcePartition, int]) -> dict[str, dict[int, int]]:
    """Partition -> value, per topic, in topic order: the order rows are written and locked in, so two tasks sharing
    topics never wait on each other in opposite orders (a deadlock)."""
    by_topic: dict[str, dict[int, int]] = {}
    for (topic, partition), value in values.items():
        by_topic.setdefault(topic, {})[partition] = value
    return {topic: by_topic[topic] for topic in sorted(by_topic)}


def array_literal(values: Mapping[int, int]) -> str:
    """`{NULL,7,NULL,9}` for {1: 7, 3: 9}: array parameters go as literals, which Postgres parses far faster than a
    bound list."""
    row = ["NULL"] * (max(values) + 1)
    for index, value in values.items():
        row[index] = str(value)
    return "{" + ",".join(row) + "}"


class StoreBase:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def _fence_check(self, s: Session, lease: Lease, **values: Any) -> None:
        result = s.execute(
            update(TaskLease)
            .where(
                TaskLease.connector == lease.connector,
                TaskLease.task_id == lease.task_id,
                TaskLease.epoch == lease.epoch,
            )
            .values(heartbeat_at=func.now(), **values)
        )
        if rowcount(result) == 0:
            raise FencedError(
                f"task {lease.connector}-{lease.task_id} epoch {lease.epoch} was fenced by a newer instance "
                "(or its connector was deleted)"
            )
