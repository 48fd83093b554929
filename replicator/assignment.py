"""Which task owns which source partition.

Mirus recomputes the assignment from scratch on every change (sorted partitions, round-robin over tasks), so one
new partition can move almost every other partition, and each move costs a flush, an offset hand-over and a
re-fetch. Here the assignment is sticky: given the previous one, a partition stays with its task unless the task
is gone or balance forces it away, and only the minimum number of partitions move. Without a previous
assignment the result is exactly Mirus's round-robin, so a migrated connector starts where Mirus would have put
it.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence

SourcePartition = tuple[str, int]
"""(topic, partition) on the source cluster."""

Assignment = dict[int, list[SourcePartition]]


def assign_partitions(
    partitions: Iterable[SourcePartition],
    tasks_max: int,
    previous: Mapping[int, Sequence[SourcePartition]] | None = None,
) -> Assignment:
    """Assign `partitions` to tasks `0..n-1`, n = min(#partitions, tasks_max), keeping `previous` where possible.

    Balanced (task sizes differ by at most one), deterministic (input order and duplicates do not matter) and
    sticky (the fewest partitions possible change task). Every task gets at least one partition; each task's
    list is sorted. Zero partitions give `{}`.
    """
    if tasks_max < 1:
        raise ValueError(f"tasks_max must be at least 1, got {tasks_max}")
    wanted = sorted(set(partitions))
    n = min(len(wanted), tasks_max)
    if n == 0:
        return {}

    kept = _surviving(wanted, n, previous or {})
    quotas = _quotas(len(wanted), n, kept)

    result: Assignment = {}
    unassigned: set[SourcePartition] = set(wanted)
    for task in range(n):
        # A task over its quota gives away its highest-sorted extras: keeping the lowest ones is arbitrary but
        # stable, so repeated rebalances do not shuffle the same partitions back and forth.
        stays = kept[task][: quotas[task]]
        result[task] = stays
        unassigned.difference_update(stays)

    # New partitions, those of removed tasks and the extras fill the least-loaded tasks, lowest id first. With
    # nothing kept this is Mirus's round-robin: the i-th sorted partition lands on task i mod n.
    open_tasks = [(len(result[t]), t) for t in range(n) if len(result[t]) < quotas[t]]
    heapq.heapify(open_tasks)
    for partition in sorted(unassigned):
        load, task = heapq.heappop(open_tasks)
        result[task].append(partition)
        if load + 1 < quotas[task]:
            heapq.heappush(open_tasks, (load + 1, task))
    return {task: sorted(owned) for task, owned in result.items()}


def _surviving(
    wanted: list[SourcePartition], n: int, previous: Mapping[int, Sequence[SourcePartition]]
) -> list[list[SourcePartition]]:
    """Per task `0..n-1`, the previously owned partitions that still exist, sorted.

    A partition listed under two tasks (a corrupt or hand-edited assignment) stays with the lower task id, so
    the outcome does not depend on the mapping's iteration order.
    """
    exists = set(wanted)
    claimed: set[SourcePartition] = set()
    kept: list[list[SourcePartition]] = [[] for _ in range(n)]
    for task in sorted(previous):
        if not 0 <= task < n:
            continue
        for partition in sorted(set(previous[task])):
            if partition in exists and partition not in claimed:
                claimed.add(partition)
                kept[task].append(partition)
    return kept


def _quotas(total: int, n: int, kept: list[list[SourcePartition]]) -> list[int]:
    """How many partitions each task may own.

    `total % n` tasks get one more than the others; giving those extra slots to the tasks that already hold the
    most partitions is what keeps the number of moves minimal. Ties go to the lower task id, which without a
    previous assignment reproduces Mirus (tasks 0.. get the extra partitions).
    """
    base, extra = divmod(total, n)
    larger = set(sorted(range(n), key=lambda t: (-len(kept[t]), t))[:extra])
    return [base + 1 if t in larger else base for t in range(n)]


def membership(tasks: Mapping[int, Sequence[SourcePartition]]) -> dict[int, list[SourcePartition]]:
    """Which task owns which partitions, whatever their order (what makes two assignments the same generation)."""
    return {t: sorted((str(tp[0]), int(tp[1])) for tp in parts) for t, parts in tasks.items() if parts}
