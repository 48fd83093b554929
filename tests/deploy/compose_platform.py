"""The compose deployment, run for real by the container tests (tests/deploy/test_containers.py). Not a test module.

- `ensure_engine`: the machine's Docker engine through the shared script (`docker-up.sh`: dockerd without bridge
  networking, base images built from Debian's packages) and Debian's docker-compose 1.29; an error saying what to
  run when either cannot be had — never a skip.
- `ComposePlatform`: docker-compose.yml with deploy/compose/host-network.yml, as a user runs it against their own
  clusters and Postgres: the two images built with `docker-compose build`, the platform's services (code server,
  webserver, daemon, API) started with `docker-compose up --no-deps`, their UI, GraphQL and REST API, the run
  containers the daemon starts, and `down()`, which removes every container and volume of the deployment and says
  what is left behind, processes included.

Secrets (the Postgres password, the API's token) reach the processes through the environment and a volume, never
an argument; they are masked in every output an error quotes.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import psutil
import requests

from mirus.local.devserver import RUNS_QUERY, WORKSPACE_QUERY
from mirus.waiting import wait_until
from mirus_dagster.constants import PUT_CONNECTOR_JOB, REPLICATOR_JOB
from tests.debian import DebianPackageError, ensure_debian_packages

log = logging.getLogger(__name__)
T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILES = (ROOT / "docker-compose.yml", ROOT / "deploy" / "compose" / "host-network.yml")
# What the test starts: the platform's own services. The file's Postgres and Kafka services are for users' try-outs.
PLATFORM_SERVICES = ("mirus-api-token", "mirus-code", "dagster-webserver", "dagster-daemon", "mirus-api")
IMAGE_TAG_ENV = "MIRUS_IMAGE_TAG"  # the release every image of the deployment is tagged with (docker-compose.yml)
RUNTIME_REPOSITORY, SPARK_REPOSITORY = "mirus-dagster", "mirus-dagster-spark"
# One service per image: building it builds the image every other service of that image runs.
IMAGE_SERVICES = {RUNTIME_REPOSITORY: "mirus-api", SPARK_REPOSITORY: "mirus-code"}
# Volumes with fixed names (the run launcher mounts them by name), which `down -v` removes whoever made them.
FIXED_VOLUMES = ("mirus-secrets", "mirus-lake")
RUN_LABEL = "app=mirus-run"  # every run container's (deploy/compose/run-launcher.yaml)
DOCKER_UP_ENV = "MIRUS_DOCKER_UP"
# The shared script beside the checkout (what CI has) or beside a folder above it; MIRUS_DOCKER_UP names another.
DOCKER_UP_CANDIDATES = tuple(folder / "shared" / "containers" / "docker-up.sh" for folder in ROOT.parents)
DOCKER_COMPOSE = Path("/usr/bin/docker-compose")
DOCKER_SOCKET = Path("/var/run/docker.sock")
BUILD_TIMEOUT_S = 1800.0  # a first build downloads every package; later ones reuse the layers
START_TIMEOUT_S = 240.0
TERMINATE_MUTATION = """
mutation Terminate($runId: String!) {
  terminateRun(runId: $runId) {
    __typename
    ... on PythonError { message }
    ... on TerminateRunFailure { message }
  }
}
"""
LAUNCH_MUTATION = """
mutation Launch($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
    ... on RunConfigValidationInvalid { errors { message } }
  }
}
"""


class ContainerEngineError(RuntimeError):
    """No Docker engine or docker-compose to be had; the message says what to run."""


def docker_up_script() -> Path:
    if configured := os.environ.get(DOCKER_UP_ENV):
        return Path(configured)
    return next((path for path in DOCKER_UP_CANDIDATES if path.is_file()), DOCKER_UP_CANDIDATES[0])


def engine_answers() -> bool:
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=30, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def ensure_engine() -> bool:
    """A Docker engine answering, and docker-compose 1.29 installed. True if this call started the engine (then the
    caller stops it: `stop_engine`)."""
    script = docker_up_script()
    was_up = engine_answers()
    try:
        result = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=900, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        message = f"`bash {script}` could not run ({exc}): run it by hand as root, then rerun"
        raise ContainerEngineError(message) from exc
    if result.returncode != 0 or not engine_answers():
        raise ContainerEngineError(
            f"`bash {script}` exited with {result.returncode} and no Docker engine answers: run it by hand as root "
            f"(it installs Debian's docker.io and starts dockerd), then rerun. It printed:\n"
            f"{result.stdout[-2000:]}{result.stderr[-2000:]}"
        )
    try:
        ensure_debian_packages(("docker-compose",), (DOCKER_COMPOSE,))
    except DebianPackageError as exc:
        message = f"docker-compose is missing: `apt-get install docker-compose` as root ({exc})"
        raise ContainerEngineError(message) from exc
    return not was_up


def stop_engine() -> None:
    subprocess.run(["bash", str(docker_up_script()), "--stop"], capture_output=True, timeout=120, check=False)


def docker(*args: str, timeout: float = 120.0) -> str:
    result = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"`docker {' '.join(args)}` exited with {result.returncode}: {result.stderr[-2000:]}")
    return result.stdout


@dataclass(frozen=True)
class Container:
    """A container as `docker inspect` describes it."""

    id: str
    name: str
    image: str
    labels: Mapping[str, str]
    running: bool
    pid: int
    exit_code: int
    restarts: int
    memory_limit: int  # bytes; 0: none
    health: str  # the image's HEALTHCHECK: starting, healthy or unhealthy ("" before a first check, or none)
    started_at: float  # Unix time its process started (0: never)

    @classmethod
    def of(cls, inspected: Mapping[str, Any]) -> Container:
        return cls(
            id=inspected["Id"],
            name=inspected["Name"].lstrip("/"),
            image=inspected["Config"]["Image"],
            labels=inspected["Config"]["Labels"] or {},
            running=bool(inspected["State"]["Running"]),
            pid=int(inspected["State"]["Pid"] or 0),
            exit_code=int(inspected["State"]["ExitCode"] or 0),
            restarts=int(inspected.get("RestartCount") or 0),
            memory_limit=int(inspected["HostConfig"].get("Memory") or 0),
            health=str((inspected["State"].get("Health") or {}).get("Status") or ""),
            started_at=unix_time(inspected["State"]["StartedAt"]),
        )


def unix_time(stamp: str) -> float:
    """Docker's RFC 3339 time with nanoseconds (`0001-01-01T00:00:00Z`: never) as a Unix time."""
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    moment = datetime.fromisoformat(f"{whole}.{(fraction + '000000')[:6]}+00:00")
    return max(moment.timestamp(), 0.0)


def containers(*filters: str, running_only: bool = False) -> list[Container]:
    """The containers `docker ps` lists with `filters` (`label=k=v`, ...), inspected."""
    args = ["ps", "-q", "--no-trunc", *(f"--filter={f}" for f in filters)]
    ids = docker(*args if running_only else [*args, "-a"]).split()
    if not ids:
        return []
    return [Container.of(item) for item in json.loads(docker("inspect", *ids))]


def volume_exists(name: str) -> bool:
    return subprocess.run(["docker", "volume", "inspect", name], capture_output=True, check=False).returncode == 0


def image_id(image: str) -> str | None:
    result = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Id}}", image], capture_output=True, text=True, check=False
    )
    return result.stdout.strip() if result.returncode == 0 else None


def image_size_mb(image: str) -> float:
    return int(docker("image", "inspect", "--format", "{{.Size}}", image).strip()) / 1e6


def git_commit() -> str:
    result = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False)
    return result.stdout.strip()


@dataclass
class Leftovers:
    """What a deployment left behind after `down()`: every list empty when it cleaned up."""

    containers: list[str] = field(default_factory=list)
    volumes: list[str] = field(default_factory=list)
    processes: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.containers or self.volumes or self.processes)


class ComposePlatform:
    """The platform's services of docker-compose.yml, on the host's network (deploy/compose/host-network.yml)."""

    def __init__(self, project: str, env: Mapping[str, str], secrets: Iterable[str]) -> None:
        self.project = project
        self.env = {**os.environ, **env}
        self.secrets = [s for s in secrets if s]
        self.ui = f"http://127.0.0.1:{env['MIRUS_UI_PORT']}"
        self.api = f"http://127.0.0.1:{env['MIRUS_API_PORT']}"
        self.token = ""
        self.started = False
        self.processes: dict[int, float] = {}  # pid -> create time, of every process seen in a container
        self.run_containers: set[str] = set()  # ids of every run container seen
        self.built: set[str] = set()  # the images built, by tag

    # -- docker-compose ---------------------------------------------------------------------------------

    def mask(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, "***")
        return text

    def compose(self, *args: str, timeout: float = 300.0, check: bool = True) -> subprocess.CompletedProcess[str]:
        files = [arg for path in COMPOSE_FILES for arg in ("-f", str(path))]
        argv = ["docker-compose", "-p", self.project, *files, *args]
        result = subprocess.run(argv, cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise RuntimeError(
                f"`docker-compose {' '.join(args)}` exited with {result.returncode}:\n"
                f"{self.mask(result.stdout[-3000:] + result.stderr[-3000:])}"
            )
        return result

    @property
    def tag(self) -> str:
        return self.env.get(IMAGE_TAG_ENV) or "local"

    @property
    def runtime_image(self) -> str:
        return f"{RUNTIME_REPOSITORY}:{self.tag}"

    @property
    def spark_image(self) -> str:
        return f"{SPARK_REPOSITORY}:{self.tag}"

    def build(self) -> float:
        """Both images of the current tag, as `docker-compose build` builds them; seconds it took. The images they
        replace are removed (with the layers nothing else uses), so that rebuilds do not fill the disk."""
        started = time.monotonic()
        images = (self.runtime_image, self.spark_image)
        before = {image: image_id(image) for image in images}
        self.compose("build", *IMAGE_SERVICES.values(), timeout=BUILD_TIMEOUT_S)
        self.built.update(images)
        for image, previous in before.items():
            if previous and previous != image_id(image):
                subprocess.run(["docker", "rmi", previous], capture_output=True, timeout=120, check=False)
        return time.monotonic() - started

    def reconfigure(self, env: Mapping[str, str]) -> float:
        """`env` over the deployment's settings, then `docker-compose up -d` as an operator rolls out a change:
        compose recreates the services whose configuration changed; seconds until they answer again."""
        self.env.update(env)
        return self.up()

    def up(self) -> float:
        """The platform's services, until the UI, the code location and the API answer; seconds it took."""
        started = time.monotonic()
        self.started = True
        self.compose("up", "-d", "--no-deps", *PLATFORM_SERVICES, timeout=START_TIMEOUT_S)
        self.until(self._ui_answers, START_TIMEOUT_S, "the webserver to answer /server_info")
        self.until(self._code_location_loaded, START_TIMEOUT_S, "the code location to load")
        self.until(self._api_answers, START_TIMEOUT_S, "the REST API to answer GET /")
        # Where `docker-compose exec` reads it as a user does (DEPLOYMENT.md); kept in memory, never printed.
        self.token = self.compose("exec", "-T", "mirus-api", "cat", "/run/mirus-api/token").stdout.strip()
        self.secrets.append(self.token)
        return time.monotonic() - started

    def logs(self, tail: int = 40) -> str:
        return self.mask(self.compose("logs", "--no-color", f"--tail={tail}", check=False).stdout)

    def until(self, condition: Callable[[], T | None], timeout: float, what: str, interval: float = 0.5) -> T:
        """`wait_until`, failing at once when a service crashed (restarted, or exited non-zero), with the logs."""

        def met() -> T | None:
            if result := condition():
                return result
            for container in self.service_containers():
                if container.restarts or (not container.running and container.exit_code):
                    raise AssertionError(f"{container.name} crashed while waiting for {what}\n{self.logs()}")
            return None

        try:
            return wait_until(met, timeout, interval, what)
        except TimeoutError:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{self.logs()}") from None

    # -- the UI, GraphQL and the REST API ---------------------------------------------------------------

    def _ui_answers(self) -> bool:
        try:
            return requests.get(f"{self.ui}/server_info", timeout=5).ok
        except requests.RequestException:
            return False

    def _api_answers(self) -> bool:
        try:
            return requests.get(f"{self.api}/", timeout=5).ok
        except requests.RequestException:
            return False

    def graphql(self, query: str, variables: Mapping[str, Any] | None = None) -> dict[str, Any]:
        response = requests.post(f"{self.ui}/graphql", json={"query": query, "variables": variables or {}}, timeout=30)
        response.raise_for_status()
        body = response.json()
        assert "errors" not in body, body["errors"]
        return dict(body["data"])

    def _code_location_loaded(self) -> bool:
        try:
            data = self.graphql(WORKSPACE_QUERY)["workspaceOrError"]
        except (requests.RequestException, ValueError):
            return False
        for entry in data.get("locationEntries", []):
            location = entry["locationOrLoadError"]
            if entry["loadStatus"] == "LOADED" and location and location["__typename"] == "RepositoryLocation":
                jobs = {job["name"] for repo in location["repositories"] for job in repo["jobs"]}
                return REPLICATOR_JOB in jobs and PUT_CONNECTOR_JOB in jobs
        return False

    def runs(self, tags: Mapping[str, str], statuses: Sequence[str] = ()) -> list[dict[str, Any]]:
        """Runs with every tag of `tags` (and a status of `statuses`), newest first, their tags as a dict."""
        run_filter: dict[str, Any] = {"tags": [{"key": k, "value": v} for k, v in tags.items()]}
        if statuses:
            run_filter["statuses"] = list(statuses)
        data = self.graphql(RUNS_QUERY, {"filter": run_filter, "limit": 100})["runsOrError"]
        assert data["__typename"] == "Runs", data
        return [{**run, "tags": {t["key"]: t["value"] for t in run["tags"]}} for run in data["results"]]

    def launch(self, job: str, tags: Mapping[str, str]) -> str:
        """Launch `job` as the launchpad does (through the run queue); its run id."""
        params = {
            "selector": {"repositoryLocationName": "mirus", "repositoryName": "__repository__", "jobName": job},
            "runConfigData": {},
            "executionMetadata": {"tags": [{"key": k, "value": v} for k, v in tags.items()]},
        }
        result = self.graphql(LAUNCH_MUTATION, {"params": params})["launchRun"]
        assert result["__typename"] == "LaunchRunSuccess", result
        return str(result["run"]["runId"])

    def terminate(self, run_id: str) -> None:
        """Terminate a run as the UI's Terminate button does: the run launcher stops its container (SIGTERM)."""
        result = self.graphql(TERMINATE_MUTATION, {"runId": run_id})["terminateRun"]
        assert result["__typename"] == "TerminateRunSuccess", result

    def rest(self, method: str, path: str, body: Any = None) -> requests.Response:
        headers = {"Authorization": f"Bearer {self.token}"}
        return requests.request(method, f"{self.api}{path}", json=body, headers=headers, timeout=30)

    # -- containers ---------------------------------------------------------------------------------------

    def service_containers(self) -> list[Container]:
        return containers(f"label=com.docker.compose.project={self.project}")

    def run_containers_of(self, run_ids: Iterable[str]) -> list[Container]:
        """Run containers (started by the daemon, outside compose) of the given runs."""
        wanted = set(run_ids)
        found = [c for c in containers(f"label={RUN_LABEL}") if c.labels.get("dagster/run_id") in wanted]
        self.run_containers.update(c.id for c in found)
        return found

    def all_run_ids(self) -> set[str]:
        data = self.graphql(RUNS_QUERY, {"filter": {}, "limit": 1000})["runsOrError"]
        return {run["runId"] for run in data["results"]}

    def remember_processes(self) -> None:
        """Every process now running in the deployment's containers, to check at `down()` that none survived."""
        for container in [*self.service_containers(), *containers(f"label={RUN_LABEL}")]:
            if not container.running or not container.pid:
                continue
            try:
                main = psutil.Process(container.pid)
                for proc in [main, *main.children(recursive=True)]:
                    self.processes[proc.pid] = proc.create_time()
            except psutil.Error:
                continue  # ended meanwhile

    # -- teardown -----------------------------------------------------------------------------------------

    def down(self) -> Leftovers:
        """Stop and remove the deployment: no new run is launched once the daemon stops, the run containers are
        stopped (their runs end CANCELED, tasks committed) and removed, then `docker-compose down -v` removes the
        services and volumes. Returns what is left; safe to call again."""
        if not self.started:
            return Leftovers()
        self.remember_processes()
        try:
            run_ids = self.all_run_ids()
        except (requests.RequestException, AssertionError):
            run_ids = set()  # the webserver is gone: the containers seen so far are all there is to know
        self.compose("stop", "-t", "30", "dagster-daemon", check=False)
        run_containers = {c.id for c in self.run_containers_of(run_ids)} | self.run_containers
        existing = {c.id for c in containers(f"label={RUN_LABEL}") if c.id in run_containers}
        if existing:
            # Docker stops the containers in parallel: SIGTERM, then SIGKILL after the timeout.
            subprocess.run(["docker", "stop", "-t", "20", *existing], capture_output=True, timeout=120, check=False)
            subprocess.run(["docker", "rm", "-f", *existing], capture_output=True, timeout=120, check=False)
        self.compose("down", "-v", "--remove-orphans", "-t", "30", timeout=300)
        self.started = False
        return self.leftovers(run_containers)

    def remove_images(self, keep_tag: str = "local") -> None:
        """The images built under another tag than `keep_tag` (their layers stay while the kept images use them)."""
        for image in sorted(self.built):
            if not image.endswith(f":{keep_tag}"):
                subprocess.run(["docker", "rmi", image], capture_output=True, timeout=120, check=False)

    def leftovers(self, run_containers: set[str]) -> Leftovers:
        found = Leftovers()
        remaining = {c.id for c in containers(f"label={RUN_LABEL}")} & run_containers
        found.containers = sorted(c.name for c in self.service_containers()) + sorted(remaining)
        project_volumes = docker("volume", "ls", "-q", f"--filter=label=com.docker.compose.project={self.project}")
        found.volumes = project_volumes.split() + [v for v in FIXED_VOLUMES if volume_exists(v)]

        def alive(pid: int, created: float) -> bool:
            try:
                return psutil.Process(pid).create_time() == created
            except psutil.Error:
                return False

        found.processes = [str(pid) for pid, created in self.processes.items() if alive(pid, created)]
        return found
