"""Jobs: the long-running replicator (one run = one task) and the connector administration jobs.

Administration jobs validate with the engine's model before anything is stored; a rejected config fails the run
with the validation message and leaves the store as it was.
"""

import os
import socket
from typing import Any

import dagster as dg
from pydantic import Field

from mirus_dagster.resources import PlatformDatabase
from mirus_dagster.status import connectors_materialization
from replicator.config import ConnectorConfig, ConnectorConfigError, literal_secrets
from replicator.store import PAUSED, RUNNING, UnknownConnectorError
from replicator.task import ReplicationTask

# -- the replicator --------------------------------------------------------------------------------------


class ReplicatorTaskConfig(dg.Config):
    connector: str = Field(description="Name of the connector whose task this run executes.")
    task_id: int = Field(ge=0, description="Task number within the connector (0 .. tasks.max - 1).")


@dg.op(description="Replicate one task's source partitions until the task is removed, paused, deleted or fenced.")
def replicate(context: dg.OpExecutionContext, config: ReplicatorTaskConfig, platform: PlatformDatabase) -> None:
    owner = f"{socket.gethostname()}:{os.getpid()}:{context.run_id}"
    # Termination arrives as DagsterExecutionInterruptedError between bytecodes; the task's `finally` flushes,
    # commits and releases before it propagates, and the run ends CANCELED.
    task = ReplicationTask(platform.store(), config.connector, config.task_id, owner, on_event=context.log.info)
    outcome = task.run()
    context.log.info(f"task {config.connector}-{config.task_id} ended: {outcome.value}")


@dg.job(
    name="replicator",
    description="One replicator task (a consumer and a producer). Started and kept alive by the sensors.",
    executor_def=dg.in_process_executor,
    tags={"mirus/kind": "replicator"},
)
def replicator() -> None:
    replicate()


# -- connector administration ----------------------------------------------------------------------------


class PutConnectorConfig(dg.Config):
    properties: dict[str, Any] = Field(
        description=(
            "Connector properties exactly as for Kafka Connect (PUT /connectors/{name}/config): Mirus names "
            "(name, tasks.max, topics.whitelist, topics.regex, destination.topic.name.suffix, consumer.*, "
            "destination.consumer.*, producer.*, ...) or MirrorMaker 2 names (source.cluster.alias, topics, "
            "replication.policy.class, ...). A new version replaces the running configuration live."
        )
    )


class ConnectorNameConfig(dg.Config):
    name: str = Field(description="Name of an existing connector.")


def _fail(message: str) -> dg.Failure:
    return dg.Failure(description=message, allow_retries=False)


@dg.op(description="Validate and store a connector configuration (a new version if the connector exists).")
def store_connector(context: dg.OpExecutionContext, config: PutConnectorConfig, platform: PlatformDatabase) -> None:
    literal = literal_secrets(config.properties)
    if literal:
        raise _fail(
            "connector configuration rejected, nothing was stored:\n"
            + "\n".join(
                f"{name}: give secrets as a reference (${{env:NAME}} or ${{file:/path/file.properties:key}}) "
                "so that they never enter Dagster's run history; then rotate the value typed here"
                for name in literal
            )
        )
    try:
        parsed = ConnectorConfig.from_properties(config.properties)
    except ConnectorConfigError as exc:
        raise _fail(f"connector configuration rejected, nothing was stored:\n{exc}") from None
    store = platform.store()
    version = store.put_connector(parsed.name, parsed.raw, parsed.tasks_max)
    context.instance.add_dynamic_partitions("connectors", [parsed.name])
    context.log.info(f"connector {parsed.name} stored as version {version}")
    context.log_event(connectors_materialization(store, f"put {parsed.name} v{version}"))


def _state_op(name: str, description: str, action: str) -> dg.OpDefinition:
    @dg.op(name=name, description=description)
    def _op(context: dg.OpExecutionContext, config: ConnectorNameConfig, platform: PlatformDatabase) -> None:
        store = platform.store()
        try:
            if action == "pause":
                store.set_connector_state(config.name, PAUSED)
            elif action == "resume":
                store.set_connector_state(config.name, RUNNING)
            elif action == "restart":
                store.request_restart(config.name)
            elif action == "delete":
                if not store.delete_connector(config.name):
                    raise UnknownConnectorError(f"connector {config.name!r} does not exist")
                context.instance.delete_dynamic_partition("connectors", config.name)
        except UnknownConnectorError as exc:
            raise _fail(str(exc)) from None
        context.log.info(f"{action}: {config.name}")
        context.log_event(connectors_materialization(store, f"{action} {config.name}"))

    return _op


_ADMIN = {
    "pause": "Pause a connector: its tasks commit and stop; nothing is replicated until it is resumed.",
    "resume": "Resume a paused connector: its tasks start again from their committed offsets.",
    "restart": "Restart a connector's tasks in place (new clients, same runs), e.g. after credentials rotated.",
    "delete": "Delete a connector and its assignments; its tasks stop. Offsets are kept (as in Kafka Connect).",
}


def _admin_job(action: str, op: dg.OpDefinition) -> dg.JobDefinition:
    @dg.job(name=f"{action}_connector", description=_ADMIN.get(action, op.description), tags={"mirus/kind": "admin"})
    def _job() -> None:
        op()

    return _job


@dg.job(
    name="put_connector",
    description="Add a connector or update its configuration (validated; rejected configs change nothing).",
    tags={"mirus/kind": "admin"},
)
def put_connector_job() -> None:
    store_connector()


admin_jobs = [put_connector_job] + [
    _admin_job(action, _state_op(f"{action}_connector_op", description, action))
    for action, description in _ADMIN.items()
]
