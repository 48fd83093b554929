"""Assignment generations: which partitions each task of a connector replicates, a new generation whenever that
changes, the last few kept."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from sqlalchemy import and_, delete, select, text
from sqlalchemy.orm import Session

from replicator.assignment import SourcePartition, membership
from replicator.state.base import StoreBase
from replicator.state.records import KEPT_GENERATIONS, UnknownConnectorError
from replicator.state.schema import Assignment, Connector

# The first kept generation that assigned each partition of these topics (to any task).
_FIRST_ASSIGNED = text("""
SELECT e.value->>0 AS topic, (e.value->>1)::int AS partition, min(a.generation) AS generation
FROM assignments a CROSS JOIN LATERAL jsonb_array_elements(a.partitions) AS e
WHERE a.connector = :connector AND e.value->>0 = ANY(CAST(:topics AS text[]))
GROUP BY 1, 2
""")


class AssignmentStore(StoreBase):
    def write_assignment(self, connector: str, tasks: Mapping[int, Sequence[SourcePartition]]) -> int | None:
        """Record `tasks` as a new generation if membership differs from the current one; returns it, or None."""
        wanted = membership(tasks)
        with Session(self.engine) as s, s.begin():
            row = s.get(Connector, connector, with_for_update=True)
            if row is None:
                raise UnknownConnectorError(f"connector {connector!r} does not exist")
            if self._assignment(s, connector, row.assignment_generation) == wanted and row.assignment_generation:
                return None
            row.assignment_generation += 1
            for task_id, parts in wanted.items():
                s.add(
                    Assignment(
                        connector=connector,
                        generation=row.assignment_generation,
                        task_id=task_id,
                        partitions=[list(tp) for tp in parts],
                    )
                )
            # Older generations are history nobody reads: a task reads the generation it just saw in the head row,
            # and keeping a few lets one that saw it moments ago still read it.
            s.execute(
                delete(Assignment).where(
                    Assignment.connector == connector,
                    Assignment.generation <= row.assignment_generation - KEPT_GENERATIONS,
                )
            )
            return row.assignment_generation

    def read_assignment(self, connector: str, generation: int | None = None) -> dict[int, list[SourcePartition]]:
        if generation is None:
            return self.current_assignment(connector)[1]
        with Session(self.engine) as s:
            return self._assignment(s, connector, generation)

    def current_assignment(self, connector: str) -> tuple[int, dict[int, list[SourcePartition]]]:
        """The connector's current generation and its assignment."""
        with Session(self.engine) as s:
            generation = s.scalar(select(Connector.assignment_generation).where(Connector.name == connector))
            if generation is None:
                raise UnknownConnectorError(f"connector {connector!r} does not exist")
            return generation, self._assignment(s, connector, generation)

    def current_task_ids(self) -> dict[str, list[int]]:
        """Every connector's task ids in its current generation, in one query (a worker's poll: no partitions)."""
        with Session(self.engine) as s:
            rows = s.execute(
                select(Assignment.connector, Assignment.task_id)
                .join(
                    Connector,
                    and_(
                        Connector.name == Assignment.connector, Connector.assignment_generation == Assignment.generation
                    ),
                )
                .order_by(Assignment.connector, Assignment.task_id)
            ).all()
        tasks: dict[str, list[int]] = {}
        for connector, task_id in rows:
            tasks.setdefault(connector, []).append(task_id)
        return tasks

    def current_assignments(self) -> dict[str, tuple[int, dict[int, list[SourcePartition]]]]:
        """`current_assignment` of every connector that has one, in one query."""
        with Session(self.engine) as s:
            rows = s.execute(
                select(Assignment.connector, Assignment.generation, Assignment.task_id, Assignment.partitions).join(
                    Connector,
                    and_(
                        Connector.name == Assignment.connector, Connector.assignment_generation == Assignment.generation
                    ),
                )
            ).all()
        assignments: dict[str, tuple[int, dict[int, list[SourcePartition]]]] = {}
        for connector, generation, task_id, parts in rows:
            assignments.setdefault(connector, (generation, {}))[1][task_id] = [(t, int(p)) for t, p in parts]
        return assignments

    def partitions_added_later(self, connector: str, partitions: Iterable[SourcePartition]) -> set[SourcePartition]:
        """Those of `partitions` that joined the connector's assignment after another partition of their topic did, by
        the generations kept: partitions added to a topic the connector already replicated (one query)."""
        wanted = set(partitions)
        if not wanted:
            return set()
        with Session(self.engine) as s:
            rows = s.execute(
                _FIRST_ASSIGNED, {"connector": connector, "topics": sorted({topic for topic, _ in wanted})}
            ).all()
        first: dict[SourcePartition, int] = {(topic, int(p)): generation for topic, p, generation in rows}
        topic_first: dict[str, int] = {}
        for (topic, _), generation in first.items():
            topic_first[topic] = min(generation, topic_first.get(topic, generation))
        return {tp for tp in wanted if tp in first and first[tp] > topic_first[tp[0]]}

    @staticmethod
    def _assignment(s: Session, connector: str, generation: int) -> dict[int, list[SourcePartition]]:
        rows = s.execute(
            select(Assignment.task_id, Assignment.partitions).where(
                Assignment.connector == connector, Assignment.generation == generation
            )
        ).all()
        return {task_id: [(t, int(p)) for t, p in parts] for task_id, parts in rows}
