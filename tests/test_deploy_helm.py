"""deploy/helm/values.yaml for Dagster's Helm chart, checked offline against the schemas that exist in registries.

The chart's own `values.schema.json` is generated in Dagster's repository and published only with the chart, on no
package registry this project may use, so it is not what validates here. Instead:
- every Kubernetes-typed value (resources, secret env sources, volumes, mounts) is validated against Kubernetes'
  own JSON schemas (the `kubernetes-validate` wheel) — the definitions the chart's schema refers to for them;
- the run launcher and run coordinator are rendered into instance config the way the chart's templates render them
  (`runLauncher.config.k8sRunLauncher` → `K8sRunLauncher` config) and loaded with dagster-k8s's and Dagster's own
  config schemas;
- the K8sRunLauncher so configured launches a real replicator run: the Kubernetes Job it submits is captured
  (there is no Kubernetes API server here: the batch API is the one stand-in) and validated against Kubernetes'
  Job schema, and its pod carries the replicator job's `dagster-k8s/config` resources and the platform's secrets.
"""

from __future__ import annotations

import json
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

from mirus_dagster.jobs import REPLICATOR_K8S_CONFIG, replicator
from mirus_dagster.sensors.task_runs import run_request
from replicator.configuration.secrets import ENV_ALLOWED_PATHS

from .deploy_secrets import assert_documented_references_resolve

ROOT = Path(__file__).resolve().parent.parent
VALUES = ROOT / "deploy" / "helm" / "values.yaml"
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
    resources = REPLICATOR_K8S_CONFIG["container_config"]["resources"]
    assert not k8s_schema_errors(resources, "ResourceRequirements")
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


def test_a_replicator_run_becomes_a_valid_kubernetes_job_with_its_resources_and_secrets(
    values: dict[str, Any], tmp_path: Path
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
    launcher = K8sRunLauncher(
        **{**config, "load_incluster_config": False, "kubeconfig_file": str(kubeconfig)}, k8s_client_batch_api=batch
    )
    image = f"{user_deployment(values)['image']['repository']}:{user_deployment(values)['image']['tag']}"
    origin = JobPythonOrigin(
        "replicator",
        RepositoryPythonOrigin(
            sys.executable, ModuleCodePointer("mirus_dagster.definitions", "defs", None), container_image=image
        ),
    )
    request = run_request("orders-mirror", 3, "assigned, never ran")
    with dg.instance_for_test() as instance:
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
    assert container["image"] == image
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
