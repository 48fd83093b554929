"""`mirus`: the operator's command line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import click

from mirus_dagster.admin_cli import OFFSET_COMMANDS, api_command, connectors_group
from mirus_dagster.demo import traffic
from mirus_dagster.offsets_command import offsets
from mirus_dagster.settings import PlatformSettings
from mirus_dagster.stack import LocalStack, StackError
from mirus_dagster.verify_command import verify


def _stack() -> LocalStack:
    return LocalStack(PlatformSettings.from_env())


def _database_url() -> str:
    return _stack().endpoints.database_url


@click.group()
def main() -> None:
    """mirus-dagster: Kafka cross-cluster replication orchestrated by Dagster."""


# -- stack -------------------------------------------------------------------------------------------------


@main.group()
def stack() -> None:
    """The embedded local stack: 'source' and 'destination' clusters and Postgres."""


def _print_endpoints(local: LocalStack) -> None:
    ep = local.endpoints
    click.echo(f"source bootstrap servers:      {ep.source_bootstrap_servers}")
    click.echo(f"destination bootstrap servers: {ep.destination_bootstrap_servers}")
    click.echo(f"database url:                  {ep.database_url}")


@stack.command("up")
def stack_up() -> None:
    """Start every embedded part that is not running yet (harmless when already up)."""
    local = _stack()
    try:
        local.up()
    except StackError as exc:
        raise click.ClickException(str(exc)) from exc
    _print_endpoints(local)


@stack.command("down")
def stack_down() -> None:
    """Stop every process `stack up` started."""
    stopped = _stack().down()
    click.echo(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")


@stack.command("status")
def stack_status() -> None:
    """Show each part, its endpoint and pid."""
    for part in _stack().status():
        pid = f" pid={part.pid}" if part.pid else ""
        click.echo(f"{part.name:<12} {part.state:<9} {part.endpoint}{pid}")


# -- database ----------------------------------------------------------------------------------------------


@main.group()
def db() -> None:
    """The platform database schema."""


@db.command("upgrade")
def db_upgrade() -> None:
    """Apply every pending migration (idempotent)."""
    from replicator.database import current_revision, make_engine, upgrade

    engine = make_engine(_database_url())
    upgrade(engine)
    click.echo(f"database at revision {current_revision(engine)}")


# -- tasks -------------------------------------------------------------------------------------------------


@main.group()
def task() -> None:
    """Replicator tasks outside Dagster (debugging, or another process supervisor)."""


@task.command("run")
@click.argument("connector")
@click.argument("task_id", type=int)
def task_run(connector: str, task_id: int) -> None:
    """Run one task of CONNECTOR in this process until it is removed, paused, deleted or fenced (Ctrl-C stops it).

    While another process owns the task, this one stands by and takes over the moment that one dies."""
    import logging
    import socket

    from replicator.database import make_engine
    from replicator.ownership import run_owned
    from replicator.store import Store
    from replicator.task import ReplicationTask

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    store = Store(make_engine(_database_url()))
    owner = f"{socket.gethostname()}:{os.getpid()}"
    try:
        outcome = run_owned(ReplicationTask(store, connector, task_id, owner))
    except KeyboardInterrupt:
        click.echo("stopped")
        return
    click.echo(f"task ended: {outcome.value if outcome else 'connector deleted while standing by'}")


# -- development -------------------------------------------------------------------------------------------


@main.command("dev")
@click.option("--port", default=3000, show_default=True, help="Dagster webserver port.")
@click.option("--keep-stack", is_flag=True, help="Leave the embedded stack running when dagster dev exits.")
@click.option("--demo/--no-demo", default=True, show_default=True, help="Register the demo connector and traffic.")
@click.option("--api-port", default=8083, show_default=True, help="Kafka Connect REST API port (0: no API).")
def dev(port: int, keep_stack: bool, demo: bool, api_port: int) -> None:
    """Start the embedded stack, migrate the database and run the Dagster UI and the REST API on it."""
    from mirus_dagster.constants import DEMO_CONNECTOR, DEMO_TOPIC
    from mirus_dagster.demo import register_demo
    from mirus_dagster.devserver import dagster_dev_command, write_dagster_home
    from replicator.database import make_engine, upgrade
    from replicator.store import Store

    local = _stack()
    try:
        endpoints = local.up()
    except StackError as exc:
        raise click.ClickException(str(exc)) from exc
    _print_endpoints(local)
    engine = make_engine(endpoints.database_url)
    upgrade(engine)

    dagster_home = write_dagster_home(local.state_dir / "dagster-home")
    env = {**os.environ, **endpoints.as_env(), "DAGSTER_HOME": str(dagster_home)}
    children = []
    if demo:
        register_demo(endpoints, Store(engine))
        click.echo(f"demo: connector {DEMO_CONNECTOR} copies {DEMO_TOPIC} to {DEMO_TOPIC}.mirror; traffic is running")
        traffic = [sys.executable, "-m", "mirus_dagster.cli", "demo", "traffic",
                   "--bootstrap-servers", endpoints.source_bootstrap_servers]  # fmt: skip
        children.append(subprocess.Popen(traffic, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    if api_port:
        api = [sys.executable, "-m", "mirus_dagster.cli", "api", "--port", str(api_port)]
        children.append(subprocess.Popen(api, env=env))
        click.echo(f"Kafka Connect REST API and /metrics: http://127.0.0.1:{api_port}")
    engine.dispose()

    argv = dagster_dev_command(port)
    click.echo(f"Dagster UI: http://127.0.0.1:{port}")
    # The child must handle SIGINT even when we were started with it ignored (e.g. from a background shell).
    dagster = subprocess.Popen(argv, env=env, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    # Ctrl-C reaches dagster dev directly (same process group); a SIGTERM to us is passed on so that it, too,
    # stops its webserver, daemon and code servers before the stack goes down.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda signum, _frame: dagster.send_signal(signum))
    try:
        dagster.wait()
    finally:
        for child in children:
            child.terminate()
            child.wait(10)
        if not keep_stack:
            local.down()
    sys.exit(dagster.returncode)


@main.group()
def demo() -> None:
    """The demo data set."""


demo.add_command(traffic)
main.add_command(verify)
main.add_command(offsets)
for command in OFFSET_COMMANDS:  # connectors' own offsets, next to the consumer groups' translation
    offsets.add_command(command)
main.add_command(connectors_group)
main.add_command(api_command)


if __name__ == "__main__":
    main()
