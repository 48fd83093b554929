"""The connection side of the batch path (`replicator/batches/wire.py`): librdkafka settings carried over to
kafka-python, a secured cluster reached with them (SASL_SSL, SCRAM, the kit's CA), and broker errors returned as
data per partition."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mirus.faults.brokers import KafkaKit
from mirus.faults.kit_security import KitSecurity
from mirus.local.stack import free_port
from mirus_dagster.settings import StackEndpoints
from replicator.batches.copier import BatchCopier, Segment
from replicator.batches.record_batch import rewrite, split
from replicator.batches.wire import (
    VIEW_AT_LEAST,
    KafkaWire,
    Partition,
    Problem,
    Produced,
    UnsupportedSettingError,
    connection_settings,
)
from tests.fixtures.kafka_helpers import consume_all, create_topics, produce


def test_librdkafka_connection_settings_become_kafka_pythons() -> None:
    settings = {
        "bootstrap.servers": "a:9093,b:9093",
        "security.protocol": "sasl_ssl",
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": "replicator",
        "sasl.password": "secret",
        "ssl.ca.location": "/etc/ca.pem",
        "ssl.endpoint.identification.algorithm": "none",
        "linger.ms": "5",  # a client's tuning: no concern of a connection
    }
    assert connection_settings(settings) == {
        "bootstrap_servers": "a:9093,b:9093",
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "replicator",
        "sasl_plain_password": "secret",
        "ssl_cafile": "/etc/ca.pem",
        "ssl_check_hostname": False,
    }
    # A security setting without a counterpart is refused, never dropped (a PKCS12 keystore: PEM files only).
    with pytest.raises(UnsupportedSettingError, match=r"ssl\.keystore\.location, ssl\.keystore\.password"):
        connection_settings({**settings, "ssl.keystore.location": "/x.p12", "ssl.keystore.password": "p"})


def test_broker_errors_come_back_per_partition(apache_kafka: StackEndpoints, unique: str) -> None:
    bootstrap = apache_kafka.source_bootstrap_servers
    create_topics(bootstrap, {unique: 1})
    produce(bootstrap, [{"topic": unique, "value": b"v"}])
    with KafkaWire({"bootstrap.servers": bootstrap}, fetch_max_bytes=1_000_000) as wire:
        fetched = wire.fetch({Partition(unique, 0): 5, Partition(unique, 3): 0, Partition(f"{unique}-none", 0): 0})
        assert {p: f.problem and f.problem.name for p, f in fetched.items()} == {
            Partition(unique, 0): "OFFSET_OUT_OF_RANGE",
            Partition(unique, 3): "UNKNOWN_TOPIC_OR_PARTITION",
            Partition(f"{unique}-none", 0): "UNKNOWN_TOPIC_OR_PARTITION",  # and not created by asking
        }
        (batch,), _ = split(wire.fetch({Partition(unique, 0): 0})[Partition(unique, 0)].records)
        plain = rewrite(batch, producer_id=-1, producer_epoch=-1, base_sequence=-1)  # no producer: no dedup
        produced = wire.produce({Partition(unique, 0): [plain], Partition(f"{unique}-none", 0): [plain]})
        assert produced == {
            Partition(unique, 0): [Produced(None, 1)],
            Partition(f"{unique}-none", 0): [Produced(Problem(3, "UNKNOWN_TOPIC_OR_PARTITION", True))],
        }
        assert set(wire.fetch({Partition(f"{unique}-none", 0): 0})) == {Partition(f"{unique}-none", 0)}


def test_a_fetch_larger_than_a_view_is_read_with_the_same_bytes_as_small_ones(
    apache_kafka: StackEndpoints, unique: str
) -> None:
    """A response frame of VIEW_AT_LEAST or more is decoded from a view of itself, a smaller one from a copy: both
    give the partition's batches byte for byte."""
    bootstrap = apache_kafka.source_bootstrap_servers
    create_topics(bootstrap, {unique: 1})
    produce(bootstrap, [{"topic": unique, "key": b"%d" % i, "value": bytes([i % 251]) * 1000} for i in range(3000)])
    partition = Partition(unique, 0)
    with KafkaWire({"bootstrap.servers": bootstrap}, fetch_max_bytes=8_000_000) as wire:
        large = wire.fetch({partition: 0}, partition_max_bytes=8_000_000)[partition].records
        assert len(large) > VIEW_AT_LEAST
        small, position = [], 0
        while position < 3000:
            batches, _ = split(wire.fetch({partition: position}, partition_max_bytes=100_000)[partition].records)
            small += [bytes(b.data) for b in batches]
            position = batches[-1].next_offset
    batches, end = split(large)
    assert end == len(large)
    assert [bytes(b.data) for b in batches] == small
    assert sum(b.records_count for b in batches) == 3000


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, KitSecurity]]:
    """One secured Apache Kafka 1.0 cluster (SASL_SSL only, SCRAM, a CA of its own, ACLs enforced)."""
    kit = KafkaKit(tmp_path_factory.mktemp("secured-batches"), free_port())
    try:
        security = kit.start_secured(("secured",))
        yield kit.brokers[0].bootstrap, security
    finally:
        kit.stop()


def test_batches_copied_over_sasl_ssl_with_librdkafka_settings(secured: tuple[str, KitSecurity], unique: str) -> None:
    bootstrap, security = secured
    settings = {**security.client_settings("admin", "SCRAM-SHA-512"), "bootstrap.servers": bootstrap}
    copied = f"{unique}-copy"
    create_topics(settings, {unique: 1, copied: 1})
    produce(settings, [{"topic": unique, "key": b"k%d" % i, "value": b"v%d" % i} for i in range(50)])
    with KafkaWire(settings, fetch_max_bytes=1_000_000) as wire:
        copier = BatchCopier(wire, wire)
        copier.start(Partition(unique, 0), 0, copied, 1_000_012)
        assert copier.step().segments == {Partition(unique, 0): [Segment(0, 0, 50)]}
    assert [(r.key, r.value) for r in consume_all(settings, copied, 1, 50)] == [
        (b"k%d" % i, b"v%d" % i) for i in range(50)
    ]
