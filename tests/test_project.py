"""The project as a whole: lint-clean, type-checked, its Dagster code location loads, and tests/ mirrors the packages
(a directory of tests per package, its helpers in tests/fixtures/)."""

from __future__ import annotations

import ast
import re
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


ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
# Names the map gives that are not the project's: Kafka Connect's and Dagster's.
OTHER_PROJECTS_NAMES = {"WorkerSourceTask", "K8sRunLauncher"}


def test_the_architecture_map_is_short_and_every_part_it_names_is_where_it_says() -> None:
    text = ARCHITECTURE.read_text()
    assert len(text.splitlines()) <= 300, "the map stays short: figures belong in benchmarks/README.md"
    sources = [p for p in ROOT.rglob("*.py") if ".venv" not in p.parts and "build" not in p.parts]
    files = {p.relative_to(ROOT).as_posix() for p in sources} | {
        p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*.yaml") if ".venv" not in p.parts
    }
    named = set(re.findall(r"`([\w/]+\.(?:py|yaml))`", text))
    missing = sorted(path for path in named if not any(f == path or f.endswith("/" + path) for f in files))
    assert not missing, f"files the map names that do not exist: {missing}"
    code = "\n".join(p.read_text() for p in sources)
    defined = set(re.findall(r"^\s*(?:class|def) (\w+)", code, re.MULTILINE)) | set(
        re.findall(r"^\s*([A-Z][A-Z0-9_]+)\s*[:=]", code, re.MULTILINE)
    )
    # Classes (CamelCase) and the methods named on them (`Store.commit`).
    named_code = re.findall(r"`([A-Z][a-z0-9]+[A-Z]\w*|[A-Z]\w*\.\w+)`", text)
    parts = {name.split(".")[-1] for name in named_code}
    unknown = sorted(parts - defined - OTHER_PROJECTS_NAMES)
    assert not unknown, f"classes and functions the map names that the code does not define: {unknown}"


PRODUCT_PACKAGES = ["replicator", "reports", "mirus_dagster", "assets", "sensors", "mirus"]


def test_no_product_file_is_over_500_lines_nor_a_class_over_300() -> None:
    # Rooms sized by what they hold: a larger one says why in its docstring ("sized: ...").
    too_large = []
    for package in PRODUCT_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            source = path.read_text()
            tree = ast.parse(source)
            if len(source.splitlines()) > 500 and "sized:" not in (ast.get_docstring(tree) or ""):
                too_large.append(f"{path.relative_to(ROOT)}: {len(source.splitlines())} lines")
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                    length = node.end_lineno - node.lineno + 1
                    if length > 300 and "sized:" not in (ast.get_docstring(node) or ""):
                        too_large.append(f"{path.relative_to(ROOT)}: class {node.name}, {length} lines")
    assert not too_large, too_large


TESTS = ROOT / "tests"
# Each directory of tests/ and the product code it tests: the engine's rooms and the surfaces a directory each, the
# Dagster wiring and its parts, the reports, the deployment's files. `replicator` and `mirus` hold the tests of those
# packages' root modules, which no room or surface owns.
MIRROR = {
    "replicator": ("replicator/assignment.py", "replicator/clusters.py", "replicator/partition_reader.py"),
    "topics": ("replicator/topics",),
    "state": ("replicator/state",),
    "configuration": ("replicator/configuration",),
    "batches": ("replicator/batches",),
    "engine": ("replicator/engine",),
    "discovery": ("replicator/discovery",),
    "tools": ("replicator/tools",),
    "reports": ("reports",),
    "mirus_dagster": ("mirus_dagster",),
    "assets": ("assets",),
    "sensors": ("sensors",),
    "mirus": ("mirus/waiting.py",),
    "api": ("mirus/api",),
    "cli": ("mirus/cli",),
    "local": ("mirus/local",),
    "faults": ("mirus/faults",),
    "deploy": ("deploy", "docker-compose.yml", "docker-compose.override.yml", "workspace.yaml"),
}
FIXTURES, DATA = "fixtures", "data"  # the helpers (and only they); vendored files (no Python)
# The tests of the project as a whole, at the root of tests/.
WHOLE = {"test_layers.py", "test_project.py"}
# Test modules that import another test module for its helpers, and why. Helpers belong in tests/fixtures/.
BORROWED = {
    "tests/state/test_pgbouncer.py": (
        {"tests.engine.test_ownership", "tests.engine.test_workers"},
        "reruns two scenarios of the engine's tests through PgBouncer; they move to tests/fixtures/ once tests/engine/ "
        "is free (issue 46)",
    ),
}


def test_each_test_directory_mirrors_a_package_and_every_package_has_one() -> None:
    directories = {p.name for p in TESTS.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert directories == {*MIRROR, FIXTURES, DATA}, "a new directory of tests/: place it in MIRROR"
    assert not [path for paths in MIRROR.values() for path in paths if not (ROOT / path).exists()]
    # Every room, surface, module at a package's root and package without rooms has the directory of its tests.
    covered = {path for paths in MIRROR.values() for path in paths}
    parts = {
        part.relative_to(ROOT).as_posix()
        for package in PRODUCT_PACKAGES
        for part in (ROOT / package).iterdir()
        if (part.suffix == ".py" and part.name != "__init__.py") or (part.is_dir() and any(part.glob("*.py")))
    }
    unmirrored = {part for part in parts if not any(part == c or part.startswith(c + "/") for c in covered)}
    assert not unmirrored, f"product code whose tests have no directory of tests/: {sorted(unmirrored)}"


def test_test_modules_live_in_their_packages_directory_and_helpers_in_fixtures() -> None:
    assert {p.name for p in TESTS.glob("*.py")} == {"__init__.py", "conftest.py", *WHOLE}
    misplaced = []
    for directory in (*MIRROR, FIXTURES):
        if not (TESTS / directory / "__init__.py").exists():  # a package: tests.assets.test_lake ≠ tests.reports.…
            misplaced.append(f"{directory}/ has no __init__.py")
        misplaced += [
            f"{p.relative_to(TESTS)}: a directory"
            for p in (TESTS / directory).iterdir()
            if p.is_dir() and p.name != "__pycache__"
        ]
        for module in (TESTS / directory).glob("*.py"):
            test = module.name.startswith("test_") or module.name == "conftest.py"
            if directory == FIXTURES and test:
                misplaced.append(f"{module.relative_to(TESTS)}: a test module among the helpers")
            elif directory != FIXTURES and not test and module.name != "__init__.py":
                misplaced.append(f"{module.relative_to(TESTS)}: a helper outside tests/fixtures/")
    assert not list((TESTS / DATA).rglob("*.py")), "tests/data/ holds vendored files, no Python"
    assert not misplaced, misplaced


def test_tests_take_their_helpers_from_fixtures_only() -> None:
    borrowed: dict[str, set[str]] = {}
    for path in sorted(TESTS.rglob("*.py")):
        imported: set[str] = set()  # modules, dotted
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module == "tests":
                imported.update(f"tests.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
        others = {m for m in imported if m.startswith("tests.") and not m.startswith(f"tests.{FIXTURES}")}
        if others:
            borrowed[path.relative_to(ROOT).as_posix()] = others
    assert borrowed == {module: names for module, (names, _why) in BORROWED.items()}
