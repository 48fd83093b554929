"""`mirus connectors`, `mirus offsets` and `mirus api`: administration from a shell, on the store directly.

The commands call `replicator.configuration.administration`, the code path of the launchpad jobs and the HTTP API, so a
change made here validates the same way and shows in Dagster the same way. Offsets use Mirus's offset tool formats.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from functools import partial
from typing import Any, TextIO

import click

from mirus.local.stack import LocalStack
from mirus_dagster.settings import PlatformSettings, StackEndpoints
from replicator.assignment import SourcePartition
from replicator.clusters import MetadataUnavailableError
from replicator.configuration import administration
from replicator.configuration.connector import ConnectorConfigError
from replicator.configuration.masking import mask_properties
from replicator.configuration.secrets import parse_java_properties
from replicator.state.database import make_engine, upgrade
from replicator.state.records import (
    ConnectorNotStoppedError,
    ConnectorState,
    PartitionPauseError,
    UnknownConnectorError,
)
from replicator.state.store import Store
from replicator.tools.offset_files import Format, OffsetFileError, OffsetLine, read_offsets, write_offsets

FORMAT_OPTION = click.option(
    "--format",
    "fmt",
    type=click.Choice(["csv", "json"], case_sensitive=False),
    default="csv",
    show_default=True,
    help="csv: connector-id,topic,partition,offset (no header); json: one JSON object per line.",
)


def _endpoints() -> StackEndpoints:
    return LocalStack(PlatformSettings.from_env()).endpoints


def _store() -> Store:
    engine = make_engine(_endpoints().database_url)
    upgrade(engine)
    return Store(engine)


def _run(action: Callable[[], Any]) -> Any:
    """Domain errors become one clear message and exit status 1; nothing is changed by a refused command."""
    try:
        return action()
    except ConnectorConfigError as exc:
        raise click.ClickException(f"connector configuration rejected, nothing was stored:\n{exc}") from None
    except (
        UnknownConnectorError,
        ConnectorNotStoppedError,
        MetadataUnavailableError,
        OffsetFileError,
        PartitionPauseError,
    ) as exc:
        raise click.ClickException(str(exc)) from None


# -- connectors --------------------------------------------------------------------------------------------


@click.group("connectors")
def connectors_group() -> None:
    """Add, change, inspect, pause, resume, restart and delete connectors."""


@connectors_group.command("list")
def connectors_list() -> None:
    """Every connector with its state, configuration version and tasks."""
    store = _store()
    for record in store.list_connectors():
        tasks = len(store.read_assignment(record.name))
        click.echo(f"{record.name}\t{record.state}\tversion {record.version}\t{tasks} task(s)")


@connectors_group.command("get")
@click.argument("name")
def connectors_get(name: str) -> None:
    """A connector's configuration (secrets masked) and status, as JSON."""
    store = _store()
    status = _run(lambda: administration.connect_status(store, name))
    record = store.get_connector(name)
    click.echo(
        json.dumps(
            {
                "name": name,
                "state": status.state,
                "version": record.version,
                "trace": status.trace,
                "config": mask_properties(record.properties),
                "tasks": [
                    {"id": t.task_id, "state": t.state, "worker_id": t.worker, "trace": t.trace} for t in status.tasks
                ],
                "partitions": [  # those that do not replicate, and why
                    {"topic": p.topic, "partition": p.partition, "state": p.state, "reason": p.reason}
                    for p in status.partitions
                ],
            },
            indent=2,
        )
    )


def _read_properties(source: TextIO) -> dict[str, Any]:
    """A JSON config object (or Kafka Connect's `{"name":..., "config": {...}}`), else a .properties file."""
    text = source.read()
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        return parse_java_properties(text)
    if not isinstance(parsed, dict):
        raise click.ClickException("the JSON must be an object of connector properties")
    if isinstance(parsed.get("config"), dict):
        return {"name": parsed.get("name"), **parsed["config"]} if parsed.get("name") else dict(parsed["config"])
    return parsed


@connectors_group.command("put")
@click.argument("name", required=False)
@click.option(
    "--from-file",
    "source",
    type=click.File("r"),
    default="-",
    show_default=True,
    help="JSON or .properties file with the connector's properties ('-': standard input).",
)
@click.option("--paused", is_flag=True, help="Create the connector paused (e.g. to import offsets first).")
def connectors_put(name: str | None, source: TextIO, paused: bool) -> None:
    """Add a connector or store a new version of its configuration (validated; a rejected one changes nothing)."""
    properties = _read_properties(source)
    if name is not None:
        given = properties.setdefault("name", name)
        if given != name:
            raise click.ClickException(f"the file names connector {given!r}, the command line {name!r}")
    store = _store()
    state = ConnectorState.PAUSED if paused else ConnectorState.RUNNING
    stored = _run(lambda: administration.put_connector(store, properties, state))
    click.echo(f"connector {stored.name} {'created' if stored.created else 'updated'} (version {stored.version})")


def _state_command(action: str, operation: Callable[[Store, str], None], help_text: str) -> None:
    @connectors_group.command(action, help=help_text)
    @click.argument("name")
    def _command(name: str) -> None:
        store = _store()
        _run(lambda: operation(store, name))
        click.echo(f"{action}: {name}")


_state_command("pause", administration.pause_connector, "Pause: tasks commit and stop until resumed.")
_state_command("resume", administration.resume_connector, "Resume: tasks start again from their committed offsets.")
_state_command("restart", administration.restart_connector, "Restart the connector's tasks in place (new clients).")
_state_command("delete", administration.delete_connector, "Delete the connector; its offsets are kept.")


@connectors_group.command("pause-partition")
@click.argument("name")
@click.argument("topic")
@click.argument("partition", type=click.IntRange(min=0))
@click.option("--reason", required=True, help="Why: shown next to the paused partition until it is resumed.")
def connectors_pause_partition(name: str, topic: str, partition: int, reason: str) -> None:
    """Pause one source partition by hand: its task stops reading it (the others flow on), also after restarts,
    until `resume-partition`."""
    store = _store()
    _run(lambda: administration.pause_partition(store, name, (topic, partition), reason))
    click.echo(f"paused {topic}[{partition}] of {name}: {reason.strip()}")


@connectors_group.command("resume-partition")
@click.argument("name")
@click.argument("topic")
@click.argument("partition", type=click.IntRange(min=0))
def connectors_resume_partition(name: str, topic: str, partition: int) -> None:
    """Resume a partition paused by hand: read again from its first unacknowledged offset."""
    store = _store()
    if not _run(lambda: administration.resume_partition(store, name, (topic, partition))):
        raise click.ClickException(f"{topic}[{partition}] of {name} is not paused by an operator")
    click.echo(f"resumed {topic}[{partition}] of {name}")


@connectors_group.command("paused-partitions")
@click.argument("name")
def connectors_paused_partitions(name: str) -> None:
    """The connector's partitions paused by hand, with their reason and since when."""
    store = _store()
    _run(lambda: store.get_connector(name))
    for (topic, partition), row in store.partition_pauses(name).items():
        click.echo(f"{topic}[{partition}]\tsince {row.paused_at.isoformat()}\t{row.reason}")


# -- offsets -----------------------------------------------------------------------------------------------


# Added to the `mirus offsets` group (mirus/cli/offsets.py) by the CLI, next to `translate`.


@click.command("describe")
@click.argument("names", nargs=-1)
@FORMAT_OPTION
@click.option("--show-nulls", is_flag=True, help="Also list assigned partitions that have no stored offset.")
def offsets_describe(names: tuple[str, ...], fmt: Format, show_nulls: bool) -> None:
    """Stored offsets of the named connectors (default: every connector)."""
    store = _store()
    lines: list[OffsetLine] = []
    for name in names or [r.name for r in store.list_connectors()]:
        stored: dict[SourcePartition, int | None] = dict(store.load_offsets(name))
        if show_nulls and store.connector_head(name) is not None:
            for parts in store.read_assignment(name).values():
                for partition in parts:
                    stored.setdefault(partition, None)
        lines += [OffsetLine(name, t, p, o) for (t, p), o in stored.items()]
    click.echo(
        write_offsets(sorted(lines, key=lambda line: (line.connector, line.topic, line.partition)), fmt), nl=False
    )


@click.command("reset")
@click.option(
    "--from-file",
    "source",
    type=click.File("r"),
    required=True,
    help="Offsets to write ('-': stdin); an empty or null offset forgets the stored one.",
)
@FORMAT_OPTION
def offsets_reset(source: TextIO, fmt: Format) -> None:
    """Write offsets from a file. Every connector named must be paused; otherwise nothing is changed."""
    lines = _run(lambda: read_offsets(source.read(), fmt))
    by_connector: dict[str, dict[SourcePartition, int | None]] = {}
    for line in lines:
        by_connector.setdefault(line.connector, {})[(line.topic, line.partition)] = line.offset
    store = _store()
    refused = []
    for name in sorted(by_connector):
        head = store.connector_head(name)
        if head is None:
            refused.append(f"connector {name!r} does not exist")
        elif head.state != ConnectorState.PAUSED:
            refused.append(f"connector {name!r} is {head.state}: pause it first (mirus connectors pause {name})")
    if refused:
        raise click.ClickException("no offsets were changed:\n" + "\n".join(refused))
    for name, offsets in sorted(by_connector.items()):
        _run(partial(administration.alter_offsets, store, name, offsets))
        click.echo(f"{name}: {len(offsets)} partition offset(s) written")


@click.command("import-group")
@click.argument("name")
@click.argument("group")
@FORMAT_OPTION
@click.option("--dry-run", is_flag=True, help="Print the offsets that would be written; change nothing.")
def offsets_import_group(name: str, group: str, fmt: Format, dry_run: bool) -> None:
    """Seed paused connector NAME's offsets from consumer GROUP's committed offsets on its source cluster.

    For taking over from MirrorMaker: stop MirrorMaker, create the connector paused, import, resume.
    """
    store = _store()
    offsets = _run(lambda: administration.group_offsets(store, name, group))
    if not offsets:
        raise click.ClickException(f"group {group!r} has no committed offsets for the partitions {name} selects")
    if not dry_run:
        _run(lambda: administration.alter_offsets(store, name, dict(offsets)))
    lines = [OffsetLine(name, t, p, o) for (t, p), o in sorted(offsets.items())]
    click.echo(write_offsets(lines, fmt), nl=False)
    click.echo(f"{'would write' if dry_run else 'wrote'} {len(lines)} offset(s) from group {group}", err=True)


OFFSET_COMMANDS = [offsets_describe, offsets_reset, offsets_import_group]


# -- the HTTP API ------------------------------------------------------------------------------------------


@click.command("api")
@click.option("--host", default=None, help="Interface to listen on [env MIRUS_API_HOST; default 127.0.0.1].")
@click.option("--port", type=int, default=None, help="Port [env MIRUS_API_PORT; default 8083].")
def api_command(host: str | None, port: int | None) -> None:
    """Serve the Kafka-Connect-compatible REST API and Prometheus /metrics until interrupted."""
    from mirus.api.app import serve
    from mirus.api.auth import ApiSettings

    try:
        settings = ApiSettings.from_env(host=host, port=port)
    except ValueError as exc:
        raise click.ClickException(f"API settings: {exc}") from None
    click.echo(f"Kafka Connect REST API: http://{settings.host}:{settings.port}", err=True)
    try:
        serve(_store(), settings, _endpoints().destination_bootstrap_servers)
    except ValueError as exc:  # an auth reference that cannot be resolved
        raise click.ClickException(str(exc)) from None
    sys.exit(0)
