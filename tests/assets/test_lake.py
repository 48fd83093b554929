"""The lake assets (`assets/lake.py`): the export of the platform's tables to the Parquet lake, by hour."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import dagster as dg
from sqlalchemy import Engine

from assets.lake import METRIC_SAMPLES_LAKE as METRIC_SAMPLES
from assets.lake import latest_complete_hour, platform_lake
from mirus_dagster.dagster_resources import PlatformDatabase
from mirus_dagster.reporting import Reporting


def test_the_lake_export_launched_without_an_hour_exports_the_latest_complete_one(
    db_engine: Engine, tmp_path: Path
) -> None:
    """`refresh_reports` from the launchpad with no partition chosen: the latest hour that has ended, not an error."""
    resources = {
        "platform": PlatformDatabase(database_url=db_engine.url.render_as_string(hide_password=False)),
        "reporting": Reporting(lake_dir=str(tmp_path)),
    }
    before = latest_complete_hour(datetime.now(UTC))
    result = dg.materialize([platform_lake], resources=resources)
    after = latest_complete_hour(datetime.now(UTC))
    assert result.success
    [samples] = [m for m in result.asset_materializations_for_node("platform_lake") if m.asset_key == METRIC_SAMPLES]
    assert samples.metadata["hour"].value in {f"{h:%Y-%m-%d %H}:00 UTC" for h in (before, after)}
