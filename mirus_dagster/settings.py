"""Where the platform finds its clusters and database, read from the environment.

Every variable is optional: unset parts are provided by the embedded local stack.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, Field

from mirus_dagster.constants import (
    ENV_DATABASE_URL,
    ENV_DESTINATION_BOOTSTRAP,
    ENV_DESTINATION_PORT,
    ENV_POSTGRES_PORT,
    ENV_SOURCE_BOOTSTRAP,
    ENV_SOURCE_PORT,
    ENV_STATE_DIR,
)


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
        ):
            if env.get(var):
                values[field] = env[var]
        return cls.model_validate(values)
