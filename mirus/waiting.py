"""The one "poll until a condition holds or time out" helper, shared by the surfaces, the tests and the benchmarks.

A waiter with more to say (a process that died, the last error of a probe) checks it in its condition and raises
there, or turns the `TimeoutError` into its own error."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T | None], timeout: float = 30.0, interval: float = 0.1, what: str = "") -> T:
    """Call `condition` every `interval` seconds until it returns something truthy, and return that. After `timeout`
    seconds raise `TimeoutError` saying what was awaited (`what`, else the condition). The condition is tried at
    least once, and once more after the deadline has passed."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what or condition}")
        time.sleep(interval)
