"""mirus.waiting.wait_until: the condition's value once truthy, else a TimeoutError saying what was awaited."""

from __future__ import annotations

import time

import pytest

from mirus.waiting import wait_until


def test_returns_the_conditions_first_truthy_value() -> None:
    answers = iter([None, 0, "", "ready", "later"])
    assert wait_until(lambda: next(answers), timeout=5, interval=0.01) == "ready"


def test_times_out_saying_what_was_awaited_after_trying_past_the_deadline() -> None:
    calls: list[float] = []
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"^timed out after 0.2s waiting for the answer$"):
        wait_until(lambda: calls.append(time.monotonic()), timeout=0.2, interval=0.05, what="the answer")
    assert calls[-1] - started > 0.2 and len(calls) >= 3


def test_an_error_of_the_condition_ends_the_wait() -> None:
    def broken() -> bool:
        raise ValueError("gone")

    with pytest.raises(ValueError, match="gone"):
        wait_until(broken, timeout=5)
