"""`mirus verify`: compare source and destination topics record by record.

Exit codes let scripts and CI gate on the result: 0 all replicated, 1 records missing, out of order or changed,
2 the check could not finish (timeout, unreachable cluster, unknown source topic). Client settings may carry
credentials, so no setting's value is ever printed.
"""

from __future__ import annotations

import json
import os

import click

from mirus.local.stack import LocalStack
from mirus_dagster.constants import ENV_DESTINATION_BOOTSTRAP, ENV_SOURCE_BOOTSTRAP
from mirus_dagster.settings import PlatformSettings
from replicator.state.database import make_engine
from replicator.state.records import CopySegment
from replicator.state.store import Store
from replicator.tools.verify import VerifyError, verify_replication

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INCOMPLETE = 2


def _settings(pairs: tuple[str, ...], option: str) -> dict[str, str]:
    settings: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            # The offending text may be a secret typed without its key: do not repeat it.
            raise click.BadParameter("expected KEY=VALUE", param_hint=option)
        settings[key.strip()] = value
    return settings


def _topics(specs: tuple[str, ...]) -> dict[str, str]:
    """SRC or SRC:DEST (Kafka topic names cannot contain ':'); the same source twice must agree."""
    topics: dict[str, str] = {}
    for spec in specs:
        source, _, destination = spec.partition(":")
        destination = destination or source
        if not source:
            raise click.BadParameter(f"{spec!r} has no source topic", param_hint="--topic")
        if topics.get(source, destination) != destination:
            raise click.BadParameter(f"{source} is given two destination topics", param_hint="--topic")
        topics[source] = destination
    return topics


def _bootstrap(explicit: str | None, settings: dict[str, str], env_var: str, side: str) -> str:
    """The option, else the client settings, else the platform's environment, else the local stack."""
    if explicit:
        return explicit
    if settings.get("bootstrap.servers"):
        return settings["bootstrap.servers"]
    if os.environ.get(env_var):
        return os.environ[env_var]
    endpoints = LocalStack(PlatformSettings.from_env()).endpoints
    return endpoints.source_bootstrap_servers if side == "source" else endpoints.destination_bootstrap_servers


@click.command("verify")
@click.option(
    "--source-bootstrap",
    metavar="HOST:PORT",
    help=f"Source cluster [default: ${ENV_SOURCE_BOOTSTRAP}, else the local stack].",
)
@click.option(
    "--destination-bootstrap",
    metavar="HOST:PORT",
    help=f"Destination cluster [default: ${ENV_DESTINATION_BOOTSTRAP}, else the local stack].",
)
@click.option(
    "--topic",
    "topic_specs",
    multiple=True,
    required=True,
    metavar="SRC[:DEST]",
    help="A source topic and its destination topic (the same name if DEST is left out). Repeatable.",
)
@click.option(
    "--source-config",
    multiple=True,
    metavar="KEY=VALUE",
    help="A librdkafka setting for the source client, e.g. security.protocol=SSL. Repeatable.",
)
@click.option(
    "--destination-config",
    multiple=True,
    metavar="KEY=VALUE",
    help="A librdkafka setting for the destination client. Repeatable.",
)
@click.option(
    "--connector",
    help="The connector that replicates the topics: copies it made as record batches (which carry no provenance "
    "headers) are attributed through the segments the platform database keeps.",
)
@click.option(
    "--database-url",
    envvar="MIRUS_DATABASE_URL",
    help="The platform's Postgres, with --connector (default: local stack).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option(
    "--idle-seconds",
    type=click.FloatRange(min=0.1),
    default=3.0,
    show_default=True,
    help="Stop reading the destination once no copy of a checked record arrived for this long (and a source "
    "partition whose broker reports no usable end offset once it is quiet this long).",
)
@click.option(
    "--timeout-seconds",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    help="Give up (exit code 2) after this long.",
)
@click.pass_context
def verify(
    ctx: click.Context,
    source_bootstrap: str | None,
    destination_bootstrap: str | None,
    topic_specs: tuple[str, ...],
    source_config: tuple[str, ...],
    destination_config: tuple[str, ...],
    connector: str | None,
    database_url: str | None,
    as_json: bool,
    idle_seconds: float,
    timeout_seconds: float,
) -> None:
    """Check that every source record reached its destination topic, once, in order and unchanged.

    The source is checked up to a snapshot taken when the command starts (its end offsets), so the check ends
    on a running platform with traffic flowing; the report says where each partition was checked up to.

    Exit code 0: all replicated (duplicates are allowed and counted); 1: records missing, out of order or
    changed; 2: the check could not finish. Copies made as record batches carry no provenance headers: name
    their connector (--connector) to attribute them exactly.
    """
    source = _settings(source_config, "--source-config")
    destination = _settings(destination_config, "--destination-config")
    source["bootstrap.servers"] = _bootstrap(source_bootstrap, source, ENV_SOURCE_BOOTSTRAP, "source")
    destination["bootstrap.servers"] = _bootstrap(
        destination_bootstrap, destination, ENV_DESTINATION_BOOTSTRAP, "destination"
    )
    topics = _topics(topic_specs)
    segments: list[CopySegment] = []
    if connector:
        store = Store(make_engine(database_url or LocalStack(PlatformSettings.from_env()).endpoints.database_url))
        try:
            stored = store.load_segments(connector)
        finally:
            store.engine.dispose()
        segments = [g for (topic, _p), held in stored.items() if topic in topics for g in held]
    try:
        report = verify_replication(
            source, destination, topics, timeout_s=timeout_seconds, idle_s=idle_seconds, segments=segments
        )
    except VerifyError as exc:
        click.echo(f"error: {exc}", err=True)
        ctx.exit(EXIT_INCOMPLETE)
    click.echo(json.dumps(report.to_json(), indent=2) if as_json else report.to_text())
    if not report.complete:
        ctx.exit(EXIT_INCOMPLETE)
    ctx.exit(EXIT_OK if report.ok else EXIT_FAILED)
