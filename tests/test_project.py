"""The project as a whole: lint-clean, type-checked, and its Dagster code location loads."""

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
