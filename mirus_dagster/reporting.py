"""Settings of the lake export and the Spark reports, read from the environment.

`MIRUS_SPARK_MASTER` is the one Spark setting: `local[*]` (default) runs Spark inside the run's process;
`spark://host:7077` (standalone) or `k8s://https://host:443` (Kubernetes) hands the work to a cluster;
`sc://host:15002` talks to a Spark Connect server (needs the `spark-connect` extra). Anything else a cluster needs
goes into the usual `spark-defaults.conf` (directory `SPARK_CONF_DIR`), never into the code.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dagster as dg
from pydantic import Field, PrivateAttr

from mirus_dagster.constants import (
    ENV_LAKE_DIR,
    ENV_P99_THRESHOLD_MS,
    ENV_RETENTION_HOURS,
    ENV_SPARK_MASTER,
    ENV_STEP_MINUTES,
    ENV_WINDOW_HOURS,
)
from mirus_dagster.settings import PlatformSettings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_SPARK_MASTER = "local[*]"


def spark_config(master: str) -> dict[str, Any]:
    """Spark settings for `master`: a Spark Connect URL becomes `spark.remote`, anything else `spark.master`."""
    if master.startswith("sc://"):
        return {"spark.remote": master}
    config: dict[str, Any] = {
        "spark.master": master,
        "spark.app.name": "mirus-reports",
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.showConsoleProgress": "false",
    }
    if master.startswith("local"):
        # The reports' shuffles are small; Spark's default of 200 tasks per shuffle costs more than it computes.
        config["spark.sql.shuffle.partitions"] = "8"
    return config


def spark_master_from_env() -> str:
    return os.environ.get(ENV_SPARK_MASTER) or DEFAULT_SPARK_MASTER


class Reporting(dg.ConfigurableResource):
    """Where the lake is, how long Postgres keeps metric samples, and what the reports cover."""

    lake_dir: str = Field(description="Directory of the Parquet lake (MIRUS_LAKE_DIR); Spark executors read it.")
    retention_hours: float = Field(
        default=3.0, gt=0, description="Metric samples older than this leave Postgres once exported (hours)."
    )
    window_hours: float = Field(default=24.0, gt=0, description="Time the latency and throughput reports cover.")
    step_minutes: int = Field(default=5, ge=1, description="Time step of the over-time tables and charts.")
    p99_threshold_ms: int = Field(
        default=300_000, ge=1, description="The latency check fails when a destination topic's p99 exceeds this."
    )

    @property
    def lake(self) -> Path:
        return Path(self.lake_dir)

    @property
    def retention(self) -> timedelta:
        return timedelta(hours=self.retention_hours)

    @classmethod
    def from_env(cls) -> Reporting:
        env = os.environ
        values: dict[str, Any] = {
            "lake_dir": env.get(ENV_LAKE_DIR) or str(PlatformSettings.from_env().state_dir / "lake"),
        }
        for field, var in (
            ("retention_hours", ENV_RETENTION_HOURS),
            ("window_hours", ENV_WINDOW_HOURS),
            ("step_minutes", ENV_STEP_MINUTES),
            ("p99_threshold_ms", ENV_P99_THRESHOLD_MS),
        ):
            if env.get(var):
                values[field] = env[var]
        return cls(**values)


class SparkResource(dg.ConfigurableResource):
    """A Spark session for the report assets: dagster-pyspark's `PySparkResource`, imported only in a run that uses
    it. Every run process loads the code location, and replicator, worker, watcher and admin runs start from an image
    without Spark (deploy/Dockerfile's `runtime` target): nothing of pyspark may be imported before a report runs."""

    spark_config: dict[str, Any] = Field(description="Spark settings (`spark_config(MIRUS_SPARK_MASTER)`).")
    _spark_session: Any = PrivateAttr(default=None)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        from dagster_pyspark.resources import spark_session_from_config

        self._spark_session = spark_session_from_config(self.spark_config)

    @property
    def spark_session(self) -> SparkSession:
        return self._spark_session
