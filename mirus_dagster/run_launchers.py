"""What a replicator run carries for the run launcher in use, and nothing for the others.

The Kubernetes launcher sizes a run's pod from its `dagster-k8s/config` tag, and takes its image from there too:
replicator and worker pods start from the runtime image (`MIRUS_RUNTIME_IMAGE` in the code location's environment,
deploy/helm/values.yaml: no Java, no Spark), not from the code location's Spark image. Under any other launcher
(`mirus dev`'s default one; docker compose's, which picks images itself: mirus_dagster/docker_launcher.py) that tag
means nothing and would only clutter every run's page. The launcher's class is read from the instance's
configuration, so no launcher (and no Kubernetes client) is built.
"""

from __future__ import annotations

import json
import os
from typing import Any

import dagster as dg

K8S_CONFIG_TAG = "dagster-k8s/config"
K8S_RUN_LAUNCHER = "K8sRunLauncher"
ENV_RUNTIME_IMAGE = "MIRUS_RUNTIME_IMAGE"  # replicator and worker pods' image; unset: the code location's

# Each replicator run's pod under the K8sRunLauncher (deploy/helm/values.yaml): one task at full speed uses about
# two thirds of a core and under 250 MB (docs/DEPLOYMENT.md, capacity planning).
REPLICATOR_K8S_CONFIG = {
    "container_config": {
        "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}}
    }
}

# A worker run's pod (MIRUS_REPLICATOR_WORKERS): one Python interpreter serves all its tasks, so one core is what it
# can use beside librdkafka's threads; memory is a run's plus what its tasks hold (docs/DEPLOYMENT.md, section 4).
WORKER_K8S_CONFIG = {
    "container_config": {
        "resources": {"requests": {"cpu": "1", "memory": "512Mi"}, "limits": {"cpu": "2", "memory": "1Gi"}}
    }
}


def run_launcher_class(instance: dg.DagsterInstance) -> str:
    """The class name of the instance's run launcher, as configured."""
    if instance.is_ephemeral:  # built in memory with its launcher (tests): nothing to read
        return type(instance.run_launcher).__name__
    data = instance.get_ref().run_launcher_data
    return data.class_name if data else "DefaultRunLauncher"


def replicator_launcher_tags(instance: dg.DagsterInstance, worker: bool = False) -> dict[str, str]:
    """The tags a replicator (or `worker`) run needs from the instance's run launcher: its pod's resources and image
    on Kubernetes."""
    if run_launcher_class(instance) != K8S_RUN_LAUNCHER:
        return {}
    config: dict[str, Any] = WORKER_K8S_CONFIG if worker else REPLICATOR_K8S_CONFIG
    if image := os.environ.get(ENV_RUNTIME_IMAGE):
        config = {**config, "container_config": {**config["container_config"], "image": image}}
    return {K8S_CONFIG_TAG: json.dumps(config)}
