"""Fixtures of the report tests: one Spark session for all of them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from mirus_dagster.reporting import spark_config
from tests.fixtures.jvm import SHORT_LIVED_JVM_OPTIONS


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One local Spark session for the whole run (it takes ~20 s to start); report assets reuse it.

    The JVM compiles less and collects with one thread: the tests' small queries then cost ~40 % less CPU on 2 cores
    (the compiled code would only pay off on long jobs); results are the same."""
    jvm = {"spark.driver.extraJavaOptions": SHORT_LIVED_JVM_OPTIONS}
    session = SparkSession.builder.config(map={**spark_config("local[2]"), **jvm}).getOrCreate()
    yield session
    session.stop()
