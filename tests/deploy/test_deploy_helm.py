"""deploy/helm/values.yaml for Dagster's Helm chart, checked offline.

- merged with the chart's defaults as Helm merges them, the values pass the chart's own `values.schema.json`, and
  the `dagster-user-deployments` section (with `global`), merged with that subchart's defaults, passes the
  subchart's schema; both schemas and defaults are vendored in tests/data/dagster-helm/ (README there: which
  snapshot), their Kubernetes references resolved to Kubernetes' own schemas;
- every Kubernetes-typed value (resources, secret env sources, volumes, mounts) is validated against Kubernetes'
  own JSON schemas (the `kubernetes-validate` wheel) — the definitions the chart's schema refers to for them;
- the run launcher and run coordinator are rendered into instance config the way the chart's templates render them
  (`runLauncher.config.k8sRunLauncher` → `K8sRunLauncher` config) and loaded with dagster-k8s's and Dagster's own
  config schemas;
- the K8sRunLauncher so configured launches a real replicator run: the Kubernetes Job it submits is captured
  (there is no Kubernetes API server here: the batch API is the one stand-in) and validated against Kubernetes'
  Job schema, and its pod carries the `dagster-k8s/config` resources the sensors give replicator runs under that
  launcher (and only under it) and the platform's secrets;
- the API's manifests beside the values (deploy/helm/mirus-api.yaml) pass Kubernetes' schemas, run the code
  location's image and secrets, start the API with authentication on, and keep it inside the cluster.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import dagster as dg
import jsonschema
import kubernetes
import kubernetes_validate
import pytest
import yaml
from dagster._config import process_config
from dagster._core.code_pointer import ModuleCodePointer
from dagster._core.instance.config import dagster_instance_config
from dagster._core.launcher import LaunchRunContext
from dagster._core.origin import JobPythonOrigin, RepositoryPythonOrigin
from dagster._core.run_coordinator import QueuedRunCoordinator
from dagster._serdes.config_class import ConfigurableClassData
from dagster_k8s import K8sRunLauncher
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from mirus.api.auth import ENV_BEARER_TOKEN, OPEN_PATHS, ApiSettings, Credentials
from mirus_dagster.jobs import replicator, replicator_worker
from mirus_dagster.run_launchers import (
    ENV_RUNTIME_IMAGE,
    K8S_CONFIG_TAG,
    REPLICATOR_K8S_CONFIG,
    WORKER_K8S_CONFIG,
    replicator_launcher_tags,
)
from replicator.configuration.secrets import ENV_ALLOWED_PATHS
from sensors.task_runs import run_request
from tests.fixtures.deploy_secrets import assert_documented_references_resolve

ROOT = Path(__file__).resolve().parents[2]
VALUES = ROOT / "deploy" / "helm" / "values.yaml"
API_MANIFESTS = ROOT / "deploy" / "helm" / "mirus-api.yaml"
CHART = ROOT / "tests" / "data" / "dagster-helm"  # the chart's schemas and defaults (its README: which snapshot)
SUBCHART = "dagster-user-deployments"
CHART_KUBERNETES_SCHEMA = (
    "https://raw.githubusercontent.com/yannh/kubernetes-json-schema/master/v1.19.0/_definitions.json"
)
KUBERNETES_VERSION = "1.33.0"
# What the chart derives from the release (`helm install mirus dagster/dagster -n mirus`).
RELEASE_NAMESPACE = "mirus"
FULLNAME = "mirus-dagster"
SECRET_MOUNT = "/etc/mirus/secrets"  # where ${file:...} references in connector configs point
# Values the chart passes to Kubernetes as they are, and the Kubernetes definition each one is.
KUBERNETES_TYPED = {
    "resources": "ResourceRequirements",
    "envSecrets": "SecretEnvSource",
    "volumes": "Volume",
    "volumeMounts": "VolumeMount",
}


@pytest.fixture(scope="module")
def values() -> dict[str, Any]:
    return yaml.safe_load(VALUES.read_text())


def helm_merge(defaults: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Helm's coalescing of a chart's default values with a values file: maps merge key by key, anything else
    (lists included) replaces the default, and `null` deletes the key."""
    merged = dict(defaults)
    for key, value in overrides.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = helm_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def chart_values(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """What Helm validates: the chart's merged values, and its user-deployments subchart's (with `global`)."""
    merged = helm_merge(yaml.safe_load((CHART / "values.yaml").read_text()), values)
    subchart = helm_merge(yaml.safe_load((CHART / SUBCHART / "values.yaml").read_text()), merged[SUBCHART])
    subchart["global"] = helm_merge(subchart.get("global") or {}, merged.get("global") or {})
    return merged, subchart


def chart_schema_errors(instance: dict[str, Any], schema_file: Path) -> list[str]:
    """Errors of `instance` against one of the chart's schemas, its Kubernetes references resolved offline."""
    package = Path(kubernetes_validate.__file__).parent
    definitions = json.loads(
        (package / "kubernetes-json-schema" / f"v{KUBERNETES_VERSION}-local" / "_definitions.json").read_text()
    )["$defs"]
    # The chart refers to `#/definitions/...` of a v1.19 file; the same names exist in the packaged v1.33 one.
    kubernetes = Resource.from_contents(
        {"definitions": definitions, "$defs": definitions}, default_specification=DRAFT202012
    )
    validator = jsonschema.Draft202012Validator(
        json.loads(schema_file.read_text()), registry=Registry().with_resource(CHART_KUBERNETES_SCHEMA, kubernetes)
    )
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(instance)]


def test_the_values_merged_with_the_charts_defaults_pass_the_charts_schema(values: dict[str, Any]) -> None:
    merged, _ = chart_values(values)
    assert chart_schema_errors(merged, CHART / "values.schema.json") == []


def test_the_user_deployment_merged_with_the_subcharts_defaults_passes_the_subcharts_schema(
    values: dict[str, Any],
) -> None:
    _, subchart = chart_values(values)
    assert subchart["deployments"] == values[SUBCHART]["deployments"]  # a list replaces the default's
    assert chart_schema_errors(subchart, CHART / SUBCHART / "values.schema.json") == []


def test_the_chart_schemas_reject_misspelt_and_mistyped_values(values: dict[str, Any]) -> None:
    misspelt = yaml.safe_load(VALUES.read_text())
    launcher = misspelt["runLauncher"]["config"]["k8sRunLauncher"]
    launcher["envSecret"] = launcher.pop("envSecrets")
    misspelt["dagsterDaemon"]["runCoordinator"]["config"]["queuedRunCoordinator"]["maxConcurrentRuns"] = "many"
    errors = chart_schema_errors(chart_values(misspelt)[0], CHART / "values.schema.json")
    assert any("envSecret" in e for e in errors) and any("'many'" in e for e in errors), errors
    wrong_port = yaml.safe_load(VALUES.read_text())
    user_deployment(wrong_port)["port"] = "3030"
    errors = chart_schema_errors(chart_values(wrong_port)[1], CHART / SUBCHART / "values.schema.json")
    assert any(e.startswith("deployments/0/port") for e in errors), errors


def k8s_schema_errors(instance: Any, definition: str) -> list[str]:
    """Errors of `instance` against Kubernetes' definition `io.k8s.api.core.v1.<definition>` (strict schemas)."""
    package = Path(kubernetes_validate.__file__).parent
    definitions = json.loads(
        (package / "kubernetes-json-schema" / f"v{KUBERNETES_VERSION}-local-strict" / "_definitions.json").read_text()
    )
    registry = Resource.from_contents(definitions) @ Registry()
    schema = {"$ref": f"{definitions['$id']}#/$defs/io.k8s.api.core.v1.{definition}"}
    validator = jsonschema.Draft202012Validator(schema, registry=registry)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(instance)]


def user_deployment(values: dict[str, Any]) -> dict[str, Any]:
    [deployment] = values["dagster-user-deployments"]["deployments"]
    return deployment


def launcher_values(values: dict[str, Any]) -> dict[str, Any]:
    assert values["runLauncher"]["type"] == "K8sRunLauncher"
    return values["runLauncher"]["config"]["k8sRunLauncher"]


def rendered_run_launcher(values: dict[str, Any]) -> dict[str, Any]:
    """The `run_launcher.config` the chart writes into the instance's dagster.yaml (its _run-launcher.tpl)."""
    k8s = launcher_values(values)
    config: dict[str, Any] = {
        "load_incluster_config": k8s["loadInclusterConfig"],
        "job_namespace": k8s.get("jobNamespace") or RELEASE_NAMESPACE,
        "image_pull_policy": k8s["imagePullPolicy"],
        "service_account_name": values.get("global", {}).get("serviceAccountName") or FULLNAME,
        "dagster_home": values.get("global", {}).get("dagsterHome", "/opt/dagster/dagster_home"),
        "instance_config_map": f"{FULLNAME}-instance",
        "postgres_password_secret": values["global"]["postgresqlSecretName"],
    }
    if k8s.get("envSecrets"):
        config["env_secrets"] = [s["name"] for s in k8s["envSecrets"] if "name" in s]
    if k8s.get("envConfigMaps"):
        config["env_config_maps"] = [c["name"] for c in k8s["envConfigMaps"] if "name" in c]
    for key, target in (
        ("envVars", "env_vars"),
        ("volumeMounts", "volume_mounts"),
        ("volumes", "volumes"),
        ("labels", "labels"),
        ("resources", "resources"),
    ):
        if k8s.get(key):
            config[target] = k8s[key]
    return config


def rendered_run_coordinator(values: dict[str, Any]) -> dict[str, Any]:
    """The `run_coordinator.config` the chart writes for a QueuedRunCoordinator (its _run-coordinator.tpl)."""
    coordinator = values["dagsterDaemon"]["runCoordinator"]
    assert coordinator["enabled"] and coordinator["type"] == "QueuedRunCoordinator"
    queued = coordinator["config"]["queuedRunCoordinator"]
    names = {
        "maxConcurrentRuns": "max_concurrent_runs",
        "tagConcurrencyLimits": "tag_concurrency_limits",
        "dequeueIntervalSeconds": "dequeue_interval_seconds",
        "dequeueUseThreads": "dequeue_use_threads",
        "dequeueNumWorkers": "dequeue_num_workers",
    }
    unknown = set(queued) - set(names)
    assert not unknown, f"keys the chart does not render: {unknown}"
    return {names[key]: value for key, value in queued.items()}


def test_kubernetes_typed_values_match_kubernetes_schemas(values: dict[str, Any]) -> None:
    checked = []
    for where, block in (("user deployment", user_deployment(values)), ("run launcher", launcher_values(values))):
        for key, definition in KUBERNETES_TYPED.items():
            items = block.get(key) or []
            for item in items if isinstance(items, list) else [items]:
                errors = k8s_schema_errors(item, definition)
                assert not errors, f"{where} {key}: {errors}"
                checked.append((where, key))
        policy = block["image"]["pullPolicy"] if "image" in block else block["imagePullPolicy"]
        assert policy in {"Always", "IfNotPresent", "Never"}, f"{where}: image pull policy {policy!r}"
    for pod in (REPLICATOR_K8S_CONFIG, WORKER_K8S_CONFIG):
        assert not k8s_schema_errors(pod["container_config"]["resources"], "ResourceRequirements")
    # Every Kubernetes-typed block is present in both places, and was validated.
    assert set(checked) == {(where, key) for where in ("user deployment", "run launcher") for key in KUBERNETES_TYPED}


def test_the_kubernetes_check_rejects_a_misspelt_mount() -> None:
    errors = k8s_schema_errors({"name": "kafka-credentials", "mountpath": SECRET_MOUNT}, "VolumeMount")
    assert errors and any("mountpath" in e or "mountPath" in e for e in errors), errors


def test_the_run_coordinator_loads_and_limits_replicator_runs(values: dict[str, Any]) -> None:
    config = rendered_run_coordinator(values)
    data = ConfigurableClassData("dagster._core.run_coordinator", "QueuedRunCoordinator", yaml.safe_dump(config))
    assert isinstance(data.rehydrate(as_type=QueuedRunCoordinator), QueuedRunCoordinator)
    limits = [lim for lim in config["tag_concurrency_limits"] if replicator.tags.get(lim["key"]) == lim["value"]]
    assert limits, "no tag concurrency limit matches the replicator job's tags"
    assert all(replicator_worker.tags.get(lim["key"]) == lim["value"] for lim in limits), "workers escape the limit"
    assert all(lim["limit"] < config["max_concurrent_runs"] for lim in limits), "admin and report runs would wait"


def test_the_run_launcher_config_loads_with_dagster_k8s_schema(values: dict[str, Any]) -> None:
    result = process_config(K8sRunLauncher.config_type(), rendered_run_launcher(values))
    assert result.success, result.errors


def test_the_rendered_instance_loads_with_dagsters_instance_schema(values: dict[str, Any], tmp_path: Path) -> None:
    """The parts of the chart's instance ConfigMap these values set (its configmap-instance.yaml), as Dagster loads
    them from DAGSTER_HOME."""
    daemon = values["dagsterDaemon"]
    monitoring, sensors = daemon["runMonitoring"], daemon["sensors"]
    instance = {
        "run_launcher": {"module": "dagster_k8s", "class": "K8sRunLauncher", "config": rendered_run_launcher(values)},
        "run_coordinator": {
            "module": "dagster._core.run_coordinator",
            "class": "QueuedRunCoordinator",
            "config": rendered_run_coordinator(values),
        },
        "run_monitoring": {
            "enabled": monitoring["enabled"],
            "poll_interval_seconds": monitoring["pollIntervalSeconds"],
        },
        "sensors": {"use_threads": sensors["useThreads"], "num_workers": sensors["numWorkers"]},
        "telemetry": {"enabled": values["telemetry"]["enabled"]},
    }
    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump(instance))
    config, _ = dagster_instance_config(str(tmp_path))
    assert config["run_monitoring"]["poll_interval_seconds"] == monitoring["pollIntervalSeconds"]


def test_the_user_deployment_serves_this_code_location(values: dict[str, Any]) -> None:
    deployment = user_deployment(values)
    [local] = yaml.safe_load((ROOT / "workspace.yaml").read_text())["load_from"]
    args = deployment["codeServerArgs"]
    assert args[args.index("-m") + 1] == local["python_module"]["module_name"]
    assert deployment["includeConfigInLaunchedRuns"]["enabled"]
    # Sensors (in the code server) and replicators (in run pods) resolve the same secret references.
    for key in ("envSecrets", "volumes", "volumeMounts"):
        assert deployment[key] == launcher_values(values)[key], key
    assert values["postgresql"]["enabled"] is False and values["postgresql"]["postgresqlHost"]
    assert values["generatePostgresqlPasswordSecret"] is False  # the password comes from an existing Secret


def test_the_documented_secret_references_resolve_in_the_code_server_and_in_runs(
    values: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    run = dict(var.split("=", 1) for var in launcher_values(values)["envVars"])
    for env in (user_deployment(values)["env"], run):
        assert_documented_references_resolve(env, monkeypatch)
    assert run[ENV_ALLOWED_PATHS] == SECRET_MOUNT


class RecordingBatchApi:
    """Stands in for the Kubernetes API server's batch API: keeps the Jobs it is asked to create."""

    def __init__(self) -> None:
        self.jobs: list[tuple[str, kubernetes.client.V1Job]] = []

    def create_namespaced_job(self, body: kubernetes.client.V1Job, namespace: str, **_: Any) -> None:
        self.jobs.append((namespace, body))


def runtime_image(values: dict[str, Any]) -> str:
    """The image replicator and worker pods start from: MIRUS_RUNTIME_IMAGE in the code location's environment."""
    return str(user_deployment(values)["env"][ENV_RUNTIME_IMAGE])


def test_the_code_location_runs_the_spark_image_and_replicators_the_runtime_image(values: dict[str, Any]) -> None:
    # deploy/Dockerfile's two targets, pushed under the same registry and tag: `spark` for the code server and the
    # report runs (Java and pyspark), `runtime` for replicator and worker pods and the API (neither).
    code = user_deployment(values)["image"]
    registry, runtime = runtime_image(values).rsplit("/", 1)
    assert code["repository"] == f"{registry}/mirus-dagster-spark"
    assert runtime == f"mirus-dagster:{code['tag']}"


def test_a_replicator_run_becomes_a_valid_kubernetes_job_with_its_resources_and_secrets(
    values: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = process_config(K8sRunLauncher.config_type(), rendered_run_launcher(values)).value
    assert config is not None
    kubeconfig = tmp_path / "kubeconfig"  # loadInclusterConfig needs a pod; an equivalent offline client config
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "users": [{"name": "u", "user": {}}],
            }
        )
    )
    batch = RecordingBatchApi()
    offline = {**config, "load_incluster_config": False, "kubeconfig_file": str(kubeconfig)}
    launcher = K8sRunLauncher(**offline, k8s_client_batch_api=batch)
    image = f"{user_deployment(values)['image']['repository']}:{user_deployment(values)['image']['tag']}"
    # The sensors run in the code server, with the user deployment's environment.
    monkeypatch.setenv(ENV_RUNTIME_IMAGE, runtime_image(values))
    origin = JobPythonOrigin(
        "replicator",
        RepositoryPythonOrigin(
            sys.executable, ModuleCodePointer("mirus_dagster.definitions", "defs", None), container_image=image
        ),
    )
    # The instance as the chart configures it: its launcher is what decides the run's tags.
    with dg.instance_for_test(
        overrides={"run_launcher": {"module": "dagster_k8s", "class": "K8sRunLauncher", "config": offline}}
    ) as instance:
        request = run_request(
            "orders-mirror", 3, "assigned, never ran", launcher_tags=replicator_launcher_tags(instance)
        )
        launcher.register_instance(instance)
        run = instance.create_run_for_job(
            replicator,
            run_config=request.run_config,
            tags={**replicator.tags, **request.tags},
            job_code_origin=origin,
        )
        launcher.launch_run(LaunchRunContext(dagster_run=run, workspace=None))

    [(namespace, job)] = batch.jobs
    assert namespace == RELEASE_NAMESPACE
    manifest = kubernetes.client.ApiClient().sanitize_for_serialization(job)
    kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)
    pod = manifest["spec"]["template"]["spec"]
    [container] = pod["containers"]
    # The runtime image the run's tag names, not the code location's (Spark) image.
    assert container["image"] == runtime_image(values) != image
    assert container["resources"] == REPLICATOR_K8S_CONFIG["container_config"]["resources"]
    assert {"secretRef": {"name": "mirus-platform"}} in container["envFrom"]
    assert any(m["mountPath"] == SECRET_MOUNT and m.get("readOnly") for m in container["volumeMounts"])
    [volume] = [v for v in pod["volumes"] if v["name"] == "kafka-credentials"]
    assert volume["secret"]["secretName"] == "mirus-kafka-credentials"
    # The report runs' lake: where MIRUS_LAKE_DIR points is the shared volume's mount.
    lake = next(e["value"] for e in container["env"] if e["name"] == "MIRUS_LAKE_DIR")
    assert any(m["mountPath"] == lake for m in container["volumeMounts"])
    # Dagster's storage password comes from its Secret, never from the manifest.
    assert not any("value" in e for e in container["env"] if e["name"] == "DAGSTER_PG_PASSWORD")


@pytest.mark.parametrize(
    "launcher",
    [
        None,  # Dagster's default launcher, as under `mirus dev`
        {  # docker compose
            "module": "mirus_dagster.docker_launcher",
            "class": "MirusDockerRunLauncher",
            "config": {"network": "mirus", "runtime_image": "mirus-dagster:local"},
        },
    ],
)
def test_replicator_runs_carry_no_kubernetes_tag_under_other_launchers(launcher: dict[str, Any] | None) -> None:
    with dg.instance_for_test(overrides={"run_launcher": launcher} if launcher else None) as instance:
        request = run_request(
            "orders-mirror", 0, "assigned, never ran", launcher_tags=replicator_launcher_tags(instance)
        )
    assert K8S_CONFIG_TAG not in request.tags and K8S_CONFIG_TAG not in replicator.tags


def api_manifests() -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all(API_MANIFESTS.read_text())}


def test_the_api_manifests_pass_kubernetes_schemas() -> None:
    manifests = api_manifests()
    assert set(manifests) == {"Deployment", "Service"}
    for manifest in manifests.values():
        kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)


def test_the_api_runs_the_runtime_image_with_the_code_locations_secrets_and_answers_probes(
    values: dict[str, Any],
) -> None:
    pod = api_manifests()["Deployment"]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    command = container["command"]
    assert command[:2] == ["mirus", "api"] and command[command.index("--host") + 1] == "0.0.0.0"
    port = int(command[command.index("--port") + 1])
    [declared] = container["ports"]
    assert declared["containerPort"] == port
    code = user_deployment(values)
    assert container["image"] == runtime_image(values)  # no Java, no Spark: the API needs neither
    assert container["envFrom"] == [{"secretRef": secret} for secret in code["envSecrets"]]
    # Connector configs' ${file:...} references resolve in the API as in the code location.
    [mount] = [m for m in code["volumeMounts"] if m["mountPath"] == SECRET_MOUNT]
    assert mount in container["volumeMounts"]
    assert next(v for v in code["volumes"] if v["name"] == mount["name"]) in pod["volumes"]
    # Probes ask a path that needs no token, on the API's port.
    for probe in ("readinessProbe", "livenessProbe"):
        check = container[probe]["httpGet"]
        assert check["path"] in OPEN_PATHS and check["port"] in (port, declared["name"]), probe
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]


def test_the_api_starts_with_a_token_from_a_mounted_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pod = api_manifests()["Deployment"]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    path = re.fullmatch(r"\$\{file:(/[^}:]+)\}", env[ENV_BEARER_TOKEN])
    assert path, f"{ENV_BEARER_TOKEN} is not a file reference: {env[ENV_BEARER_TOKEN]!r}"
    # The file lies in a Secret mounted read-only: the manifest holds no token.
    [mount] = [m for m in container["volumeMounts"] if path.group(1).startswith(m["mountPath"].rstrip("/") + "/")]
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert mount.get("readOnly") and volume["secret"]["secretName"]
    # The API's settings from the container's environment and command (a literal token is refused there), the
    # Secret's file at hand: listening on every interface, its token is the one credential accepted.
    (tmp_path / Path(path.group(1)).name).write_text("a-token-from-the-secret\n")
    for name, value in env.items():
        monkeypatch.setenv(name, value.replace(mount["mountPath"], str(tmp_path)))
    command = container["command"]
    credentials = Credentials(ApiSettings.from_env(host=command[command.index("--host") + 1]))
    assert credentials.accepts("Bearer a-token-from-the-secret") and not credentials.accepts("Bearer guess")


def test_the_api_service_stays_inside_the_cluster() -> None:
    manifests = api_manifests()
    service, deployment = manifests["Service"], manifests["Deployment"]
    spec = service["spec"]
    assert spec.get("type", "ClusterIP") == "ClusterIP"
    assert not {"externalIPs", "loadBalancerIP", "externalName"} & set(spec)
    assert all("nodePort" not in port for port in spec["ports"])
    # It selects the API's pods and reaches the port the API listens on.
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert spec["selector"].items() <= labels.items()
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    [port] = container["ports"]
    [exposed] = spec["ports"]
    assert exposed["port"] == 8083 and exposed["targetPort"] in (port["name"], port["containerPort"])
