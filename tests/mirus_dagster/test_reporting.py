"""How the reports are wired into Dagster: the schedule's hours (`mirus_dagster/report_schedule.py`) and the
reporting settings (`mirus_dagster/reporting.py`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from mirus_dagster.report_schedule import report_run_requests
from mirus_dagster.reporting import Reporting, spark_config, spark_master_from_env


def test_schedule_reexports_the_previous_hour_until_it_is_sealed() -> None:
    early = report_run_requests(datetime(2026, 11, 22, 7, 15, tzinfo=UTC))
    assert [r.partition_key for r in early] == ["2026-11-22-07:00", "2026-11-22-06:00"]
    assert early[0].asset_selection is None  # everything: export and reports
    assert {k.to_user_string() for k in early[1].asset_selection} == {
        "lake/metric_samples",
        "lake/metadata_snapshots",
        "lake/platform_state",
    }
    late = report_run_requests(datetime(2026, 11, 22, 7, 45, tzinfo=UTC))
    assert [r.partition_key for r in late] == ["2026-11-22-07:00"]


def test_spark_master_is_one_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert spark_config("sc://spark-connect:15002") == {"spark.remote": "sc://spark-connect:15002"}
    cluster = spark_config("spark://spark-master:7077")
    assert cluster["spark.master"] == "spark://spark-master:7077" and "spark.sql.shuffle.partitions" not in cluster
    assert spark_config("local[*]")["spark.master"] == "local[*]"
    assert not any(key.startswith("spark.jars") for key in {**cluster, **spark_config("local[*]")})
    monkeypatch.setenv("MIRUS_SPARK_MASTER", "k8s://https://kubernetes:443")
    assert spark_master_from_env() == "k8s://https://kubernetes:443"
    monkeypatch.delenv("MIRUS_SPARK_MASTER")
    assert spark_master_from_env() == "local[*]"
    monkeypatch.setenv("MIRUS_LAKE_DIR", "/data/lake")
    monkeypatch.setenv("MIRUS_METRICS_RETENTION_HOURS", "6")
    reporting = Reporting.from_env()
    assert (reporting.lake, reporting.retention) == (Path("/data/lake"), timedelta(hours=6))
