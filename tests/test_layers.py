"""Imports run one way: surfaces (`mirus/`) → the Dagster wiring (`mirus_dagster/`, with `assets/` and `sensors/`
beside it) → the reports (`reports/`) → the engine (`replicator/`), and inside each the rooms keep their order; only
the code location (`mirus_dagster/definitions.py`) imports `assets/` and `sensors/`. Read from the source (ast), so a
new import that breaks a rule fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import sqlalchemy.exc

ROOT = Path(__file__).resolve().parent.parent
# Top-level packages, lowest first: each imports only those before it (and itself). `assets` and `sensors` are the
# Dagster wiring's parts: they import the wiring's shared modules and are imported by its code location alone.
LAYERS = ("replicator", "reports", "mirus_dagster", "mirus")
PARTS = ("assets", "sensors")
# The engine's rooms, lowest first: each imports only rooms before it (and itself). The shared modules at the
# package's root (assignment, clusters, partition_reader) import none of them.
ROOMS = ("topics", "state", "configuration", "batches", "engine", "discovery", "tools")
SHARED = ("assignment", "clusters", "partition_reader")
# The surfaces, and the other surfaces each may use.
SURFACES = {"api": set(), "local": set(), "faults": {"local"}, "cli": {"api", "local", "faults"}}
# Modules at the root of `mirus/`, which every surface may use; they import no surface.
SURFACE_SHARED = {"waiting"}
ASSEMBLY = {"mirus_dagster.definitions", "mirus_dagster.jobs", "mirus_dagster.report_schedule"}


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
    """Each file of `packages` (a path from the root) and the top-level packages it imports."""
    return {str(path.relative_to(ROOT)): imported_packages(path) for path in files(*packages)}


def dotted(*packages: str) -> dict[str, set[str]]:
    """Each file of `packages` (a path from the root) and the modules it imports, dotted."""
    return {str(path.relative_to(ROOT)): imported_modules(path) for path in files(*packages)}


def files(*packages: str) -> list[Path]:
    return [path for package in packages for path in sorted((ROOT / package).rglob("*.py"))]


def test_each_layer_imports_only_the_layers_below_it() -> None:
    # The parts stand between the wiring and the surfaces; the wiring's code location importing them is the next test's.
    order = ("replicator", "reports", "mirus_dagster", *PARTS, "mirus")
    upward = {}
    for index, layer in enumerate(order):
        above = set(order[index + 1 :]) - ({*PARTS} if layer == "mirus_dagster" else set())
        for module, imported in modules(layer).items():
            if wrong := imported & above:
                upward[module] = wrong
    assert upward == {}


def test_only_the_code_location_imports_sensors_and_assets() -> None:
    parts = ("sensors", "assets")
    importers = {
        module
        for module, imported in dotted(*LAYERS, *PARTS, "benchmarks").items()
        if any(m.split(".")[0] in parts for m in imported) and not module.startswith(("sensors/", "assets/"))
    }
    assert importers == {"mirus_dagster/definitions.py"}


def test_sensors_and_assets_import_neither_each_other_nor_the_assembly() -> None:
    for part, other in (("sensors", "assets"), ("assets", "sensors")):
        for module, imported in dotted(part).items():
            assert not [m for m in imported if m.split(".")[0] == other], module
            assert not [m for m in imported if any(m.startswith(a) for a in ASSEMBLY)], module


def test_each_surface_uses_only_the_surfaces_it_fronts() -> None:
    for surface, allowed in SURFACES.items():
        for module, imported in dotted(f"mirus/{surface}").items():
            used = {m.split(".")[1] for m in imported if m.startswith("mirus.")} - {surface} - SURFACE_SHARED
            assert used <= allowed, (module, used - allowed)
    assert {p.name for p in (ROOT / "mirus").iterdir() if p.is_dir() and p.name[0] != "_"} == set(SURFACES)
    for name in SURFACE_SHARED:
        imported = imported_modules(ROOT / "mirus" / f"{name}.py")
        assert not [m for m in imported if m.startswith("mirus.")], name
    assert {p.stem for p in (ROOT / "mirus").glob("*.py") if p.name[0] != "_"} == SURFACE_SHARED


def test_the_engine_imports_no_dagster_and_no_reports() -> None:
    forbidden = {"dagster", "mirus_dagster", "mirus", "reports", "pyspark", "matplotlib", "pyarrow"}
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
    assert not [m for m, imported in modules(*LAYERS, *PARTS, "benchmarks").items() if "tests" in imported]


# SQL (text, SQLAlchemy statements, an engine's connections and transactions) lives in the store alone; everyone else
# calls its methods. Benchmarks set up their data by hand.
STORE = "replicator/state/"
SQL = re.compile(r"\s*(SELECT|INSERT|UPDATE|DELETE|WITH|CREATE|ALTER|SET)\s")  # uppercase, as SQL is written here
ENGINE_TYPE = {"sqlalchemy.Engine", "sqlalchemy.engine.Engine"}  # what callers hand the store
OPENS = ("connect", "begin")  # on an engine: a connection, a transaction


def sql_of(path: Path) -> list[str]:
    """What of `path` belongs in the store: SQLAlchemy imports other than its exceptions and the Engine type, an
    engine's connect() or begin(), string literals that start as SQL."""
    found = [
        f"imports {name}"
        for name in imported_modules(path)
        if name.split(".")[0] == "sqlalchemy" and name not in ENGINE_TYPE and not is_sqlalchemy_exception(name)
    ]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in OPENS:
            receiver = node.func.value
            name = receiver.id if isinstance(receiver, ast.Name) else getattr(receiver, "attr", "")
            if "engine" in name.lower():
                found.append(f"line {node.lineno}: {ast.unparse(node.func)}()")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and SQL.match(node.value):
            found.append(f"line {node.lineno}: {node.value.strip()[:40]!r}")
    return found


def is_sqlalchemy_exception(name: str) -> bool:
    module, _, attribute = name.rpartition(".")
    raised = getattr(sqlalchemy.exc, attribute, None)
    return module == "sqlalchemy.exc" and isinstance(raised, type) and issubclass(raised, Exception)


def test_only_the_store_holds_sql() -> None:
    outside = [p for p in files(*LAYERS, *PARTS) if not str(p.relative_to(ROOT)).startswith(STORE)]
    found = {str(p.relative_to(ROOT)): sql_of(p) for p in outside}
    assert {m: f for m, f in found.items() if f} == {}
