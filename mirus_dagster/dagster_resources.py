"""The code location's Dagster resources, configured from the environment (embedded stack by default)."""

import threading

import dagster as dg
from pydantic import Field

from replicator.state.database import make_engine, task_engine, upgrade_if_behind, worker_engine
from replicator.state.store import Store

_stores: dict[str, Store] = {}
_lock = threading.Lock()


class PlatformDatabase(dg.ConfigurableResource):
    """The platform's Postgres: connectors, assignments, task leases, offsets, snapshots and metrics."""

    database_url: str = Field(description="SQLAlchemy/libpq URL of the platform database (MIRUS_DATABASE_URL).")

    def store(self) -> Store:
        """One engine (connection pool) per process and URL; the schema is migrated on first use if behind."""
        with _lock:
            store = _stores.get(self.database_url)
            if store is None:
                engine = make_engine(self.database_url)
                upgrade_if_behind(engine)
                store = _stores[self.database_url] = Store(engine)
            return store

    def worker_store(self) -> Store:
        """A worker run's store, shared by the tasks it hosts (`replicator.state.database.worker_engine`)."""
        return Store(worker_engine(self.database_url))

    def task_store(self) -> Store:
        """A replicator run's store: two connections, and never a migration
        (`replicator.state.database.task_engine`)."""
        return Store(task_engine(self.database_url))


class SupervisorPolicy(dg.ConfigurableResource):
    """How failed replicator tasks are restarted (Mirus: `mirus.task.auto.restart.enabled`)."""

    auto_restart: bool = Field(default=True, description="Restart failed, crashed or silent tasks automatically.")
    initial_backoff_s: float = Field(
        default=1.0, gt=0, description="Wait before the second restart in a row; the first one is immediate."
    )
    max_backoff_s: float = Field(default=60.0, gt=0, description="Cap of the doubling wait between restarts.")


class FailureWebhook(dg.ConfigurableResource):
    """Where the run-failure sensor posts each failed replicator or admin run (MIRUS_ALERT_WEBHOOK_URL; unset: none).

    The body is JSON with a `text` line (what Slack's and Mattermost's incoming webhooks show) and the run's fields.
    """

    url: str | None = Field(default=None, description="URL of an incoming webhook; it often holds a token.")
    timeout_s: float = Field(default=5.0, gt=0, description="How long a post may take before it is given up.")
