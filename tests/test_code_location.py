"""The project as a whole: lint-clean, and its Dagster code location loads."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def test_code_is_ruff_clean() -> None:
    lint = subprocess.run([sys.executable, "-m", "ruff", "check", str(ROOT)], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    fmt = subprocess.run([sys.executable, "-m", "ruff", "format", "--check", str(ROOT)], capture_output=True, text=True)
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


def test_dagster_definitions_validate_from_the_workspace() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "dagster", "definitions", "validate", "-w", str(ROOT / "workspace.yaml")],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_docker_compose_services_build_from_the_repository() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"postgres", "source-kafka", "destination-kafka", "dagster-webserver", "dagster-daemon"} <= set(services)
    for service in services.values():
        if "build" in service:
            assert (ROOT / service["build"]["context"] / service["build"]["dockerfile"]).is_file()


def test_the_deployed_dagster_instance_is_the_platforms_plus_postgres_storage() -> None:
    # What deploy/Dockerfile writes to DAGSTER_HOME: one copy of the run queue settings, plus storage.
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    assert "cat mirus_dagster/dagster.yaml deploy/dagster-storage.yaml > /opt/dagster/home/dagster.yaml" in dockerfile
    platform = yaml.safe_load((ROOT / "mirus_dagster" / "dagster.yaml").read_text())
    storage = yaml.safe_load((ROOT / "deploy" / "dagster-storage.yaml").read_text())
    deployed = yaml.safe_load((ROOT / "mirus_dagster" / "dagster.yaml").read_text() + "\n" +
                              (ROOT / "deploy" / "dagster-storage.yaml").read_text())  # fmt: skip
    assert deployed == {**platform, **storage} and set(storage) == {"storage"}
