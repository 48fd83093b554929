"""Fixtures of the local-platform tests: a browser for the Dagster UI."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def chromium() -> None:
    """Debian's headless Chromium and its driver, installed with apt-get on a machine that lacks them. Raises (a
    test error, never a skip) when that is impossible."""
    from tests.fixtures.browser import ensure_chromium

    ensure_chromium()
