"""`mirus offsets`: a consumer group's offsets translated for failover (see docs/FAILOVER.md).

`mirus offsets translate --connector C --group G` prints, per partition the connector replicates, the group's
committed source offset and the destination offset where it resumes with nothing skipped and nothing re-read.
With the source cluster reachable the translation is made now (and kept as the group's checkpoints); without it,
the last checkpoints from Postgres are printed, with their age on stderr. `--apply` commits the translation into
the destination group of the same name, refused while that group has active members.

A translation is complete once the connector has replicated every record before the group's offset; an
incomplete one is printed with a note on stderr and never applied (its group would re-read the late copies).

Exit codes: 0 done; 1 not applied (the destination group is active, a translation is incomplete, or the broker
refused); 2 nothing to show (unknown connector, no translation and no checkpoint).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import click

from mirus.cli.admin import OFFSET_COMMANDS
from mirus.local.stack import LocalStack
from mirus_dagster.settings import PlatformSettings
from replicator.clusters import ClusterAdmin, ClusterIdentityError, cluster_id
from replicator.configuration.connector import load
from replicator.discovery.offset_translation import (
    TranslatedOffset,
    TranslationError,
    translate_group,
    write_group_offsets,
)
from replicator.state.database import make_engine
from replicator.state.records import UnknownConnectorError
from replicator.state.store import Store

EXIT_NOT_APPLIED = 1
EXIT_NOTHING = 2
COLUMNS = (
    "group",
    "topic",
    "partition",
    "source_offset",
    "destination_topic",
    "destination_partition",
    "destination_offset",
)


@click.group()
def offsets() -> None:
    """Connectors' offsets (Mirus offset tool formats) and consumer-group offsets across clusters (failover)."""


def _checkpointed(store: Store, connector: str, group: str) -> list[TranslatedOffset]:
    rows = store.checkpoints(connector, group)
    if rows:
        age = (datetime.now(UTC) - min(r.updated_at for r in rows)).total_seconds()
        click.echo(f"using the checkpoints stored in Postgres (oldest {age:.0f}s old)", err=True)
    return [
        TranslatedOffset(
            group,
            r.topic,
            r.partition,
            r.source_offset,
            r.destination_topic,
            r.destination_partition,
            r.destination_offset,
        )
        for r in rows
    ]


@offsets.command("translate")
@click.option("--connector", "connector", required=True, help="The connector replicating the group's topics.")
@click.option("--group", "group", required=True, help="The consumer group (same name at source and destination).")
@click.option("--apply", "apply", is_flag=True, help="Commit the result into the destination group (idle only).")
@click.option("--format", "fmt", type=click.Choice(["csv", "json"]), default="csv", show_default=True)
@click.option("--database-url", envvar="MIRUS_DATABASE_URL", help="The platform's Postgres (default: local stack).")
def translate(connector: str, group: str, apply: bool, fmt: str, database_url: str | None) -> None:
    """Print GROUP's offsets translated to CONNECTOR's destination (and with --apply, commit them there)."""
    store = Store(make_engine(database_url or LocalStack(PlatformSettings.from_env()).endpoints.database_url))
    try:
        config = load(store.get_connector(connector).properties)
    except UnknownConnectorError as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(EXIT_NOTHING) from exc
    try:
        source_cluster = cluster_id(
            ClusterAdmin(config.admin_settings("source")), "source", config.source_cluster_alias
        )
        destination = ClusterAdmin(config.admin_settings("destination"))
        destination_cluster = cluster_id(destination, "destination", config.target_cluster_alias)
        translated = translate_group(config, store, group, source_cluster, destination_cluster)
    except (ClusterIdentityError, TranslationError) as exc:
        click.echo(f"cannot translate now: {exc}", err=True)
        translated = _checkpointed(store, connector, group)
    if not translated:
        click.echo(f"no offsets of group {group!r} for connector {connector!r}", err=True)
        raise SystemExit(EXIT_NOTHING)
    if fmt == "json":
        for t in translated:
            click.echo(json.dumps({"group": t.group, **t.row()}))
    else:
        click.echo(",".join(COLUMNS))
        for t in translated:
            click.echo(",".join(str(getattr(t, c)) for c in COLUMNS))
    behind = [t for t in translated if not t.complete]
    for t in behind:
        click.echo(
            f"{t.topic}[{t.partition}]: the destination does not yet hold every record before offset "
            f"{t.source_offset}; wait for the connector to catch up and run this again",
            err=True,
        )
    if apply:
        if behind:
            click.echo("not applied: some translations are not complete yet", err=True)
            raise SystemExit(EXIT_NOT_APPLIED)
        written, problem = write_group_offsets(ClusterAdmin(config.admin_settings("destination")), group, translated)
        if problem:
            click.echo(f"not applied: {problem}", err=True)
            raise SystemExit(EXIT_NOT_APPLIED)
        click.echo(f"applied {len(written)} offset(s) to destination group {group!r}", err=True)


for _command in OFFSET_COMMANDS:  # connectors' own offsets, next to the consumer groups' translation
    offsets.add_command(_command)
