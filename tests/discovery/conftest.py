"""Fixtures of the discovery tests: the secured clusters."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mirus.faults.brokers import KafkaKit
from mirus.local.stack import free_port


@pytest.fixture(scope="session")
def secured_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaKit]:
    """Two secured Apache Kafka 1.0 clusters (source, destination: `brokers`), as production ones are: SASL_SSL
    only, SCRAM-SHA-256/512, a CA made at the start, ACLs enforced, super user `admin`, user `replicator` without
    ACLs; passwords and CA in `security` (`mirus.faults.kit_security`). Started (~15 s) only by tests that use it."""
    kit = KafkaKit(tmp_path_factory.mktemp("secured-kafka"), free_port())
    try:
        kit.start_secured(("source", "destination"))
        yield kit
    finally:
        kit.stop()
