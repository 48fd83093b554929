"""The docker-compose deployment's run launcher: dagster-docker's `DockerRunLauncher`, with two things it lacks.

- **An image and limits per kind of run.** dagster-docker starts every run from the image its code location names
  (`DAGSTER_CURRENT_IMAGE`), with the same container settings, and has no per-run override. The code location is
  the Spark image (its report runs need Java and pyspark, and memory for a JVM beside Python), but replicator,
  worker, watcher and admin runs need neither: they start from `runtime_image` (deploy/Dockerfile's `runtime`
  target, a third of the size), with `runtime_container_kwargs` (their tighter limits) over `container_kwargs`. A
  run of any other kind, or of none (an asset run launched from the UI), keeps the code location's image and
  `container_kwargs`: it may need Spark.
- **Labels from the run's tags.** Every run container carries the run's `mirus/kind`, `mirus/connector`,
  `mirus/task` and worker tags as Docker labels, so `docker ps --filter label=mirus/connector=NAME` finds a
  connector's containers and says which task each runs (dagster-docker labels them with the run id and job only).

Only the daemon (which launches runs) and the webserver (which terminates them) load this module, through the
instance's `run_launcher` (deploy/compose/run-launcher.yaml); dagster-docker is the `docker` extra.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dagster import DagsterInvariantViolationError, DagsterRun, Field, Permissive, StringSource
from dagster._core.launcher.base import LaunchRunContext, ResumeRunContext
from dagster._core.origin import JobPythonOrigin
from dagster._grpc.types import ExecuteRunArgs, ResumeRunArgs
from dagster_docker import DockerRunLauncher
from dagster_docker.container_context import DockerContainerContext
from dagster_docker.utils import DOCKER_CONFIG_SCHEMA, validate_docker_config, validate_docker_image

from mirus_dagster.constants import (
    KIND_ADMIN,
    KIND_REPLICATOR,
    KIND_WATCHER,
    TAG_CONNECTOR,
    TAG_KIND,
    TAG_TASK,
    TAG_WORKER,
    TAG_WORKERS,
)

# Kinds of run whose code never imports Spark, Arrow or matplotlib (deploy/image_requirements.py leaves them out of
# the runtime image; tests/deploy/test_deploy_compose.py loads the code location without them).
RUNTIME_KINDS = frozenset({KIND_REPLICATOR, KIND_WATCHER, KIND_ADMIN})
LABELLED_TAGS = (TAG_KIND, TAG_CONNECTOR, TAG_TASK, TAG_WORKER, TAG_WORKERS)


def run_labels(tags: Mapping[str, str]) -> dict[str, str]:
    """The Docker labels a run's container carries beside dagster-docker's own."""
    return {tag: tags[tag] for tag in LABELLED_TAGS if tag in tags}


class MirusDockerRunLauncher(DockerRunLauncher):
    """`DockerRunLauncher` that starts runs needing no Spark from `runtime_image` with `runtime_container_kwargs`,
    and labels containers by tags."""

    def __init__(
        self,
        runtime_image: str | None = None,
        runtime_container_kwargs: Mapping[str, Any] | None = None,
        **config: Any,
    ) -> None:
        super().__init__(**config)
        if runtime_image:
            validate_docker_image(runtime_image)
        validate_docker_config(None, None, runtime_container_kwargs)
        self.runtime_image = runtime_image
        self.runtime_container_kwargs = dict(runtime_container_kwargs or {})

    @classmethod
    def config_type(cls) -> dict[str, Any]:
        return {
            **DOCKER_CONFIG_SCHEMA,
            "runtime_image": Field(
                StringSource,
                is_required=False,
                description="Image of replicator, worker, watcher and admin runs (tag mirus/kind); other runs "
                "start from their code location's image.",
            ),
            "runtime_container_kwargs": Field(
                Permissive(),
                is_required=False,
                description="containers.create arguments of the runs that start from runtime_image, over "
                "container_kwargs (e.g. tighter resource limits).",
            ),
        }

    def _runtime_kind(self, run: DagsterRun) -> bool:
        return run.tags.get(TAG_KIND) in RUNTIME_KINDS

    def image_for(self, run: DagsterRun, origin: JobPythonOrigin) -> str:
        if self.runtime_image and self._runtime_kind(run):
            return self.runtime_image
        return self._get_docker_image(origin)

    def get_container_context(self, dagster_run: DagsterRun) -> DockerContainerContext:
        context = super().get_container_context(dagster_run)
        kwargs = dict(context.container_kwargs)
        if self._runtime_kind(dagster_run):
            kwargs.update(self.runtime_container_kwargs)
        labels = kwargs.get("labels") or {}
        if isinstance(labels, list):  # dagster-docker accepts a list of label names too
            labels = dict.fromkeys(labels, "")
        return DockerContainerContext(
            registry=context.registry,
            env_vars=context.env_vars,
            networks=context.networks,
            container_kwargs={**kwargs, "labels": {**labels, **run_labels(dagster_run.tags)}},
        )

    # dagster-docker's own launch_run and resume_run, with the image chosen per run.
    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        origin = _code_origin(context)
        command = ExecuteRunArgs(
            job_origin=origin, run_id=run.run_id, instance_ref=self._instance.get_ref()
        ).get_command_args()
        self._launch_container_with_command(run, self.image_for(run, origin), command)

    def resume_run(self, context: ResumeRunContext) -> None:
        run = context.dagster_run
        origin = _code_origin(context)
        command = ResumeRunArgs(
            job_origin=origin, run_id=run.run_id, instance_ref=self._instance.get_ref()
        ).get_command_args()
        self._launch_container_with_command(run, self.image_for(run, origin), command)


def _code_origin(context: LaunchRunContext | ResumeRunContext) -> JobPythonOrigin:
    """Where the run's code is, which every run a code location launches has."""
    origin = context.job_code_origin
    if origin is None:
        raise DagsterInvariantViolationError(f"run {context.dagster_run.run_id} has no code origin to launch")
    return origin
