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
SUBJECTS_RULE_FROM = "e8ec9ca"


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


def test_commit_subjects_fit_72_characters() -> None:
    # Subjects are read in one-line logs and in GitHub's lists; the rest of a message goes in its body. The rule
    # holds from SUBJECTS_RULE_FROM on (older subjects ran long); a clone with that history is needed.
    log = subprocess.run(
        ["git", "log", "--format=%h %s", f"{SUBJECTS_RULE_FROM}..HEAD"], capture_output=True, text=True, cwd=ROOT
    )
    assert log.returncode == 0, f"the history since {SUBJECTS_RULE_FROM} is needed: {log.stderr}"
    long = [line for line in log.stdout.splitlines() if len(line.partition(" ")[2]) > 72]
    assert not long, "subjects over 72 characters (put the rest in the body):\n" + "\n".join(long)


def test_the_benchmarks_page_holds_each_benchmarks_current_figures_not_its_history() -> None:
    """benchmarks/README.md: the latest figures of each benchmark beside its anchor; earlier runs live in git."""
    lines = (ROOT / "benchmarks" / "README.md").read_text().splitlines()
    assert len(lines) <= 600, f"benchmarks/README.md: {len(lines)} lines; keep the current figures, history is in git"


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


def test_the_maps_links_into_the_benchmarks_name_their_sections() -> None:
    headings = re.findall(r"^#+ (.+)$", (ROOT / "benchmarks" / "README.md").read_text(), re.MULTILINE)
    # The anchors GitHub gives headings: lower case, punctuation dropped, spaces as hyphens.
    anchors = {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}
    linked = set(re.findall(r"benchmarks/README\.md#([\w-]+)", ARCHITECTURE.read_text()))
    assert linked, "the map links its figures to the benchmarks' sections"
    assert not linked - anchors, (
        f"sections of benchmarks/README.md the map links to that it does not have: {linked - anchors}"
    )


def _seconds(value: float) -> str:
    return f"{value:g} s"


def _times_a_second(interval_s: float) -> str:
    return {1: "once", 2: "twice", 5: "five times"}[round(1 / interval_s)] + " a second"


def _property_default(name: str) -> int:
    from replicator.configuration.properties import PROPERTIES

    return int(str(next(spec.default for spec in PROPERTIES if spec.name == name)))


def quoted_figures() -> dict[str, str]:
    """Every figure the map quotes about the code, as the phrase the map must hold when rendered from the code."""
    import inspect

    import yaml
    from dagster._daemon.sensor import MIN_INTERVAL_LOOP_TIME

    from mirus_dagster.report_schedule import DEFAULT_REPORT_CRON
    from replicator.discovery.watcher import WATCH_INTERVAL_S
    from replicator.engine.deliveries import MAX_BLOCK_S
    from replicator.engine.destinations import DESTINATION_CHECK_PARTITIONS
    from replicator.engine.partitions import RETRY_BACKOFF_S
    from replicator.engine.task import ReplicationTask
    from replicator.engine.worker import POLL_S, STANDBY_POLL_S

    dagster_yaml = yaml.safe_load((ROOT / "mirus_dagster" / "dagster.yaml").read_text())["run_coordinator"]["config"]
    slots = dagster_yaml["max_concurrent_runs"]
    replicator_slots = next(t["limit"] for t in dagster_yaml["tag_concurrency_limits"] if t["value"] == "replicator")
    metrics_s = inspect.signature(ReplicationTask.__init__).parameters["metrics_interval_s"].default
    standbys = _property_default("task.standby.runs")
    return {
        "never longer than `MAX_BLOCK_S` ({})": _seconds(MAX_BLOCK_S),
        "every `offset.flush.interval.ms` ({}):": _seconds(_property_default("offset.flush.interval.ms") / 1000),
        "`DESTINATION_CHECK_INTERVAL_S` per {} partitions": f"{DESTINATION_CHECK_PARTITIONS:,}",
        "every {} `TaskMetrics` writes": _seconds(metrics_s),
        "(`RETRY_BACKOFF_S`, {};": f"{_seconds(RETRY_BACKOFF_S[0])} … {_seconds(RETRY_BACKOFF_S[-1])}",
        "`commit.failure.restart.ms` ({} min)": f"{_property_default('commit.failure.restart.ms') / 60_000:g}",
        "`task.standby.runs` (default {}) standbys": str(standbys),
        "(`task.standby.runs`, default {})": str(standbys),
        "(`HeadNotices`), else {};": _times_a_second(POLL_S),
        "(a statement {})": _times_a_second(STANDBY_POLL_S),
        "a takeover up to {} later": _seconds(STANDBY_POLL_S),
        "reads each distinct cluster {} with one Metadata request": _times_a_second(WATCH_INTERVAL_S),
        "the watcher looks {},": _times_a_second(WATCH_INTERVAL_S),
        "`MIRUS_REPORT_CRON` ({} min)": DEFAULT_REPORT_CRON.split()[0].removeprefix("*/"),
        "keeps {} run slots free of replicator runs": f"{slots - replicator_slots} of {slots}",
        "the sensor daemon evaluates at most every {};": _seconds(MIN_INTERVAL_LOOP_TIME),
    }


# A figure: a number with a unit, or how often something happens.
FIGURE = re.compile(
    r"\b\d[\d,.]* ?(?:ms|s|min|h|KB|MB|MiB|GB|%)(?![\w-])"
    r"|\b(?:once|twice|\w+ times|within) a (?:second|minute)\b"
)


def map_blocks(text: str) -> list[str]:
    """The map's paragraphs, list items and table rows, each on one line."""
    blocks: list[str] = []
    current: list[str] = []
    for line in [*text.splitlines(), ""]:
        starts_block = re.match(r"\s*(?:[-|]|\d+\.)\s", line) is not None
        if (not line.strip() or starts_block) and current:
            blocks.append(" ".join(current))
            current = []
        if line.strip():
            current.append(line.strip())
    return blocks


def test_every_figure_the_architecture_map_quotes_is_the_codes_or_a_benchmarks() -> None:
    # A figure about the code is rendered here from the constant it quotes, so the map cannot drift from it; any other
    # figure stands in a paragraph that links to where it was measured.
    blocks = map_blocks(ARCHITECTURE.read_text())
    phrases = [template.format(value) for template, value in quoted_figures().items()]
    stale = [phrase for phrase in phrases if not any(phrase in block for block in blocks)]
    assert not stale, f"figures the map quotes that differ from the code (or that it no longer quotes): {stale}"
    unchecked = []
    for block in blocks:
        if "benchmarks/README.md" in block:
            continue
        quoted = [(m.start(), m.end()) for phrase in phrases for m in re.finditer(re.escape(phrase), block)]
        for figure in FIGURE.finditer(block):
            if not any(start <= figure.start() and figure.end() <= end for start, end in quoted):
                unchecked.append(f"{figure.group()!r} in: {block[max(0, figure.start() - 60) : figure.end() + 20]}")
    assert not unchecked, "figures the map states that no test checks (add them to quoted_figures): " + "\n".join(
        unchecked
    )


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
