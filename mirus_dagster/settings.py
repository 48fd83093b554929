"""Where the platform finds its clusters and database, read from the environment, and the example connector that
works on them.

Every variable is optional: unset parts are provided by the embedded local stack (`mirus/local/stack.py`), at the
endpoints resolved here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, Field

from mirus_dagster.constants import (
    ENV_DATABASE_URL,
    ENV_DESTINATION_BOOTSTRAP,
    ENV_DESTINATION_PORT,
    ENV_POSTGRES_PORT,
    ENV_REPLICATOR_WORKERS,
    ENV_SOURCE_BOOTSTRAP,
    ENV_SOURCE_PORT,
    ENV_STATE_DIR,
    EXAMPLE_TOPIC,
)

POSTGRES_DATABASE = "mirus"
# The launchpad's and README's example connector: its topics exist on the demo clusters, no connector uses them.
EXAMPLE_CONNECTOR = "payments-dr"


@dataclass(frozen=True)
class StackEndpoints:
    source_bootstrap_servers: str
    destination_bootstrap_servers: str
    database_url: str

    def describe(self) -> str:
        return (
            f"source bootstrap servers:      {self.source_bootstrap_servers}\n"
            f"destination bootstrap servers: {self.destination_bootstrap_servers}\n"
            f"database url:                  {self.database_url}"
        )

    def as_env(self) -> dict[str, str]:
        """Environment that points every platform process at this stack."""
        return {
            ENV_SOURCE_BOOTSTRAP: self.source_bootstrap_servers,
            ENV_DESTINATION_BOOTSTRAP: self.destination_bootstrap_servers,
            ENV_DATABASE_URL: self.database_url,
        }


class PlatformSettings(BaseModel):
    """The platform's view of its surroundings.

    An external value (bootstrap servers, database URL) replaces the matching embedded part entirely.
    """

    state_dir: Path = Field(description="Directory for the embedded stack's data, logs and pid file.")
    source_bootstrap_servers: str | None = Field(
        default=None, description="External source cluster; the embedded 'source' broker is not started."
    )
    destination_bootstrap_servers: str | None = Field(
        default=None,
        description="External destination cluster; the embedded 'destination' broker is not started.",
    )
    database_url: str | None = Field(
        default=None, description="External Postgres URL; the embedded Postgres is not started."
    )
    source_port: int = Field(default=19092, ge=1, le=65535)
    destination_port: int = Field(default=19093, ge=1, le=65535)
    postgres_port: int = Field(default=15432, ge=1, le=65535)
    replicator_workers: int | None = Field(
        default=None,
        ge=0,
        description="N > 0: N worker runs host every connector's tasks and standbys between them; unset: one worker "
        "per two cores of this machine (`default_workers`); 0: a Dagster run per task and per standby "
        "(docs/DEPLOYMENT.md, section 4).",
    )

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> PlatformSettings:
        env = os.environ if environ is None else environ
        values: dict[str, object] = {"state_dir": Path(env.get(ENV_STATE_DIR) or ".mirus").resolve()}
        for field, var in (
            ("source_bootstrap_servers", ENV_SOURCE_BOOTSTRAP),
            ("destination_bootstrap_servers", ENV_DESTINATION_BOOTSTRAP),
            ("database_url", ENV_DATABASE_URL),
            ("source_port", ENV_SOURCE_PORT),
            ("destination_port", ENV_DESTINATION_PORT),
            ("postgres_port", ENV_POSTGRES_PORT),
            ("replicator_workers", ENV_REPLICATOR_WORKERS),
        ):
            if env.get(var):
                values[field] = env[var]
        return cls.model_validate(values)

    def workers(self) -> int:
        """How many worker runs host the tasks (0: a run per task and per standby)."""
        return default_workers() if self.replicator_workers is None else self.replicator_workers

    def endpoints(self) -> StackEndpoints:
        """The clusters and database: the external ones configured, the embedded local stack's for the rest."""
        return StackEndpoints(
            source_bootstrap_servers=self.source_bootstrap_servers or f"127.0.0.1:{self.source_port}",
            destination_bootstrap_servers=self.destination_bootstrap_servers or f"127.0.0.1:{self.destination_port}",
            database_url=self.database_url
            or f"postgresql+psycopg2://postgres@127.0.0.1:{self.postgres_port}/{POSTGRES_DATABASE}",
        )


def default_workers() -> int:
    """One worker per two cores, at least one: a worker's owned tasks use up to ~0.6 core each at full speed, and on
    the machine that runs the platform the other half goes to Dagster, the API, Postgres and often the brokers. A
    worker hosts any number of tasks, so this sizes CPU, not capacity."""
    return max(1, (os.cpu_count() or 2) // 2)


def example_connector(endpoints: StackEndpoints) -> dict[str, object]:
    """A connector that works as is on the demo clusters: what `put_connector`'s launchpad starts from."""
    return {
        "name": EXAMPLE_CONNECTOR,
        "tasks.max": 2,
        "topics.whitelist": EXAMPLE_TOPIC,
        "destination.topic.name.suffix": ".dr",
        "consumer.bootstrap.servers": endpoints.source_bootstrap_servers,
        "destination.consumer.bootstrap.servers": endpoints.destination_bootstrap_servers,
    }
