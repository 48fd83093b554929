"""Imports run one way: Dagster layer → engine; within the Dagster layer, only the code location assembles
`sensors/` and `assets/`. Read from the source (ast), so a new import that breaks the rule fails here."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("mirus_dagster", "sensors", "assets", "replicator", "reports")
# The engine's rooms, lowest first: each imports only rooms before it (and itself). The shared modules at the
# package's root (assignment, clusters, partition_reader) import none of them.
ROOMS = ("topics", "state", "configuration", "engine", "discovery", "tools")
SHARED = ("assignment", "clusters", "partition_reader")


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports (anywhere in the file, lazily imported ones included), dotted."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def imported_packages(path: Path) -> set[str]:
    """Top-level names of every module `path` imports."""
    return {name.split(".")[0] for name in imported_modules(path)}


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


def test_the_engine_imports_no_dagster_layer_and_no_reports() -> None:
    forbidden = {"dagster", "mirus_dagster", "sensors", "assets", "reports", "pyspark", "matplotlib", "pyarrow"}
    assert {m: i & forbidden for m, i in modules("replicator").items()} == {m: set() for m in modules("replicator")}


def test_the_engines_rooms_import_only_rooms_below_them() -> None:
    every = {*ROOMS, *SHARED}
    assert {p.stem if p.is_file() else p.name for p in (ROOT / "replicator").iterdir() if p.name[0] not in "_."} == {
        *ROOMS,
        *(f"{name}" for name in SHARED),
    }, "a new room or shared module: place it in ROOMS or SHARED"
    upward = {}
    for path in sorted((ROOT / "replicator").rglob("*.py")):
        parts = path.relative_to(ROOT / "replicator").parts
        room = parts[0].removesuffix(".py")
        if room == "__init__":
            continue
        allowed = set(SHARED) if room in SHARED else {*SHARED, *ROOMS[: ROOMS.index(room) + 1]}
        rooms = {m.split(".")[1] for m in imported_modules(path) if m.startswith("replicator.")}
        if wrong := (rooms & every) - allowed:
            upward[str(path.relative_to(ROOT))] = wrong
    assert upward == {}


def test_product_code_and_benchmarks_never_import_tests() -> None:
    assert not [m for m, imported in modules(*PACKAGES, "benchmarks").items() if "tests" in imported]
