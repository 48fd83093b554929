"""docker-compose.yml, checked offline as `docker compose config` would, and its Dagster instance as Dagster loads it.

No Docker engine runs here: the file is validated against the Compose Specification's JSON schema (shipped in the
check-jsonschema wheel), its internal references are resolved, and everything the run launcher names — network,
volumes, environment variables, the image of the runs — is looked up in it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from dagster._core.instance.config import dagster_instance_config
from dagster._core.launcher import RunLauncher
from dagster._core.run_coordinator import QueuedRunCoordinator
from dagster._serdes.config_class import ConfigurableClassData

from mirus.api.app import ENV_COMMIT
from mirus.api.auth import ApiSettings, Credentials
from mirus_dagster.jobs import replicator
from replicator.configuration.secrets import ENV_ALLOWED_PATHS
from tests.deploy_secrets import assert_documented_references_resolve

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
IMAGE_WORKDIR = "/opt/mirus"  # WORKDIR of deploy/Dockerfile, where the repository is copied
CODE_SERVICE = "mirus-code"


def load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def instance_files() -> tuple[list[str], str]:
    """The files deploy/Dockerfile concatenates into the image's dagster.yaml, and the directory it writes to."""
    dockerfile = DOCKERFILE.read_text().replace("\\\n", " ")
    found = re.search(r"cat ([^>&]+)>\s*(\S+)/dagster\.yaml", dockerfile)
    assert found, "deploy/Dockerfile does not write the instance's dagster.yaml"
    return found.group(1).split(), found.group(2)


def instance_text() -> str:
    """The compose deployment's dagster.yaml, as the image holds it."""
    return "".join((ROOT / name).read_text() for name in instance_files()[0])


@pytest.fixture(scope="module")
def instance() -> dict[str, Any]:
    return yaml.safe_load(instance_text())


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load(COMPOSE)


@pytest.fixture(scope="module")
def launcher(instance: dict[str, Any]) -> dict[str, Any]:
    return instance["run_launcher"]


def schema_check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {key: str(value) for key, value in env.items()}


def strings(node: Any) -> list[str]:
    """Every string value in a parsed YAML document (where compose interpolates)."""
    if isinstance(node, dict):
        return [s for value in node.values() for s in strings(value)]
    if isinstance(node, list):
        return [s for value in node for s in strings(value)]
    return [node] if isinstance(node, str) else []


def option(command: list[str], flag: str) -> str:
    assert flag in command, f"{flag} missing from {command}"
    return command[command.index(flag) + 1]


def test_the_compose_file_follows_the_compose_specification() -> None:
    result = schema_check(COMPOSE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_specification_check_rejects_a_misspelt_service_key(tmp_path: Path, compose: dict[str, Any]) -> None:
    broken = yaml.safe_load(yaml.safe_dump(compose))
    broken["services"][CODE_SERVICE]["enviroment"] = broken["services"][CODE_SERVICE].pop("environment")
    path = tmp_path / "docker-compose.yml"
    path.write_text(yaml.safe_dump(broken))
    result = schema_check(path)
    assert result.returncode != 0 and "enviroment" in result.stdout + result.stderr, result.stdout


def test_every_reference_inside_the_compose_file_resolves(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name, service in services.items():
        if "build" in service:
            assert (ROOT / service["build"]["context"] / service["build"]["dockerfile"]).is_file(), name
        for dependency in service.get("depends_on") or {}:
            assert dependency in services, f"{name} depends on unknown service {dependency}"
        for network in service.get("networks") or []:
            assert network in compose["networks"], f"{name} uses undeclared network {network}"
        for mount in service.get("volumes") or []:
            source = mount.split(":", 1)[0]
            if not source.startswith(("/", ".")):
                assert source in compose["volumes"], f"{name} mounts undeclared volume {source}"
            elif source.startswith("."):
                assert (ROOT / source).exists(), f"{name} mounts {source}, which is not in the repository"
    # Compose interpolation: ${NAME}, ${NAME:-default} or ${NAME-default}; anything else makes compose fail. `$${`
    # is an escaped `${` (a config-provider reference read by the process, not by compose).
    for expression in re.findall(r"(?<!\$)\$\{([^}]*)\}", "\n".join(strings(compose))):
        assert re.fullmatch(r"[A-Z_][A-Z0-9_]*(:?-[^}]*)?", expression), f"bad interpolation ${{{expression}}}"


def test_the_image_instance_is_the_platforms_settings_plus_storage_and_the_run_launcher() -> None:
    # One copy of the run queue and sensor settings (mirus_dagster/dagster.yaml, as `mirus dev` uses them); the
    # deployment adds only what it changes.
    files = instance_files()[0]
    assert files[0] == "mirus_dagster/dagster.yaml"
    parts = [load(ROOT / name) for name in files]
    assert [set(part) for part in parts[1:]] == [{"storage"}, {"run_launcher"}]
    assert not set(parts[0]) & {"storage", "run_launcher"}
    assert yaml.safe_load(instance_text()) == {key: value for part in parts for key, value in part.items()}


def test_the_instance_loads_with_dagsters_own_schemas(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, launcher: dict[str, Any]
) -> None:
    for name in ("DAGSTER_POSTGRES_HOST", "DAGSTER_POSTGRES_USER", "DAGSTER_POSTGRES_PASSWORD", "DAGSTER_POSTGRES_DB"):
        monkeypatch.setenv(name, "x")
    (tmp_path / "dagster.yaml").write_text(instance_text())
    config, _ = dagster_instance_config(str(tmp_path))
    assert config["run_launcher"]["class"] == "DockerRunLauncher"
    # dagster-docker's config schema, and its own checks (e.g. no `image` inside container_kwargs).
    docker = ConfigurableClassData(launcher["module"], launcher["class"], yaml.safe_dump(launcher["config"]))
    assert isinstance(docker.rehydrate(as_type=RunLauncher), RunLauncher)
    coordinator = config["run_coordinator"]
    queue = ConfigurableClassData(coordinator["module"], coordinator["class"], yaml.safe_dump(coordinator["config"]))
    assert isinstance(queue.rehydrate(as_type=QueuedRunCoordinator), QueuedRunCoordinator)


def test_replicator_runs_are_limited_and_leave_room_for_other_runs(instance: dict[str, Any]) -> None:
    queue = instance["run_coordinator"]["config"]
    limits = [lim for lim in queue["tag_concurrency_limits"] if replicator.tags.get(lim["key"]) == lim["value"]]
    assert limits, "no tag concurrency limit matches the replicator job's tags"
    assert all(lim["limit"] < queue["max_concurrent_runs"] for lim in limits)


def test_everything_the_run_launcher_names_exists_in_the_compose_file(
    compose: dict[str, Any], launcher: dict[str, Any]
) -> None:
    config = launcher["config"]
    services = compose["services"]
    # Network: run containers join it by its real name, so it must not carry compose's project prefix.
    networks = [config["network"]] if "network" in config else config["networks"]
    declared = {spec.get("name", key): key for key, spec in compose["networks"].items()}
    for network in networks:
        assert network in declared, f"run containers join network {network}, which compose does not create"
        for part in ("postgres", CODE_SERVICE, "source-kafka", "destination-kafka"):
            assert declared[network] in services[part]["networks"], f"{part} is not on {network}"
    # Named volumes of run containers: declared with that exact name.
    volumes = {spec.get("name", key) if spec else key: key for key, spec in compose["volumes"].items()}
    for mount in config["container_kwargs"].get("volumes", []):
        source = mount.split(":", 1)[0]
        if not source.startswith("/"):
            assert source in volumes and (compose["volumes"][volumes[source]] or {}).get("name") == source, mount
    # Environment: the daemon launches runs and reads each variable's value from its own environment; the
    # instance's {env: ...} references are read by the daemon, webserver and code server alike.
    instance_refs = set(re.findall(r"\{\s*env:\s*([A-Z0-9_]+)\s*\}", instance_text()))
    forwarded = {var.split("=", 1)[0] for var in config["env_vars"] if "=" not in var}
    assert instance_refs <= forwarded, "a run container would start without the instance's settings"
    for part in ("dagster-daemon", "dagster-webserver", CODE_SERVICE):
        missing = (forwarded | instance_refs) - set(environment(services[part]))
        assert not missing, f"{part} lacks {sorted(missing)}"
    # Image: runs use the image the code server names, which compose builds from this repository.
    code = services[CODE_SERVICE]
    assert environment(code)["DAGSTER_CURRENT_IMAGE"] == code["image"]
    assert code["build"]["dockerfile"] == str(DOCKERFILE.relative_to(ROOT))
    # The report runs' lake: MIRUS_LAKE_DIR is a volume every run container mounts.
    lake = environment(services[CODE_SERVICE])["MIRUS_LAKE_DIR"]
    assert any(mount.split(":")[1] == lake for mount in config["container_kwargs"]["volumes"])
    # Resource limits of every replicator container.
    assert config["container_kwargs"]["mem_limit"] and config["container_kwargs"]["nano_cpus"] > 0


def test_the_documented_secret_references_resolve_in_the_code_server_and_in_runs(
    compose: dict[str, Any], launcher: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    services = compose["services"]
    daemon = environment(services["dagster-daemon"])
    run = {var: daemon[var] for var in launcher["config"]["env_vars"] if "=" not in var}
    for env in (environment(services[CODE_SERVICE]), environment(services["mirus-api"]), run):
        assert_documented_references_resolve(env, monkeypatch)
    mounts = [m.split(":")[1] for m in launcher["config"]["container_kwargs"]["volumes"]]
    assert run[ENV_ALLOWED_PATHS] in mounts


def test_webserver_and_daemon_load_the_code_server_through_their_workspace(compose: dict[str, Any]) -> None:
    services = compose["services"]
    code_port = option(services[CODE_SERVICE]["command"], "-p")
    locations = set()
    for part in ("dagster-webserver", "dagster-daemon"):
        workspace_path = option(services[part]["command"], "-w")
        workspace = load(ROOT / workspace_path)  # relative to the image's WORKDIR, where the repository is copied
        [entry] = workspace["load_from"]
        server = entry["grpc_server"]
        assert server["host"] == CODE_SERVICE and str(server["port"]) == code_port
        locations.add(server["location_name"])
    # The same location name as `dagster dev` (root workspace.yaml): runs and sensors keep their identity.
    [local] = load(ROOT / "workspace.yaml")["load_from"]
    assert locations == {local["python_module"]["location_name"]}
    assert option(services[CODE_SERVICE]["command"], "-m") == local["python_module"]["module_name"]


def test_the_image_carries_the_instance_and_the_run_launcher(launcher: dict[str, Any]) -> None:
    dockerfile = DOCKERFILE.read_text()
    assert f"WORKDIR {IMAGE_WORKDIR}" in dockerfile
    home = re.search(r"ENV DAGSTER_HOME=(\S+)", dockerfile)
    assert home and instance_files()[1] == home.group(1), "the instance is not written where DAGSTER_HOME points"
    extras = re.search(r"pip install [^\n]*'\.\[([a-z0-9,]+)\]'", dockerfile)
    assert extras, "the image does not install the project with its deployment extras"
    pyproject = (ROOT / "pyproject.toml").read_text()
    provider = launcher["module"].replace("_", "-")
    assert any(re.search(rf'^{extra} = \[[^\]]*"{provider}', pyproject, re.M) for extra in extras.group(1).split(","))


def test_the_image_carries_the_commit_it_was_built_from(compose: dict[str, Any]) -> None:
    # The build context leaves `.git` out: the commit reaches the API's `GET /` as a build argument kept in the
    # environment variable the API reads (test_api_contract: `GET /` answers it).
    dockerfile = DOCKERFILE.read_text()
    assert re.search(rf"^ARG {ENV_COMMIT}=?$", dockerfile, re.M), f"deploy/Dockerfile declares no {ENV_COMMIT}"
    kept = rf"^ENV {ENV_COMMIT}=\$(\{{{ENV_COMMIT}\}}|{ENV_COMMIT})$"
    assert re.search(kept, dockerfile, re.M), f"deploy/Dockerfile does not keep {ENV_COMMIT} in the image"
    builds = {name: service["build"] for name, service in compose["services"].items() if "build" in service}
    assert builds and all(b["args"][ENV_COMMIT] == f"${{{ENV_COMMIT}:-}}" for b in builds.values()), builds


def test_the_api_and_the_ui_are_published(compose: dict[str, Any]) -> None:
    published = {
        port.split(":")[-1]: name for name, service in compose["services"].items() for port in service.get("ports", [])
    }
    assert published.get("3000") == "dagster-webserver"
    assert published.get("8083") == "mirus-api"
    assert option(compose["services"]["mirus-api"]["command"], "--port") == "8083"


def test_the_api_is_published_on_loopback_with_a_generated_or_given_token(
    compose: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api, token_service = compose["services"]["mirus-api"], compose["services"]["mirus-api-token"]
    assert api["ports"] == ["${MIRUS_API_PUBLISH_ADDRESS:-127.0.0.1}:8083:8083"]
    assert api["depends_on"]["mirus-api-token"] == {"condition": "service_completed_successfully"}
    # The token service's script, run against a directory here: generated once, kept, or the given one.
    mount = next(v for v in token_service["volumes"] if v.startswith("mirus-api-token:")).split(":")[1]
    script = token_service["command"][2].replace(mount, str(tmp_path))
    monkeypatch.delenv("MIRUS_API_TOKEN", raising=False)
    subprocess.run([sys.executable, "-c", script], check=True)
    generated = (tmp_path / "token").read_text()
    subprocess.run([sys.executable, "-c", script], check=True)
    assert (tmp_path / "token").read_text() == generated and len(generated) >= 32
    # The API reads it through its reference (compose's `$$` is a literal `$`) and listens beyond loopback.
    reference = api["environment"]["MIRUS_API_BEARER_TOKEN"].replace("$$", "$").replace(mount, str(tmp_path))
    credentials = Credentials(ApiSettings(host="0.0.0.0", bearer_token=reference))
    assert credentials.accepts(f"Bearer {generated}") and not credentials.accepts("Bearer guess")
    monkeypatch.setenv("MIRUS_API_TOKEN", "given-token")
    subprocess.run([sys.executable, "-c", script], check=True)
    assert Credentials(ApiSettings(host="0.0.0.0", bearer_token=reference)).accepts("Bearer given-token")
