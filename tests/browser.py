"""Headless Chromium for the browser tests, installed from Debian's packages when the machine lacks it.

Not a test module. `ensure_chromium()` is called by a session fixture: on a fresh machine or in CI it runs
`apt-get update` and `apt-get install chromium chromium-driver` (as root, or through sudo), and raises with apt's
output when that is impossible: a browser test never skips silently. `start_chromium()` returns a selenium
driver on Debian's own chromedriver, so selenium never tries to download a driver or a browser.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tests.debian import ensure_debian_packages

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
DEBIAN_PACKAGES = ("chromium", "chromium-driver")
# Root needs --no-sandbox; the rest keeps Chromium from reaching out to the network at start (there is none).
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1600,1000",
)


class BrowserSetupError(RuntimeError):
    """Chromium could not be started; the message says what it printed."""


def ensure_chromium() -> None:
    """Install Debian's chromium and chromium-driver unless both are there."""
    ensure_debian_packages(DEBIAN_PACKAGES, (CHROMIUM, CHROMEDRIVER))


@dataclass
class Browser:
    """A headless Chromium driven by selenium, with its own empty profile directory."""

    driver: WebDriver
    profile: Path

    def quit(self) -> None:
        self.driver.quit()
        shutil.rmtree(self.profile, ignore_errors=True)


def start_chromium() -> Browser:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = Path(tempfile.mkdtemp(prefix="chromium-profile-"))
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    try:
        driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    except Exception as exc:
        shutil.rmtree(profile, ignore_errors=True)
        raise BrowserSetupError(f"headless Chromium did not start: {exc}") from exc
    return Browser(driver, profile)
