"""Provenance kept outside the records, for copies made as record batches (shallow mirroring, issue 48), which carry
no `mirus.source` header: where each stretch of a source partition was copied (`copy_segments`, written under the
lease's epoch, with the offsets it is committed with: `Store.commit`), and the producer ids this platform's flows
hold at each cluster (`platform_producer_ids`, the batch path's cycle guard).

Segments answer what the header answers for a record-path copy: where a group's committed offset translates to
(`translated_offsets`), where a source record's copy is (`segment_for`), which record a copy stands for
(`load_segments`, `copy_origins`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from sqlalchemy import select, text, tuple_
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from replicator.assignment import SourcePartition
from replicator.state.base import StoreBase, partition_rows
from replicator.state.records import CopySegment, Lease
from replicator.state.schema import PlatformProducerId, Segment

_NEW = """unnest(CAST(:topics AS text[]), CAST(:partitions AS int[]), CAST(:source_starts AS bigint[]),
              CAST(:destination_topics AS text[]), CAST(:destination_partitions AS int[]),
              CAST(:destination_starts AS bigint[]), CAST(:counts AS bigint[]))
  AS n(topic, partition, source_start, destination_topic, destination_partition, destination_start, count)"""

# A new segment that continues the newest one of its source partition in its destination partition (the last of
# that key range) extends it: one row per stretch without a gap, however many commits wrote it.
_EXTEND = text(f"""
UPDATE copy_segments AS s SET count = s.count + n.count
FROM {_NEW}
CROSS JOIN LATERAL (
  SELECT l.destination_start FROM copy_segments AS l
  WHERE l.connector = :connector AND l.topic = n.topic AND l.partition = n.partition
    AND l.destination_topic = n.destination_topic AND l.destination_partition = n.destination_partition
  ORDER BY l.destination_start DESC LIMIT 1) AS newest
WHERE s.connector = :connector AND s.topic = n.topic AND s.partition = n.partition
  AND s.destination_topic = n.destination_topic AND s.destination_partition = n.destination_partition
  AND s.destination_start = newest.destination_start
  AND s.source_start + s.count = n.source_start AND s.destination_start + s.count = n.destination_start
RETURNING n.topic, n.partition, n.destination_topic, n.destination_partition, n.destination_start
""")

# A segment stored already (a commit repeated after an answer that was lost) is left as it is.
_INSERT = text(f"""
INSERT INTO copy_segments
  (connector, topic, partition, destination_topic, destination_partition, destination_start, source_start, count)
SELECT :connector, n.topic, n.partition, n.destination_topic, n.destination_partition, n.destination_start,
       n.source_start, n.count
FROM {_NEW}
ON CONFLICT DO NOTHING
""")

# Per question (source partition, destination partition, source offset O): 1 + the destination offset of the newest
# copy of a record below O. The newest segment starting below O holds it: destination offsets grow as segments are
# written, so every older segment ends before that one starts.
_TRANSLATED = text("""
SELECT n.i, l.destination_start + least(n.source_offset, l.source_start + l.count) - l.source_start
FROM unnest(CAST(:topics AS text[]), CAST(:partitions AS int[]), CAST(:destination_topics AS text[]),
            CAST(:destination_partitions AS int[]), CAST(:offsets AS bigint[]))
  WITH ORDINALITY AS n(topic, partition, destination_topic, destination_partition, source_offset, i)
CROSS JOIN LATERAL (
  SELECT s.source_start, s.destination_start, s.count FROM copy_segments AS s
  WHERE s.connector = :connector AND s.topic = n.topic AND s.partition = n.partition
    AND s.destination_topic = n.destination_topic AND s.destination_partition = n.destination_partition
    AND s.source_start < n.source_offset
  ORDER BY s.destination_start DESC LIMIT 1) AS l
""")


# Per record (partition, offset O) at a cluster: the segment of a flow into that cluster from the given one that holds
# O, if any: per such flow (a handful) the newest segment of the partition starting at or below O.
_ORIGINS = text("""
SELECT n.i, c.topic, c.partition, c.source_start + n.copy_offset - c.destination_start
FROM unnest(CAST(:topics AS text[]), CAST(:partitions AS int[]), CAST(:offsets AS bigint[]))
  WITH ORDINALITY AS n(topic, partition, copy_offset, i)
CROSS JOIN LATERAL (
  SELECT s.topic, s.partition, s.source_start, s.destination_start, s.count FROM flows AS f
  CROSS JOIN LATERAL (
    SELECT l.topic, l.partition, l.source_start, l.destination_start, l.count FROM copy_segments AS l
    WHERE l.connector = f.connector AND l.destination_topic = n.topic AND l.destination_partition = n.partition
      AND l.destination_start <= n.copy_offset
    ORDER BY l.destination_start DESC LIMIT 1) AS s
  WHERE f.source_cluster_id = :source AND f.destination_cluster_id = :destination
  ORDER BY s.destination_start DESC LIMIT 1) AS c
WHERE n.copy_offset < c.destination_start + c.count
""")


def _columns(segments: Sequence[CopySegment]) -> dict[str, list[Any]]:
    return {
        "topics": [g.topic for g in segments],
        "partitions": [g.partition for g in segments],
        "source_starts": [g.source_start for g in segments],
        "destination_topics": [g.destination_topic for g in segments],
        "destination_partitions": [g.destination_partition for g in segments],
        "destination_starts": [g.destination_start for g in segments],
        "counts": [g.count for g in segments],
    }


def write_segments(s: Session, connector: str, segments: Iterable[CopySegment]) -> None:
    """Store `segments` in the caller's transaction (which checked the lease first), in two statements: contiguous
    ones merged, and the first of each source and destination partition extending the newest stored one it
    continues. Empty segments, and ones whose copies' offsets the broker did not say (negative), are left out."""
    # Per source and destination partition, its runs: each a first segment and the count of the run it starts (a
    # busy lane brings a segment per batch: one made per run, not per batch).
    runs: dict[tuple[str, int, str, int], list[tuple[CopySegment, int]]] = {}
    for segment in segments:
        if segment.count <= 0 or segment.destination_start < 0:
            continue
        key = (segment.topic, segment.partition, segment.destination_topic, segment.destination_partition)
        run = runs.setdefault(key, [])
        if run and (
            segment.source_start == run[-1][0].source_start + run[-1][1]
            and segment.destination_start == run[-1][0].destination_start + run[-1][1]
        ):
            run[-1] = (run[-1][0], run[-1][1] + segment.count)
        else:
            run.append((segment, segment.count))
    if not runs:
        return
    ordered = [[g if g.count == n else replace(g, count=n) for g, n in runs[key]] for key in sorted(runs)]
    extended = {tuple(row) for row in s.execute(_EXTEND, {"connector": connector, **_columns([r[0] for r in ordered])})}
    rest = [
        g
        for run in ordered
        for g in run
        if (g.topic, g.partition, g.destination_topic, g.destination_partition, g.destination_start) not in extended
    ]
    if rest:
        s.execute(_INSERT, {"connector": connector, **_columns(rest)})


class SegmentStore(StoreBase):
    def record_segments(self, lease: Lease, segments: Iterable[CopySegment]) -> None:
        """Store segments only under `lease`'s epoch (`FencedError` otherwise). The engine commits them with the
        offsets they advance instead (`Store.commit`'s `segments`): a commit that stored one without the other
        would make a translation re-read or skip."""
        with Session(self.engine) as s, s.begin():
            self._fence_check(s, lease)
            write_segments(s, lease.connector, segments)

    def load_segments(
        self, connector: str, partitions: Iterable[SourcePartition] | None = None
    ) -> dict[SourcePartition, list[CopySegment]]:
        """The segments of `partitions` (None: of every partition), per source partition in the order they were
        written to each destination partition."""
        query = select(Segment).where(Segment.connector == connector)
        if partitions is not None:
            pairs = partition_rows(partitions)
            query = query.where(tuple_(Segment.topic, Segment.partition).in_(select(pairs.c.topic, pairs.c.partition)))
        found: dict[SourcePartition, list[CopySegment]] = {}
        with Session(self.engine) as s:
            for row in s.scalars(
                query.order_by(
                    Segment.topic,
                    Segment.partition,
                    Segment.destination_topic,
                    Segment.destination_partition,
                    Segment.destination_start,
                )
            ):
                found.setdefault((row.topic, row.partition), []).append(
                    CopySegment(
                        row.topic,
                        row.partition,
                        row.source_start,
                        row.destination_topic,
                        row.destination_partition,
                        row.destination_start,
                        row.count,
                    )
                )
        return found

    def segment_for(
        self, connector: str, partition: SourcePartition, source_offset: int
    ) -> tuple[str, int, int] | None:
        """Where the newest copy of `source_offset` is (destination topic, partition, offset), if a segment holds
        one."""
        topic, number = partition
        offset = Segment.destination_start + (source_offset - Segment.source_start)
        query = (
            select(Segment.destination_topic, Segment.destination_partition, offset)
            .where(
                Segment.connector == connector,
                Segment.topic == topic,
                Segment.partition == number,
                Segment.source_start <= source_offset,
                Segment.source_start + Segment.count > source_offset,
            )
            .order_by(Segment.destination_start.desc())
            .limit(1)
        )
        with self.engine.connect() as conn:
            row = conn.execute(query).one_or_none()
        return (row[0], row[1], row[2]) if row is not None else None

    def translated_offsets(
        self, connector: str, wanted: Sequence[tuple[SourcePartition, SourcePartition, int]]
    ) -> dict[tuple[SourcePartition, SourcePartition, int], int]:
        """For each (source partition, destination partition, source offset O): the destination offset right after
        the newest copy of a record below O that a segment holds; left out where none does. One statement."""
        if not wanted:
            return {}
        params = {
            "connector": connector,
            "topics": [source[0] for source, _d, _o in wanted],
            "partitions": [source[1] for source, _d, _o in wanted],
            "destination_topics": [destination[0] for _s, destination, _o in wanted],
            "destination_partitions": [destination[1] for _s, destination, _o in wanted],
            "offsets": [offset for _s, _d, offset in wanted],
        }
        with self.engine.connect() as conn:
            return {wanted[i - 1]: offset for i, offset in conn.execute(_TRANSLATED, params)}

    def copy_origins(
        self, source_cluster_id: str, destination_cluster_id: str, copies: Sequence[tuple[SourcePartition, int]]
    ) -> dict[tuple[SourcePartition, int], tuple[str, int, int]]:
        """For each record (partition, offset) at `destination_cluster_id` that a flow of this platform from
        `source_cluster_id` wrote as part of a record batch: the source record (topic, partition, offset) it copies.
        Records no segment holds are left out. One statement."""
        if not copies:
            return {}
        params = {
            "source": source_cluster_id,
            "destination": destination_cluster_id,
            "topics": [partition[0] for partition, _o in copies],
            "partitions": [partition[1] for partition, _o in copies],
            "offsets": [offset for _p, offset in copies],
        }
        with self.engine.connect() as conn:
            return {
                copies[i - 1]: (topic, partition, offset)
                for i, topic, partition, offset in conn.execute(_ORIGINS, params)
            }

    def record_producer_id(self, lease: Lease, cluster_id: str, producer_id: int) -> None:
        """Record that `lease`'s task holds `producer_id` at `cluster_id`, only under its epoch (`FencedError`
        otherwise), before the id writes anything there: a flow reading that cluster then never copies its batches
        back. Kafka never gives a cluster's producer id out twice; recording it again changes nothing."""
        with Session(self.engine) as s, s.begin():
            self._fence_check(s, lease)
            s.execute(
                insert(PlatformProducerId)
                .values(
                    cluster_id=cluster_id,
                    producer_id=producer_id,
                    connector=lease.connector,
                    task_id=lease.task_id,
                    epoch=lease.epoch,
                )
                .on_conflict_do_nothing()
            )

    def platform_producer_ids(self, cluster_id: str) -> set[int]:
        """Every producer id a flow of this platform (any connector's) recorded for writing to `cluster_id`. An id
        is recorded before it writes its first batch: a batch whose id a set read after the batch was fetched lacks
        is not this platform's (a reader meeting an id it does not know reads the set again before copying)."""
        query = select(PlatformProducerId.producer_id).where(PlatformProducerId.cluster_id == cluster_id)
        with self.engine.connect() as conn:
            return set(conn.scalars(query))
