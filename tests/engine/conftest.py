"""Fixtures of the engine's tests."""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from mirus.faults.brokers import BrokerProcess, tansu_broker
from mirus.local.stack import free_port
from mirus_dagster.settings import StackEndpoints
from replicator.state.store import Store
from tests.fixtures.engine_helpers import private_database


@pytest.fixture
def destination_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A destination cluster of this test's own, to hang (SIGSTOP) or take down without touching the suite's."""
    broker = tansu_broker("destination-own", port := free_port(), port, tmp_path / "tansu.log")
    broker.start()
    try:
        yield broker
    finally:
        if broker.proc is not None:
            broker.proc.send_signal(signal.SIGCONT)
        broker.stop(signal.SIGKILL)


@pytest.fixture
def estate_db(stack: StackEndpoints) -> Iterator[tuple[Store, str]]:
    """A database of its own: the workers host every running connector they find, and other tests' are not theirs."""
    engine = private_database(stack, f"workers_{uuid.uuid4().hex[:8]}")
    yield Store(engine), engine.url.render_as_string(hide_password=False)
    engine.dispose()
