"""Headless Chromium for the browser tests, installed from Debian's packages when the machine lacks it.

Not a test module. `ensure_chromium()` is called by a session fixture: on a fresh machine or in CI it runs
`apt-get update` and `apt-get install chromium chromium-driver` (as root, or through sudo), and raises with apt's
output when that is impossible: a browser test never skips silently. `start_chromium()` returns a selenium
driver on Debian's own chromedriver, so selenium never tries to download a driver or a browser.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
DEBIAN_PACKAGES = ("chromium", "chromium-driver")
INSTALL_TIMEOUT_S = 900
# Root needs --no-sandbox; the rest keeps Chromium from reaching out to the network at start (there is none).
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--window-size=1600,1000",
)  # fmt: skip


class BrowserSetupError(RuntimeError):
    """Chromium could not be installed or started; the message says what was tried and what it printed."""


def _apt_prefix() -> list[str]:
    if os.geteuid() == 0:
        return []
    if shutil.which("sudo"):
        return ["sudo", "-n"]
    raise BrowserSetupError(
        f"{CHROMIUM} is missing and this user cannot install it: run "
        f"`apt-get install {' '.join(DEBIAN_PACKAGES)}` as root once, then rerun the tests"
    )


def ensure_chromium() -> None:
    """Install Debian's chromium and chromium-driver unless both are there."""
    if CHROMIUM.exists() and CHROMEDRIVER.exists():
        return
    if not shutil.which("apt-get"):
        raise BrowserSetupError(f"{CHROMIUM} is missing and there is no apt-get to install {DEBIAN_PACKAGES}")
    prefix = _apt_prefix()
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (
        [*prefix, "apt-get", "update", "-q"],
        [*prefix, "apt-get", "install", "-y", "-q", "--no-install-recommends", *DEBIAN_PACKAGES],
    ):
        result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False)
        if result.returncode != 0:
            raise BrowserSetupError(
                f"`{' '.join(argv)}` exited with {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
            )
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        raise BrowserSetupError(f"apt-get installed {DEBIAN_PACKAGES} but {CHROMIUM} or {CHROMEDRIVER} is missing")


@dataclass
class Browser:
    """A headless Chromium driven by selenium, with its own empty profile directory."""

    driver: object
    profile: Path

    def quit(self) -> None:
        self.driver.quit()  # type: ignore[attr-defined]
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
