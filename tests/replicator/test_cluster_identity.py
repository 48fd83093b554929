"""Clusters are known by their Kafka cluster id: a bidirectional pair with identity naming and no aliases does not
loop, and provenance headers name the source cluster by id."""

from __future__ import annotations

from mirus.waiting import wait_until
from mirus_dagster.settings import StackEndpoints
from replicator.state.store import Store
from replicator.topics import provenance
from tests.fixtures.engine_helpers import TaskThread, create_connector
from tests.fixtures.kafka_helpers import cluster_id, consume_all, create_topics, produce


def _identity_connector(name: str, source: str, destination: str, topic: str) -> dict[str, str]:
    """MM2 identity naming, no cluster aliases: both connectors get the same default alias pair."""
    return {
        "name": name,
        "source.cluster.bootstrap.servers": source,
        "target.cluster.bootstrap.servers": destination,
        "topics": topic,
        "replication.policy.class": "org.apache.kafka.connect.mirror.IdentityReplicationPolicy",
        "offset.flush.interval.ms": "200",
    }


def test_bidirectional_identity_pair_without_aliases_does_not_loop(
    stack: StackEndpoints, store: Store, unique: str
) -> None:
    a, b = stack.source_bootstrap_servers, stack.destination_bootstrap_servers
    a_id, b_id = cluster_id(a), cluster_id(b)
    assert a_id != b_id
    topic, partitions, per_side = unique, 2, 300
    create_topics(a, {topic: partitions})
    create_topics(b, {topic: partitions})
    a_to_b = create_connector(
        store, _identity_connector(f"{unique}-ab", a, b, topic), {0: [(topic, p) for p in range(partitions)]}
    )
    b_to_a = create_connector(
        store, _identity_connector(f"{unique}-ba", b, a, topic), {0: [(topic, p) for p in range(partitions)]}
    )
    assert a_to_b.source_cluster_alias == b_to_a.source_cluster_alias
    assert a_to_b.target_cluster_alias == b_to_a.target_cluster_alias
    runners = [TaskThread.start(store, a_to_b.name), TaskThread.start(store, b_to_a.name)]
    try:
        produce(a, [{"topic": topic, "partition": i % partitions, "value": b"a-%d" % i} for i in range(per_side)])
        produce(b, [{"topic": topic, "partition": i % partitions, "value": b"b-%d" % i} for i in range(per_side)])
        total = 2 * per_side

        # Both sides hold every record once; then each connector must have read its source to the end (which
        # includes the copies it received from the other side): only then can no further copy be produced.
        for bootstrap in (a, b):
            wait_until(
                lambda bs=bootstrap: len(consume_all(bs, topic, partitions, expected=0, timeout=5)) >= total,
                timeout=60,
                what=f"{total} records on {bootstrap}",
            )

        def read_to_end(connector: str) -> bool:
            committed = store.load_offsets(connector)
            return sum(committed.get((topic, p), 0) for p in range(partitions)) == total

        for connector in (a_to_b.name, b_to_a.name):
            wait_until(lambda c=connector: read_to_end(c), timeout=60, what=f"{connector} committed all {total}")
        # Several more task cycles (a commit, with its lease heartbeat, every 200 ms) with nothing new: flat.
        for _ in range(5):
            beats = {c: store.lease_of(c, 0).heartbeat_at for c in (a_to_b.name, b_to_a.name)}
            for connector, beat in beats.items():
                wait_until(
                    lambda c=connector, b=beat: store.lease_of(c, 0).heartbeat_at > b,
                    timeout=60,
                    what=f"a further commit cycle of {connector}",
                )
                assert read_to_end(connector)
    finally:
        for runner in runners:
            runner.finish()
    for connector in (a_to_b.name, b_to_a.name):
        assert read_to_end(connector), "a connector read records produced after traffic stopped (a loop)"

    on_a = consume_all(a, topic, partitions, expected=total)
    on_b = consume_all(b, topic, partitions, expected=total)
    assert len(on_a) == len(on_b) == total
    assert sorted(r.value for r in on_a) == sorted(r.value for r in on_b)
    # Copies carry the cluster ids: origin = where the record was produced, source = this hop's cluster.
    for records, home, other in ((on_a, a_id, b_id), (on_b, b_id, a_id)):
        copies = [provenance.parse(r.headers) for r in records if provenance.parse(r.headers)]
        assert len(copies) == per_side
        assert {(c.origin_cluster, c.source_cluster) for c in copies} == {(other, other)}
        assert all(r.value.startswith(b"a-" if home == a_id else b"b-") for r in records if not r.headers)
