"""Jobs: the long-running replicator (a run per task) and worker (a run hosting many tasks), the metadata watcher
and the connector administration jobs.

Administration jobs run the submission checks before anything is stored; a rejected config fails the run with
every problem listed and leaves the store as it was. They record the `connectors` asset with the function they
are built with (`build_admin_jobs`), so this module never imports `assets/`.
"""

import contextlib
import os
import socket
from collections.abc import Callable, Iterator
from typing import Any

import dagster as dg

# Dagster's own handling of a run's termination signal, held as a flag instead of raised between two bytecodes.
from dagster._utils.interrupts import capture_interrupts, check_captured_interrupt
from pydantic import Field

from mirus_dagster.constants import (
    CONNECTOR_PARTITIONS,
    HOST_TASKS_OP,
    KIND_ADMIN,
    KIND_REPLICATOR,
    KIND_WATCHER,
    PAUSE_PARTITION_JOB,
    PUT_CONNECTOR_JOB,
    REPLICATE_OP,
    REPLICATOR_JOB,
    RESUME_PARTITION_JOB,
    STORE_CONNECTOR_OP,
    TAG_CONNECTOR,
    TAG_KIND,
    WATCH_OP,
    WATCHER_JOB,
    WORKER_JOB,
    admin_job_name,
    admin_op_name,
)
from mirus_dagster.dagster_resources import PlatformDatabase
from mirus_dagster.run_history import scrub_run_config
from mirus_dagster.settings import PlatformSettings, example_connector
from replicator.configuration import administration
from replicator.configuration.connector import ConnectorConfigError
from replicator.configuration.masking import literal_secrets
from replicator.discovery.monitor import MonitorResult
from replicator.discovery.watcher import MetadataWatcher
from replicator.engine.ownership import run_owned
from replicator.engine.task import ReplicationTask, TaskExit
from replicator.engine.worker import TaskWorker
from replicator.state.head_notices import HeadNotices
from replicator.state.records import PartitionPauseError, UnknownConnectorError
from replicator.state.store import Store

ConnectorsEvent = Callable[[Store, str, dg.DagsterInstance], dg.AssetMaterialization]
"""Builds the `connectors` asset's materialization from the store and the instance's runs, with a reason
(assets/connectors.py)."""
FlowEvent = Callable[[str, MonitorResult], dg.AssetMaterialization]
"""Builds a connector's `replication_flows` materialization from a new assignment (assets/flows.py)."""

# -- the replicator --------------------------------------------------------------------------------------


class ReplicatorTaskConfig(dg.Config):
    connector: str = Field(description="Name of the connector whose task this run executes.")
    task_id: int = Field(ge=0, description="Task number within the connector (0 .. tasks.max - 1).")


@dg.op(
    name=REPLICATE_OP,
    description="Replicate one task's source partitions until the task is removed, paused, deleted or fenced.",
)
def replicate(context: dg.OpExecutionContext, config: ReplicatorTaskConfig, platform: PlatformDatabase) -> None:
    owner = f"{socket.gethostname()}:{os.getpid()}:{context.run_id}"
    name = f"{config.connector}-{config.task_id}"  # every event names the task, so a run page says whose it is
    store = platform.task_store()
    # A task has an owner run and warm standby runs (`task.standby.runs`); whichever gets the lease replicates.
    try:
        with contextlib.closing(HeadNotices(store.engine)) as notices, termination_as_a_stop() as terminated:
            task = ReplicationTask(
                store,
                config.connector,
                config.task_id,
                owner,
                on_event=lambda m: context.log.info(f"{name}: {m}"),
                notices=notices,
            )
            outcome = run_owned(task, terminated)
    except UnknownConnectorError:
        # Deleted before the run started, or between two of the task's writes: an operator's intended action, so
        # the run ends like one that saw the deletion itself (SUCCESS), not red. Any other cause is raised.
        if _connector_exists(store, config.connector):
            raise
        outcome = TaskExit.DELETED
    # None: the connector was deleted while this run stood by (nothing else stops a standby here but termination,
    # which raises). A deletion takes the connector's assignments and leases with it, so a task may see it first as
    # its removal from the assignment or as a fenced commit: the run then says what happened.
    deleted = outcome in (None, TaskExit.DELETED) or not _connector_exists(store, config.connector)
    ended = "connector deleted" if deleted or outcome is None else outcome.value
    context.log.info(f"task {name} ended: {ended}")


@contextlib.contextmanager
def termination_as_a_stop() -> Iterator[Callable[[], bool]]:
    """A run's termination (SIGINT, or SIGTERM from Kubernetes or Docker) as the `should_stop` of the loops inside,
    then raised as Dagster's interruption once they have stopped, so that the run ends CANCELED.

    Dagster otherwise raises DagsterExecutionInterruptedError wherever the main thread is; one that lands while a
    pooled database connection is handed back loses that connection, and the task's final commit then waits for one
    that never comes, and the process does not end."""
    with capture_interrupts():
        yield check_captured_interrupt
        terminated = check_captured_interrupt()
    if terminated:
        raise dg.DagsterExecutionInterruptedError()


def _connector_exists(store: Store, name: str) -> bool:
    try:
        store.get_connector(name)
    except UnknownConnectorError:
        return False
    return True


@dg.job(
    name=REPLICATOR_JOB,
    description="One replicator task (a consumer and a producer). Started and kept alive by the sensors.",
    executor_def=dg.in_process_executor,
    # Launcher-specific tags (a pod's resources on Kubernetes) are added by the sensors for the launcher in use
    # (mirus_dagster/run_launchers.py).
    tags={TAG_KIND: KIND_REPLICATOR},
)
def replicator() -> None:
    replicate()


# -- workers: many tasks in one run -------------------------------------------------------------------------


class ReplicatorWorkerConfig(dg.Config):
    worker: int = Field(ge=0, description="This worker's index (0 .. workers - 1).")
    workers: int = Field(ge=1, description="How many workers the estate has (MIRUS_REPLICATOR_WORKERS).")


@dg.op(
    name=HOST_TASKS_OP,
    description="Host this worker's share of every running connector's tasks (owner or standby) until terminated.",
)
def host_tasks(context: dg.OpExecutionContext, config: ReplicatorWorkerConfig, platform: PlatformDatabase) -> None:
    if config.worker >= config.workers:
        raise dg.Failure(f"worker {config.worker} does not exist among {config.workers} (0 .. {config.workers - 1})")
    owner = f"{socket.gethostname()}:{os.getpid()}:{context.run_id}"
    # Every hosted task flushes, commits and gives its lease back.
    with termination_as_a_stop() as terminated:
        TaskWorker(platform.worker_store(), config.worker, config.workers, owner, on_event=context.log.info).run(
            terminated
        )


@dg.job(
    name=WORKER_JOB,
    description="A worker hosting the tasks of many connectors (MIRUS_REPLICATOR_WORKERS > 0). Started and kept "
    "alive by the sensors.",
    executor_def=dg.in_process_executor,
    tags={TAG_KIND: KIND_REPLICATOR},  # counted with the replicator runs by the run queue's limit
)
def replicator_worker() -> None:
    host_tasks()


# -- the metadata watcher --------------------------------------------------------------------------------


def build_watcher_job(flow_event: FlowEvent) -> dg.JobDefinition:
    """One long-running run watching every connector's clusters (started and kept alive by the run_starter sensor)."""

    @dg.op(
        name=WATCH_OP,
        description="Every second, read each cluster's metadata once and write new assignment "
        "generations for the connectors whose topics or partitions changed.",
    )
    def watch_metadata(context: dg.OpExecutionContext, platform: PlatformDatabase) -> None:
        def changed(result: MonitorResult) -> None:
            context.log.info(
                f"{result.connector}: generation {result.generation}, {len(result.plan.replicate)} "
                f"partitions over {len(result.tasks)} tasks; missing at destination: "
                f"{len(result.plan.missing_destination)}"
            )
            context.log_event(flow_event(result.connector, result))

        def error(connector: str, message: str | None) -> None:
            # The connectors asset shows it from the store: a metadata error with its failed snapshot, any other
            # as the connector's `watch` problem (`replicator.discovery.watcher`).
            context.log.warning(f"{connector}: {message}" if message else f"{connector}: metadata readable again")

        MetadataWatcher(platform.store(), on_change=changed, on_error=error).run()

    @dg.job(
        name=WATCHER_JOB,
        description="Watches cluster metadata for every connector (discovery within seconds). Started and kept "
        "alive by the run_starter sensor.",
        executor_def=dg.in_process_executor,
        tags={TAG_KIND: KIND_WATCHER},
    )
    def metadata_watcher() -> None:
        watch_metadata()

    return metadata_watcher


# -- connector administration ----------------------------------------------------------------------------


class PutConnectorConfig(dg.Config):
    properties: dict[str, Any | None] = Field(
        # The launchpad opens with this: an example that runs as is on the clusters of `mirus dev`.
        default=example_connector(PlatformSettings.from_env().endpoints()),
        description=(
            "Connector properties exactly as for Kafka Connect (PUT /connectors/{name}/config): Mirus names "
            "(name, tasks.max, topics.whitelist, topics.regex, destination.topic.name.suffix, consumer.*, "
            "destination.consumer.*, producer.*, ...) or MirrorMaker 2 names (source.cluster.alias, topics, "
            "replication.policy.class, ...); see docs/CONNECTOR-PROPERTIES.md. A new version replaces the running "
            "configuration live."
        ),
    )


class ConnectorNameConfig(dg.Config):
    name: str = Field(description="Name of an existing connector.")


class PartitionConfig(dg.Config):
    name: str = Field(description="Name of an existing connector.")
    topic: str = Field(description="Source topic of the partition.")
    partition: int = Field(ge=0, description="Source partition number.")


class PartitionPauseConfig(PartitionConfig):
    reason: str = Field(description="Why: shown next to the paused partition (`connectors` asset) until resumed.")


_ADMIN = {
    "pause": "Pause a connector: its tasks commit and stop; nothing is replicated until it is resumed.",
    "resume": "Resume a paused connector: its tasks start again from their committed offsets.",
    "restart": "Restart a connector's tasks in place (new clients, same runs), e.g. after credentials rotated.",
    "delete": "Delete a connector and its assignments; its tasks stop. Offsets are kept (as in Kafka Connect).",
}


# The operations themselves are `replicator.configuration.administration`'s, shared with the REST API and the CLI.
_ACTIONS: dict[str, Callable[[Store, str], None]] = {
    "pause": administration.pause_connector,
    "resume": administration.resume_connector,
    "restart": administration.restart_connector,
    "delete": administration.delete_connector,
}


def _tag_connector(context: dg.OpExecutionContext, name: str) -> None:
    """The run names the connector it acts on, so the Runs page filters by connector (launchpad runs included)."""
    context.instance.add_run_tags(context.run_id, {TAG_CONNECTOR: name})


def _fail(message: str) -> dg.Failure:
    return dg.Failure(description=message, allow_retries=False)


def _put_connector_job(connectors_event: ConnectorsEvent) -> dg.JobDefinition:
    @dg.op(
        name=STORE_CONNECTOR_OP,
        description="Validate and store a connector configuration (a new version if the connector exists).",
    )
    def store_connector(context: dg.OpExecutionContext, config: PutConnectorConfig, platform: PlatformDatabase) -> None:
        store = platform.store()
        try:
            stored = administration.put_connector(store, config.properties)
        except ConnectorConfigError as exc:
            # Dagster stored this run's config before the op ran: a secret typed in clear must not stay there.
            typed = literal_secrets(config.properties)
            if typed:
                scrub_run_config(context.instance, context.run_id, typed)
            raise _fail(f"connector configuration rejected, nothing was stored:\n{exc}") from None
        _tag_connector(context, stored.name)
        context.instance.add_dynamic_partitions(CONNECTOR_PARTITIONS, [stored.name])
        context.log.info(f"connector {stored.name} stored as version {stored.version}")
        context.log_event(connectors_event(store, f"put {stored.name} v{stored.version}", context.instance))

    @dg.job(
        name=PUT_CONNECTOR_JOB,
        description="Add a connector or update its configuration (validated; rejected configs change nothing).",
        tags={TAG_KIND: KIND_ADMIN},
    )
    def put_connector() -> None:
        store_connector()

    return put_connector


def _state_job(action: str, connectors_event: ConnectorsEvent) -> dg.JobDefinition:
    @dg.op(name=admin_op_name(action), description=_ADMIN[action])
    def change_state(context: dg.OpExecutionContext, config: ConnectorNameConfig, platform: PlatformDatabase) -> None:
        _tag_connector(context, config.name)
        store = platform.store()
        try:
            _ACTIONS[action](store, config.name)
        except UnknownConnectorError as exc:
            raise _fail(str(exc)) from None
        if action == "delete":
            context.instance.delete_dynamic_partition(CONNECTOR_PARTITIONS, config.name)
        context.log.info(f"{action}: {config.name}")
        context.log_event(connectors_event(store, f"{action} {config.name}", context.instance))

    @dg.job(name=admin_job_name(action), description=_ADMIN[action], tags={TAG_KIND: KIND_ADMIN})
    def state_job() -> None:
        change_state()

    return state_job


def _partition_jobs(connectors_event: ConnectorsEvent) -> list[dg.JobDefinition]:
    """Pause and resume one source partition by hand (`replicator.configuration.administration.pause_partition`)."""

    @dg.op(name=f"{PAUSE_PARTITION_JOB}_op", description="Pause one source partition by hand, with a reason.")
    def pause_one(context: dg.OpExecutionContext, config: PartitionPauseConfig, platform: PlatformDatabase) -> None:
        _tag_connector(context, config.name)
        store = platform.store()
        try:
            administration.pause_partition(store, config.name, (config.topic, config.partition), config.reason)
        except (UnknownConnectorError, PartitionPauseError) as exc:
            raise _fail(f"nothing was paused: {exc}") from None
        shown = f"{config.topic}[{config.partition}] of {config.name}"
        context.log.info(f"paused {shown}: {config.reason.strip()}")
        context.log_event(connectors_event(store, f"paused {shown}", context.instance))

    @dg.op(name=f"{RESUME_PARTITION_JOB}_op", description="Resume a source partition paused by hand.")
    def resume_one(context: dg.OpExecutionContext, config: PartitionConfig, platform: PlatformDatabase) -> None:
        _tag_connector(context, config.name)
        store = platform.store()
        shown = f"{config.topic}[{config.partition}] of {config.name}"
        try:
            resumed = administration.resume_partition(store, config.name, (config.topic, config.partition))
        except UnknownConnectorError as exc:
            raise _fail(str(exc)) from None
        if not resumed:
            raise _fail(f"{shown} is not paused by an operator")
        context.log.info(f"resumed {shown}")
        context.log_event(connectors_event(store, f"resumed {shown}", context.instance))

    @dg.job(
        name=PAUSE_PARTITION_JOB,
        description="Pause one source partition of a connector by hand, with a reason; the others flow on.",
        tags={TAG_KIND: KIND_ADMIN},
    )
    def pause_partition() -> None:
        pause_one()

    @dg.job(
        name=RESUME_PARTITION_JOB,
        description="Resume a source partition paused by hand, from its first unacknowledged offset.",
        tags={TAG_KIND: KIND_ADMIN},
    )
    def resume_partition() -> None:
        resume_one()

    return [pause_partition, resume_partition]


def build_admin_jobs(connectors_event: ConnectorsEvent) -> list[dg.JobDefinition]:
    """`put_connector`, the pause/resume/restart/delete jobs and the partition pause/resume jobs, recording the
    asset with `connectors_event`."""
    return (
        [_put_connector_job(connectors_event)]
        + [_state_job(action, connectors_event) for action in _ADMIN]
        + _partition_jobs(connectors_event)
    )
