"""`mirus`: the operator's command line."""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from mirus.local.stack import LocalStack


class LazyGroup(click.Group):
    """A group whose commands in `lazy` ("module:attribute") are imported only when they run or are listed: a
    replicator process (`mirus task run`) starts without the administration, offsets, verify and fault modules, each
    of which would add its imports to every task's start (click's documented pattern for lazy subcommands)."""

    def __init__(self, *args: Any, lazy: Mapping[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *self.lazy])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.lazy:
            return super().get_command(ctx, cmd_name)
        module, _, attribute = self.lazy[cmd_name].partition(":")
        command = getattr(importlib.import_module(module), attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"{self.lazy[cmd_name]} is not a click command")
        return command


def _stack() -> LocalStack:
    from mirus.local.stack import LocalStack
    from mirus_dagster.settings import PlatformSettings

    return LocalStack(PlatformSettings.from_env())


def _migrated_engine() -> Engine:
    """The platform database with every migration applied, or a clear error naming it and what to do."""
    from replicator.state.database import DatabaseUnavailableError, migrated_engine

    try:
        return migrated_engine(_stack().endpoints.database_url)
    except DatabaseUnavailableError as exc:
        raise click.ClickException(
            f"{exc}. Start the embedded one with `mirus stack up`, or point MIRUS_DATABASE_URL at yours."
        ) from None


@click.group(
    cls=LazyGroup,
    lazy={
        "api": "mirus.cli.admin:api_command",
        "connectors": "mirus.cli.admin:connectors_group",
        "faults": "mirus.faults.command:faults",
        "offsets": "mirus.cli.offsets:offsets",
        "verify": "mirus.cli.verify:verify",
    },
)
def main() -> None:
    """mirus-dagster: Kafka cross-cluster replication orchestrated by Dagster."""


# -- stack -------------------------------------------------------------------------------------------------


@main.group()
def stack() -> None:
    """The embedded local stack: 'source' and 'destination' clusters and Postgres."""


@stack.command("up")
def stack_up() -> None:
    """Start every embedded part that is not running yet (harmless when already up)."""
    from mirus.local.stack import StackError

    local = _stack()
    try:
        local.up()
    except StackError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(local.endpoints.describe())
    _migrated_engine().dispose()  # whatever runs on the stack next finds the platform's tables


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
    from replicator.state.database import current_revision

    engine = _migrated_engine()
    click.echo(f"database at revision {current_revision(engine)}")
    engine.dispose()


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
    import socket

    from replicator.engine.ownership import run_owned
    from replicator.engine.task import ReplicationTask, TaskExit
    from replicator.state.database import task_engine
    from replicator.state.head_notices import HeadNotices
    from replicator.state.records import UnknownConnectorError
    from replicator.state.store import Store

    store = Store(_checked(task_engine))
    owner = f"{socket.gethostname()}:{os.getpid()}"
    notices = HeadNotices(store.engine)
    with _stop_on_signals() as stop, contextlib.closing(notices):
        try:
            outcome = run_owned(ReplicationTask(store, connector, task_id, owner, notices=notices), stop.is_set)
        except KeyboardInterrupt:
            click.echo("stopped")
            return
        except UnknownConnectorError as exc:
            raise click.ClickException(f"{exc}; add it with the put_connector job first") from None
    if stop.is_set() and outcome in (None, TaskExit.STOPPED):
        click.echo("stopped")
        return
    click.echo(f"task ended: {outcome.value if outcome else 'connector deleted while standing by'}")


@main.group()
def worker() -> None:
    """Workers: processes hosting the tasks of many connectors (MIRUS_REPLICATOR_WORKERS), outside Dagster."""


@worker.command("run")
@click.argument("index", type=int)
@click.option("--workers", type=click.IntRange(min=1), required=True, help="How many workers the estate has.")
def worker_run(index: int, workers: int) -> None:
    """Run worker INDEX (0 .. workers - 1) in this process: it hosts its share of every running connector's tasks,
    as owner or standby, until Ctrl-C."""
    import socket

    from replicator.engine.worker import TaskWorker
    from replicator.state.database import worker_engine
    from replicator.state.store import Store

    if not 0 <= index < workers:
        raise click.BadParameter(f"must be 0 .. {workers - 1} for --workers {workers}", param_hint="INDEX")
    owner = f"{socket.gethostname()}:{os.getpid()}:worker-{index}"
    # A second signal raises KeyboardInterrupt: the operator does not wait.
    with _stop_on_signals() as stop, contextlib.suppress(KeyboardInterrupt):
        TaskWorker(Store(_checked(worker_engine)), index, workers, owner).run(stop.is_set)
    click.echo("stopped")


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[threading.Event]:
    """SIGINT and SIGTERM (a service manager's or Kubernetes' stop) set the event the task loops read, so a replicator
    process stops between two steps of its loop, flushing and committing. Never an exception raised wherever the main
    thread happens to be: one that lands while a pooled database connection is being handed back loses that
    connection for good, and the final commit then waits for one that never comes. A second signal raises
    KeyboardInterrupt, for an operator who will not wait."""
    stop = threading.Event()

    def asked(_signum: int, _frame: object) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()

    previous = {sig: signal.signal(sig, asked) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _checked(engine_for: Callable[[str], Engine]) -> Engine:
    """A replicator process's engine (`task_engine` or `worker_engine`), or a clear error; logs to stderr."""
    from replicator.state.database import DatabaseUnavailableError, SchemaBehindError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return engine_for(_stack().endpoints.database_url)
    except SchemaBehindError as exc:
        raise click.ClickException(str(exc)) from None
    except DatabaseUnavailableError as exc:
        raise click.ClickException(
            f"{exc}. Start the embedded one with `mirus stack up`, or point MIRUS_DATABASE_URL at yours."
        ) from None


# -- development -------------------------------------------------------------------------------------------


@main.command("dev")
@click.option("--port", default=3000, show_default=True, help="Dagster webserver port.")
@click.option("--keep-stack", is_flag=True, help="Leave the embedded stack running when mirus dev stops.")
@click.option("--demo/--no-demo", default=True, show_default=True, help="Register the demo connector and traffic.")
@click.option("--api-port", default=8083, show_default=True, help="Kafka Connect REST API port (0: no API).")
def dev(port: int, keep_stack: bool, demo: bool, api_port: int) -> None:
    """Start the embedded stack, migrate the database, run the Dagster UI and the REST API; Ctrl-C stops it all."""
    from mirus.local.dev import DevSession
    from mirus.local.devserver import DagsterDevError
    from mirus.local.stack import StackError
    from replicator.state.database import DatabaseUnavailableError

    session = DevSession(_stack(), port, demo, keep_stack, click.echo, api_port)
    # A service manager's stop is handled like a Ctrl-C; SIGINT is set too since a shell may start us with it ignored.
    signal.signal(signal.SIGTERM, _interrupted)
    signal.signal(signal.SIGINT, _interrupted)
    code = 0
    try:
        session.start()
        click.echo(f"Dagster UI: {session.url}  (Ctrl-C stops everything mirus dev started)")
        code = session.wait() or 1
    except KeyboardInterrupt:
        pass
    except (DagsterDevError, DatabaseUnavailableError, StackError) as exc:
        click.echo(f"error: {exc}", err=True)
        code = 1
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the orderly stop below is bounded; let it finish
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        session.stop()
    sys.exit(code)


def _interrupted(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


@main.group(cls=LazyGroup, lazy={"traffic": "mirus.local.traffic:traffic"})
def demo() -> None:
    """The demo data set."""


if __name__ == "__main__":
    main()
