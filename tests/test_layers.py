"""Imports run one way: Dagster layer → engine; within the Dagster layer, only the code location assembles
`sensors/` and `assets/`. Read from the source (ast), so a new import that breaks the rule fails here."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("mirus_dagster", "sensors", "assets", "replicator")


def imported_packages(path: Path) -> set[str]:
    """Top-level names of every module `path` imports (anywhere in the file, lazily imported ones included)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def modules(*packages: str) -> dict[str, set[str]]:
    return {
        str(path.relative_to(ROOT)): imported_packages(path)
        for package in packages
        for path in sorted((ROOT / package).rglob("*.py"))
    }


def test_only_the_code_location_imports_sensors_and_assets() -> None:
    importers = {
        module
        for module, imported in modules(*PACKAGES, "benchmarks").items()
        if {"sensors", "assets"} & imported and not module.startswith(("sensors/", "assets/"))
    }
    assert importers == {"mirus_dagster/definitions.py"}


def test_sensors_and_assets_never_import_each_other() -> None:
    assert not [m for m, imported in modules("sensors").items() if "assets" in imported]
    assert not [m for m, imported in modules("assets").items() if "sensors" in imported]


def test_the_engine_imports_no_dagster_layer() -> None:
    assert {m: i & {"dagster", "mirus_dagster", "sensors", "assets"} for m, i in modules("replicator").items()} == {
        m: set() for m in modules("replicator")
    }


def test_product_code_and_benchmarks_never_import_tests() -> None:
    assert not [m for m, imported in modules(*PACKAGES, "benchmarks").items() if "tests" in imported]
