"""`GET /` (version, commit and the destination's cluster id, Kafka Connect's version probe) and `GET /metrics`."""

from __future__ import annotations

import functools
import json
import logging
import os
import subprocess
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from confluent_kafka.admin import AdminClient
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.responses import JSONResponse, Response

from mirus.api.metrics import StoreCollector
from mirus.api.resources.calls import Call
from replicator.state.store import Store

log = logging.getLogger(__name__)

# Set by deploy/Dockerfile from its build argument of the same name: `GET /`'s commit.
ENV_COMMIT = "MIRUS_COMMIT"


@dataclass
class RootResource:
    store: Store
    destination_bootstrap_servers: str | None = None
    _cluster_id: str | None = field(default=None, init=False)

    def root(self, call: Call) -> Response:
        return JSONResponse({"version": version(), "commit": _commit(), "kafka_cluster_id": self.cluster_id()})

    def metrics(self, call: Call) -> Response:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(StoreCollector(self.store))
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    def cluster_id(self) -> str | None:
        """The destination cluster's id (Kafka Connect reports the cluster its worker writes to): the one the
        metadata watcher recorded for the connectors when they all write to one cluster (read with the connectors'
        own security settings there, so a secured destination needs none here), else asked of the platform's
        destination (`MIRUS_DESTINATION_BOOTSTRAP_SERVERS`)."""
        recorded = self.store.destination_cluster_ids()
        if len(recorded) == 1:
            return next(iter(recorded))
        if self._cluster_id is None and self.destination_bootstrap_servers:
            try:
                admin = AdminClient({"bootstrap.servers": self.destination_bootstrap_servers})
                self._cluster_id = admin.list_topics(timeout=2).cluster_id
            except Exception as exc:  # an unreachable cluster must not break the version probe
                log.warning("destination cluster id unavailable: %s", exc)
        return self._cluster_id


@functools.cache
def version() -> str:
    try:
        return metadata.version("mirus-dagster")
    except metadata.PackageNotFoundError:
        return "unknown"


@functools.cache
def _commit() -> str:
    """The git commit the package was installed from: the image's build argument (deploy/Dockerfile, whose build
    context has no `.git`), else pip's record of a VCS install, else the source checkout's HEAD (editable installs);
    "unknown" for an install from a tree without git history."""
    if built := os.environ.get(ENV_COMMIT, "").strip():
        return built
    try:
        direct = metadata.distribution("mirus-dagster").read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        direct = None
    commit = (json.loads(direct).get("vcs_info") or {}).get("commit_id") if direct else None
    if commit:
        return str(commit)
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head.stdout.strip() or "unknown"
