"""The project as a whole: lint-clean, type-checked, and its Dagster code location loads."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from mypy.main import define_options
from mypy.options import PER_MODULE_OPTIONS

ROOT = Path(__file__).resolve().parent.parent
STRICT_MODULES = ["replicator.*", "reports.*"]


def test_code_is_ruff_clean() -> None:
    lint = subprocess.run([sys.executable, "-m", "ruff", "check", str(ROOT)], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    fmt = subprocess.run([sys.executable, "-m", "ruff", "format", "--check", str(ROOT)], capture_output=True, text=True)
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


def test_code_type_checks() -> None:
    # What is checked and how strictly is pyproject.toml's [tool.mypy]: the engine and the reports strictly.
    check = subprocess.run([sys.executable, "-m", "mypy"], capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_strict_packages_get_every_flag_of_strict_mode() -> None:
    # `strict = true` only works globally, so the override spells its flags out: all of them, as this mypy has them.
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    override = next(o for o in config["overrides"] if o["module"] == STRICT_MODULES)
    _, _, strict_flags = define_options()
    per_module = {flag: value for flag, value in strict_flags if flag in PER_MODULE_OPTIONS}
    assert {flag: override.get(flag) for flag in per_module} == per_module
    global_only = {flag: value for flag, value in strict_flags if flag not in PER_MODULE_OPTIONS}
    assert {flag: config.get(flag) for flag in global_only} == global_only


def test_dagster_definitions_validate_from_the_workspace() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "dagster", "definitions", "validate", "-w", str(ROOT / "workspace.yaml")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
