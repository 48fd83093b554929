"""Debian packages some tests need, installed with apt-get when the machine lacks them.

Not a test module. `ensure_debian_packages` runs `apt-get update` and `apt-get install` (as root, or through sudo)
unless every file the caller needs is there, and raises with apt's output when that is impossible: a test that
needs a package never skips silently.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

INSTALL_TIMEOUT_S = 900


class DebianPackageError(RuntimeError):
    """Packages could not be installed; the message says what was tried and what it printed."""


def _apt_prefix(packages: Sequence[str]) -> list[str]:
    if os.geteuid() == 0:
        return []
    if shutil.which("sudo"):
        return ["sudo", "-n"]
    raise DebianPackageError(
        f"this user cannot install {' '.join(packages)}: run `apt-get install {' '.join(packages)}` as root once, "
        "then rerun the tests"
    )


def ensure_debian_packages(packages: Sequence[str], files: Sequence[Path]) -> None:
    """Install Debian's `packages` unless all of `files` (what the caller runs from them) exist."""
    if all(path.exists() for path in files):
        return
    missing = [str(path) for path in files if not path.exists()]
    if not shutil.which("apt-get"):
        raise DebianPackageError(f"{missing} missing and there is no apt-get to install {list(packages)}")
    prefix = _apt_prefix(packages)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (
        [*prefix, "apt-get", "update", "-q"],
        [*prefix, "apt-get", "install", "-y", "-q", "--no-install-recommends", *packages],
    ):
        result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False)
        if result.returncode != 0:
            raise DebianPackageError(
                f"`{' '.join(argv)}` exited with {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
            )
    if not all(path.exists() for path in files):
        raise DebianPackageError(f"apt-get installed {list(packages)} but {missing} still missing")
