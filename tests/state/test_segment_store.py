"""Provenance outside the records for copies made as record batches: copy segments and the platform's producer ids,
written only under the lease's epoch."""

from __future__ import annotations

import pytest

from replicator.state.records import CopySegment, FencedError
from replicator.state.store import Store


def seg(source: int, destination: int, count: int, topic: str = "t", partition: int = 0) -> CopySegment:
    """A segment of `topic`[`partition`] copied to "t.copy" in the partition of the same number."""
    return CopySegment(topic, partition, source, "t.copy", partition, destination, count)


def test_contiguous_segments_merge_so_rows_grow_with_gaps_not_with_traffic(store: Store, unique: str) -> None:
    store.put_connector(unique, {"name": unique}, 1)
    lease = store.claim_task(unique, 0, "me")
    # A thousand commits of contiguous batches, three batches each: one row.
    for i in range(1000):
        store.commit(
            lease, {("t", 0): 30 * (i + 1)}, segments=[seg(30 * i + 10 * b, 30 * i + 10 * b, 10) for b in range(3)]
        )
    assert store.load_segments(unique) == {("t", 0): [seg(0, 0, 30_000)]}

    # A gap at the source (records compacted away, or taken by the record path, which writes headers): a new row,
    # then extended again. A gap at the destination only (the record path wrote between): a new row too.
    store.record_segments(lease, [seg(30_005, 30_000, 100)])
    store.record_segments(lease, [seg(30_105, 30_100, 50), seg(30_155, 30_160, 40)])
    store.commit(lease, {("t", 0): 30_205}, segments=[seg(30_195, 30_200, 10)])
    # Another partition and a duplicate the broker dropped without saying where (-1): not stored.
    store.record_segments(lease, [seg(0, 0, 7, partition=1), seg(7, -1, 3, partition=1)])
    assert store.load_segments(unique) == {
        ("t", 0): [seg(0, 0, 30_000), seg(30_005, 30_000, 150), seg(30_155, 30_160, 50)],
        ("t", 1): [seg(0, 0, 7, partition=1)],
    }
    assert store.load_segments(unique, [("t", 1), ("u", 0)]) == {("t", 1): [seg(0, 0, 7, partition=1)]}
    # A commit repeated after its answer was lost changes nothing it stored.
    store.record_segments(lease, [seg(30_155, 30_160, 50)])
    assert len(store.load_segments(unique)[("t", 0)]) == 3

    # Exact translation of single offsets: in a segment, and in a gap (nothing copied there).
    assert store.segment_for(unique, ("t", 0), 29_999) == ("t.copy", 0, 29_999)
    assert store.segment_for(unique, ("t", 0), 30_005) == ("t.copy", 0, 30_000)
    assert store.segment_for(unique, ("t", 0), 30_200) == ("t.copy", 0, 30_205)
    assert store.segment_for(unique, ("t", 0), 30_002) is None
    assert store.segment_for(unique, ("t", 0), 30_205) is None


def test_a_group_resumes_after_the_newest_copy_of_the_records_it_processed(store: Store, unique: str) -> None:
    """What failover translation asks: a group that committed O resumes right after the newest copy of a record below
    O, also when O falls in a gap between segments or a stretch was copied twice (at least once)."""
    store.put_connector(unique, {"name": unique}, 1)
    lease = store.claim_task(unique, 0, "me")
    # Source 0..9 at 0..9, 15..19 (10..14 compacted away) at 10..14; then a restart copied 15..19 again at 15..19.
    store.record_segments(lease, [seg(0, 0, 10), seg(15, 10, 5), seg(15, 15, 5)])
    dest = ("t.copy", 0)
    wanted = [(("t", 0), dest, o) for o in (0, 5, 10, 12, 15, 16, 20, 99)] + [(("t", 1), ("t.copy", 1), 5)]
    assert store.translated_offsets(unique, wanted) == {
        (("t", 0), dest, 5): 5,
        (("t", 0), dest, 10): 10,
        (("t", 0), dest, 12): 10,  # in the gap: 10 holds the copy of 15, the first record at or after 12
        (("t", 0), dest, 15): 10,
        (("t", 0), dest, 16): 16,  # after the second copy of 15
        (("t", 0), dest, 20): 20,
        (("t", 0), dest, 99): 20,
    }


def test_a_fenced_instance_cannot_write_segments_nor_producer_ids(store: Store, unique: str) -> None:
    store.put_connector(unique, {"name": unique}, 1)
    old = store.claim_task(unique, 0, "old")
    store.commit(old, {("t", 0): 10}, segments=[seg(0, 0, 10)])
    new = store.claim_task(unique, 0, "new")

    with pytest.raises(FencedError):
        store.commit(old, {("t", 0): 20}, segments=[seg(10, 10, 10)])
    with pytest.raises(FencedError):
        store.record_segments(old, [seg(10, 10, 10)])
    with pytest.raises(FencedError):
        store.record_producer_id(old, "cluster-b", 4711)
    assert store.load_segments(unique) == {("t", 0): [seg(0, 0, 10)]}
    assert store.load_offsets(unique) == {("t", 0): 10}
    assert 4711 not in store.platform_producer_ids("cluster-b")

    store.commit(new, {("t", 0): 20}, segments=[seg(10, 10, 10)])
    assert (store.load_segments(unique), store.load_offsets(unique)) == ({("t", 0): [seg(0, 0, 20)]}, {("t", 0): 20})


def test_producer_ids_are_kept_per_cluster_for_every_connector(store: Store, unique: str) -> None:
    a, b = f"{unique}-a", f"{unique}-b"  # cluster ids of this test's own
    forward, backward = f"{unique}-ab", f"{unique}-ba"
    for name in (forward, backward):
        store.put_connector(name, {"name": name}, 2)
    ab0, ab1 = store.claim_task(forward, 0, "me"), store.claim_task(forward, 1, "me")
    ba0 = store.claim_task(backward, 0, "me")
    store.record_producer_id(ab0, b, 1000)
    store.record_producer_id(ab1, b, 1001)
    store.record_producer_id(ab0, b, 1000)  # again: once per cluster
    store.record_producer_id(ba0, a, 1000)  # the same number at another cluster is another producer
    store.record_producer_id(ba0, a, 2000)

    assert store.platform_producer_ids(b) == {1000, 1001}
    assert store.platform_producer_ids(a) == {1000, 2000}
    assert store.platform_producer_ids(f"{unique}-c") == set()
