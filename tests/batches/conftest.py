"""Fixtures of the batch path's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mirus_dagster.settings import StackEndpoints
from replicator.batches.wire import KafkaWire


@pytest.fixture
def wires(apache_kafka: StackEndpoints) -> Iterator[tuple[KafkaWire, KafkaWire]]:
    """Raw clients of the suite's Apache Kafka source and destination clusters."""
    with (
        KafkaWire({"bootstrap.servers": apache_kafka.source_bootstrap_servers}, fetch_max_bytes=8_000_000) as source,
        KafkaWire({"bootstrap.servers": apache_kafka.destination_bootstrap_servers}, fetch_max_bytes=8_000_000) as dest,
    ):
        yield source, dest
