"""Fixtures of the engine's tests."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from mirus.faults.brokers import BrokerProcess, tansu_broker
from mirus.local.stack import free_port


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
