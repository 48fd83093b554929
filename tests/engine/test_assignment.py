"""Sticky, balanced, deterministic assignment of source partitions to tasks."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

import pytest

from replicator.assignment import SourcePartition, assign_partitions


def moved_partitions(
    before: Mapping[int, Sequence[SourcePartition]], after: Mapping[int, Sequence[SourcePartition]]
) -> int:
    """How many partitions present in both assignments changed task (added or removed ones do not count)."""
    owner_before = {p: task for task, owned in before.items() for p in owned}
    return sum(1 for task, owned in after.items() for p in owned if p in owner_before and owner_before[p] != task)


SCENARIOS = 400


def partitions_of(topics: Mapping[str, int]) -> list[SourcePartition]:
    return [(topic, p) for topic, count in topics.items() for p in range(count)]


def assert_valid(
    result: Mapping[int, Sequence[SourcePartition]], partitions: Sequence[SourcePartition], tasks_max: int
) -> None:
    """Every partition exactly once, tasks 0..n-1, none empty, each list sorted, sizes within one of each other."""
    wanted = set(partitions)
    n = min(len(wanted), tasks_max)
    assert sorted(result) == list(range(n))
    owned = [p for ps in result.values() for p in ps]
    assert len(owned) == len(set(owned)) and set(owned) == wanted
    for ps in result.values():
        assert ps and list(ps) == sorted(ps)
    if result:
        sizes = [len(ps) for ps in result.values()]
        assert max(sizes) - min(sizes) <= 1


def forced_moves(
    previous: Mapping[int, Sequence[SourcePartition]], partitions: Sequence[SourcePartition], tasks_max: int
) -> int:
    """The fewest moves any balanced assignment needs (an oracle independent of the implementation).

    A task that survives (id < n) can keep at most its quota; `extra` tasks get a quota of base + 1, best given to
    tasks that hold more than base. Everything else that survived must move.
    """
    wanted = set(partitions)
    n = min(len(wanted), tasks_max)
    if n == 0:
        return 0
    base, extra = divmod(len(wanted), n)
    surviving = sum(1 for ps in previous.values() for p in ps if p in wanted)
    kept = [sum(1 for p in previous.get(t, ()) if p in wanted) for t in range(n)]
    can_keep = sum(min(k, base) for k in kept) + min(extra, sum(1 for k in kept if k > base))
    return surviving - can_keep


def random_partitions(rng: random.Random) -> list[SourcePartition]:
    topics = {f"topic-{chr(97 + i)}": rng.randint(1, 12) for i in range(rng.randint(1, 4))}
    return partitions_of(topics)


# -- fixed examples ----------------------------------------------------------------------------------------


def test_without_previous_it_is_mirus_round_robin() -> None:
    partitions = partitions_of({"b": 3, "a": 5})
    ordered = sorted(partitions)

    result = assign_partitions(reversed(partitions), tasks_max=3)

    assert result == {i: ordered[i::3] for i in range(3)}
    assert result[0] == [("a", 0), ("a", 3), ("b", 1)]


def test_never_more_tasks_than_partitions_and_nothing_for_nothing() -> None:
    assert assign_partitions([("a", 0), ("a", 1)], tasks_max=10) == {0: [("a", 0)], 1: [("a", 1)]}
    assert assign_partitions([], tasks_max=4) == {}
    assert assign_partitions([], tasks_max=4, previous={0: [("a", 0)]}) == {}


def test_tasks_max_below_one_is_rejected() -> None:
    with pytest.raises(ValueError, match="tasks_max"):
        assign_partitions([("a", 0)], tasks_max=0)


def test_duplicates_and_order_do_not_matter() -> None:
    partitions = partitions_of({"a": 4, "b": 2})
    assert assign_partitions(partitions + partitions[::-1], 4) == assign_partitions(partitions, 4)


def test_a_new_partition_moves_nothing_where_mirus_moves_most() -> None:
    before = assign_partitions(partitions_of({"a": 6}), tasks_max=4)
    grown = [*partitions_of({"a": 6}), ("0-first", 0)]  # sorts first: round-robin from scratch shifts everyone

    after = assign_partitions(grown, tasks_max=4, previous=before)

    assert moved_partitions(before, after) == 0
    assert ("0-first", 0) in after[2] or ("0-first", 0) in after[3]  # the least-loaded tasks
    assert moved_partitions(before, assign_partitions(grown, tasks_max=4)) >= 4


def test_reordering_the_input_moves_nothing() -> None:
    partitions = partitions_of({"a": 7, "b": 3})
    before = assign_partitions(partitions, 3)
    shuffled = partitions[:]
    random.Random(7).shuffle(shuffled)
    assert assign_partitions(shuffled, 3, previous=before) == before


def test_an_overloaded_task_gives_away_its_highest_partitions() -> None:
    previous = {0: [("a", 0), ("a", 1), ("a", 2), ("a", 3)], 1: []}

    after = assign_partitions(partitions_of({"a": 4}), tasks_max=2, previous=previous)

    assert after == {0: [("a", 0), ("a", 1)], 1: [("a", 2), ("a", 3)]}


def test_removed_tasks_hand_their_partitions_to_the_least_loaded() -> None:
    partitions = partitions_of({"a": 6})
    before = assign_partitions(partitions, tasks_max=3)  # 0: a0 a3, 1: a1 a4, 2: a2 a5

    after = assign_partitions(partitions, tasks_max=2, previous=before)

    assert after == {0: [("a", 0), ("a", 2), ("a", 3)], 1: [("a", 1), ("a", 4), ("a", 5)]}
    assert moved_partitions(before, after) == 2


def test_a_partition_listed_twice_in_previous_stays_with_the_lower_task() -> None:
    previous = {1: [("a", 0), ("a", 1)], 0: [("a", 0)]}

    after = assign_partitions(partitions_of({"a": 2}), tasks_max=2, previous=previous)

    assert after == {0: [("a", 0)], 1: [("a", 1)]}


def test_moved_partitions_ignores_added_and_removed_ones() -> None:
    before = {0: [("a", 0), ("a", 1)], 1: [("a", 2)]}
    after = {0: [("a", 0)], 1: [("a", 1), ("a", 3)]}
    assert moved_partitions(before, after) == 1


# -- randomized properties ---------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_any_previous_costs_exactly_the_forced_minimum(seed: int) -> None:
    """Arbitrary (even unbalanced, partly stale) previous assignments: only the unavoidable moves happen."""
    rng = random.Random(seed)
    for _ in range(SCENARIOS):
        partitions = random_partitions(rng)
        tasks_max = rng.randint(1, 12)
        known = partitions + [("gone", p) for p in range(rng.randint(0, 5))]
        previous: dict[int, list[SourcePartition]] = {}
        for p in rng.sample(known, rng.randint(0, len(known))):
            previous.setdefault(rng.randint(0, 14), []).append(p)

        after = assign_partitions(partitions, tasks_max, previous)

        assert_valid(after, partitions, tasks_max)
        assert moved_partitions(previous, after) == forced_moves(previous, partitions, tasks_max)


@pytest.mark.parametrize("seed", range(4))
def test_adding_partitions_moves_none_unless_balance_forces_it(seed: int) -> None:
    rng = random.Random(100 + seed)
    for _ in range(SCENARIOS):
        partitions = random_partitions(rng)
        tasks_max = rng.randint(1, 12)
        before = assign_partitions(partitions, tasks_max)
        added = [("new", p) for p in range(rng.randint(1, 10))]
        same_tasks_max = rng.random() < 0.7
        new_tasks_max = tasks_max if same_tasks_max else rng.randint(1, 12)

        after = assign_partitions(partitions + added, new_tasks_max, previous=before)

        assert_valid(after, partitions + added, new_tasks_max)
        moved = moved_partitions(before, after)
        assert moved == forced_moves(before, partitions + added, new_tasks_max)
        if same_tasks_max:
            assert moved == 0  # quotas only grow: no task is ever over its new quota


@pytest.mark.parametrize("seed", range(4))
def test_removing_partitions_moves_others_only_to_restore_balance(seed: int) -> None:
    rng = random.Random(200 + seed)
    for _ in range(SCENARIOS):
        partitions = random_partitions(rng)
        tasks_max = rng.randint(1, 12)
        before = assign_partitions(partitions, tasks_max)
        remaining = rng.sample(partitions, rng.randint(0, len(partitions)))

        after = assign_partitions(remaining, tasks_max, previous=before)

        assert_valid(after, remaining, tasks_max)
        assert moved_partitions(before, after) == forced_moves(before, remaining, tasks_max)


@pytest.mark.parametrize("seed", range(4))
def test_fewer_tasks_move_only_the_removed_tasks_partitions_plus_balance(seed: int) -> None:
    rng = random.Random(300 + seed)
    for _ in range(SCENARIOS):
        partitions = random_partitions(rng)
        tasks_max = rng.randint(2, 12)
        before = assign_partitions(partitions, tasks_max)
        fewer = rng.randint(1, tasks_max - 1)

        after = assign_partitions(partitions, fewer, previous=before)

        assert_valid(after, partitions, fewer)
        moved = moved_partitions(before, after)
        assert moved == forced_moves(before, partitions, fewer)
        on_removed_tasks = sum(len(ps) for t, ps in before.items() if t >= fewer)
        assert moved >= on_removed_tasks
        # A surviving task gives partitions away only when over its quota, so it never also receives some.
        for task in range(min(fewer, len(before))):
            if set(before[task]) - set(after[task]):
                assert set(after[task]) <= set(before[task])


@pytest.mark.parametrize("seed", range(4))
def test_same_inputs_in_any_order_give_the_same_result(seed: int) -> None:
    rng = random.Random(400 + seed)
    for _ in range(SCENARIOS):
        partitions = random_partitions(rng)
        tasks_max = rng.randint(1, 12)
        previous = assign_partitions(rng.sample(partitions, rng.randint(0, len(partitions))), rng.randint(1, 12))
        expected = assign_partitions(partitions, tasks_max, previous)

        shuffled = partitions + rng.sample(partitions, len(partitions) // 2)
        rng.shuffle(shuffled)
        reordered_previous = {t: rng.sample(ps, len(ps)) for t, ps in rng.sample(list(previous.items()), len(previous))}

        assert assign_partitions(shuffled, tasks_max, reordered_previous) == expected
        assert assign_partitions(iter(shuffled), tasks_max, reordered_previous) == expected
