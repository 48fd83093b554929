"""The report assets in a Python process of their own, on the Spark that `MIRUS_SPARK_MASTER` names, as a report run
of the deployment runs them.

A process holds one SparkSession (`getOrCreate`) and the test process already holds a local one, so the tests run
this module in a subprocess to run the reports on a standalone cluster or through Spark Connect:

    python -m tests.reports.spark_driver LAKE OUT_JSON

materializes the report assets on LAKE with the `pyspark` resource `mirus_dagster.definitions` gives them
(`SparkResource(spark_config=spark_config(spark_master_from_env()))`), then writes the tables they wrote to the lake
and the outcome of their checks to OUT_JSON.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from assets.reports import report_assets, report_path
from mirus_dagster.reporting import Reporting, SparkResource, spark_config, spark_master_from_env

REPORT_TABLES = ("replication_latency", "missing_partitions", "throughput_lag")


def plain(value: Any) -> Any:
    """`value` as JSON holds it; timestamps as ISO-8601 text, so that both sides compare them as written."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def report_tables(lake: Path) -> dict[str, list[dict[str, Any]]]:
    """The full tables the report assets wrote to `lake`, rows in a fixed order (a table's files carry none)."""
    tables = {}
    for name in REPORT_TABLES:
        rows = [plain(r) for r in pq.read_table(report_path(lake, name)).to_pylist()]
        tables[name] = sorted(rows, key=lambda r: json.dumps(r, sort_keys=True))
    return tables


def materialize_reports(lake: Path, spark_conf: dict[str, Any]) -> dict[str, Any]:
    """Run the report assets on `lake` with Spark configured by `spark_conf`: the tables they wrote and the outcome
    of their checks, JSON-ready."""
    resources = {"reporting": Reporting(lake_dir=str(lake)), "pyspark": SparkResource(spark_config=spark_conf)}
    result = dg.materialize(report_assets, resources=resources, raise_on_error=True)
    checks = sorted(
        [e.asset_key.to_user_string(), e.check_name, e.passed, e.description]
        for e in result.get_asset_check_evaluations()
    )
    return {"tables": report_tables(lake), "checks": checks}


def main(lake: str, out: str) -> None:
    conf = spark_config(spark_master_from_env())
    # The session the assets' resource gets (`getOrCreate`), made here so that it is stopped here.
    spark = SparkSession.builder.config(map=conf).getOrCreate()
    try:
        reports = materialize_reports(Path(lake), conf)
    finally:
        spark.stop()
    Path(out).write_text(json.dumps(reports))


if __name__ == "__main__":
    main(*sys.argv[1:])
