"""The monitoring kit in deploy/monitoring/: the Grafana dashboard and the Prometheus alert rules.

Every PromQL expression of the dashboard and of the rules names only series that the exporter really exposes:
a connector replicates real traffic (with a source topic whose destination is missing, and heartbeats) through a
task, the API serves `/metrics`, and the names are checked against what a scrape returns, with samples. The rules
pass Debian's `promtool check rules` and `promtool test rules` (deploy/monitoring/mirus-alerts.test.yaml fires
and clears every alert); promtool is installed like the other Debian tools (tests/fixtures/debian.py).
"""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from mirus.api.auth import ApiSettings
from mirus.waiting import wait_until
from mirus_dagster.settings import StackEndpoints
from replicator.configuration.connector import validate_submission
from replicator.discovery.heartbeats import HEARTBEATS_TOPIC
from replicator.discovery.monitor import KafkaMonitor
from replicator.state.store import Store
from tests.fixtures.api_helpers import serve_api
from tests.fixtures.debian import DebianPackageError, ensure_debian_packages
from tests.fixtures.engine_helpers import TaskThread, connector_properties
from tests.fixtures.kafka_helpers import create_topics, produce

MONITORING = Path(__file__).resolve().parents[2] / "deploy" / "monitoring"
DASHBOARD = MONITORING / "mirus-dashboard.json"
RULES = MONITORING / "mirus-alerts.yaml"
RULE_TESTS = MONITORING / "mirus-alerts.test.yaml"
PROMTOOL = Path("/usr/bin/promtool")
# Series Prometheus itself makes for every scrape target, not the exporter.
SCRAPE_SERIES = {"up"}
# PromQL words that look like series names: keywords and the label-list modifiers.
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}


def series_names(expr: str) -> set[str]:
    """The series a PromQL expression (or a Grafana query with `$variables`) selects, by name."""
    expr = re.sub(r"label_values\(\s*([a-zA-Z_:][\w:]*)\s*,[^)]*\)", r"\1", expr)  # Grafana: label_values(series, l)
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges and subqueries
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)  # label lists
    expr = re.sub(r"\$\{?\w+\}?", "", expr)  # Grafana variables
    found = re.finditer(r"(?<![\w.:])([a-zA-Z_:][\w:]*)\s*(\()?", expr)
    return {m.group(1) for m in found if m.group(2) is None} - PROMQL_WORDS  # a name before "(" is a function


def dashboard_expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    exprs += [v["definition"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return exprs


def rule_expressions() -> list[str]:
    return [rule["expr"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def scrape(api: str) -> dict[str, int]:
    """Sample name -> how many samples of it one scrape of `/metrics` returns."""
    counts: dict[str, int] = {}
    for family in text_string_to_metric_families(requests.get(f"{api}/metrics", timeout=30).text):
        for sample in family.samples:
            counts[sample.name] = counts.get(sample.name, 0) + 1
    return counts


def referenced_series() -> set[str]:
    return {name for expr in dashboard_expressions() + rule_expressions() for name in series_names(expr)}


@pytest.fixture(scope="module")
def replicating(stack: StackEndpoints, db_engine: Any) -> Iterator[tuple[str, Store, str, TaskThread]]:
    """The API's URL over a connector replicating real traffic through a task: one topic copied, one whose
    destination is missing, heartbeats flowing."""
    store = Store(db_engine)
    name = f"monitoring-{uuid.uuid4().hex[:8]}"
    topic, missing, suffix = f"{name}-orders", f"{name}-nodest", f".{name}"
    create_topics(stack.source_bootstrap_servers, {topic: 2, missing: 1})
    # The destination lacks `missing`'s topic only (topic creation is off); the flow's heartbeats have theirs.
    create_topics(stack.destination_bootstrap_servers, {f"{topic}{suffix}": 2, f"{HEARTBEATS_TOPIC}{suffix}": 1})
    properties = connector_properties(
        stack,
        name,
        **{
            "topics.regex": f"{name}-.*",
            "destination.topic.name.suffix": suffix,
            "topic.creation.enable": "false",
            "emit.heartbeats.interval.seconds": "1",
        },
    )
    config = validate_submission(properties)
    store.put_connector(config.name, config.raw, config.tasks_max)
    monitor = KafkaMonitor(store)
    wait_until(lambda: (HEARTBEATS_TOPIC, 0) in monitor.poll(name).plan.replicate, what="heartbeats assigned")
    runner = TaskThread.start(store, name)
    try:
        produce(
            stack.source_bootstrap_servers, [{"topic": topic, "partition": i % 2, "value": b"x"} for i in range(50)]
        )
        with serve_api(store, ApiSettings(), stack.destination_bootstrap_servers) as api:

            def every_series_sampled() -> bool:
                monitor.poll(name)  # emits the next heartbeat and collects the last one's acknowledgement
                scraped = scrape(api)
                return all(scraped.get(s) for s in referenced_series() - SCRAPE_SERIES)

            wait_until(every_series_sampled, timeout=90, interval=1.0, what="a sample of every series referenced")
            yield api, store, name, runner
    finally:
        runner.finish()
        store.delete_connector(name)


def test_series_names_are_read_from_promql_and_grafana_queries() -> None:
    """The extractor the checks below rely on: it must find the names, and nothing else."""
    assert series_names(
        'histogram_quantile(0.99, sum by (connector, le) (rate(mirus_x_bucket{connector=~"$connector"}[5m]))) > 60'
    ) == {"mirus_x_bucket"}
    assert series_names("topk($worst, mirus_lag) and on(connector) delta(mirus_y[10m] offset 1h) > 0") == {
        "mirus_lag",
        "mirus_y",
    }
    assert series_names('up{job="mirus"} == 0') == {"up"}
    assert series_names("label_values(mirus_connector_tasks, connector)") == {"mirus_connector_tasks"}
    assert len(dashboard_expressions()) >= 13 and len(rule_expressions()) == 8


def test_every_dashboard_and_alert_expression_names_series_the_exporter_exposes(
    replicating: tuple[str, Store, str, TaskThread],
) -> None:
    api, *_ = replicating
    scraped = scrape(api)
    for expr in dashboard_expressions() + rule_expressions():
        unknown = {name for name in series_names(expr) if name not in SCRAPE_SERIES and not scraped.get(name)}
        assert not unknown, f"{expr!r} names series the exporter does not expose: {unknown}"


def test_the_exporter_gives_the_heartbeat_ages_the_alerts_read(replicating: tuple[str, Store, str, TaskThread]) -> None:
    api, store, name, runner = replicating
    ages = {
        (s.name, s.labels.get("task")): s.value
        for family in text_string_to_metric_families(requests.get(f"{api}/metrics", timeout=30).text)
        for s in family.samples
        if s.labels.get("connector") == name and s.name.endswith("_heartbeat_age_seconds")
    }
    lease = store.lease_of(name, 0)
    assert lease is not None and lease.heartbeat_at is not None
    # The task heartbeats every 2 s (task.heartbeat.interval.ms) while it runs: far from the 30 s of the alert.
    assert 0 <= ages[("mirus_task_heartbeat_age_seconds", "0")] < 30, ages
    assert ages[("mirus_flow_heartbeat_age_seconds", None)] >= 0, ages
    runner.finish()  # the lease is released: no run holds the task, so it has no heartbeat age

    def task_age_gone() -> bool:
        return ("mirus_task_heartbeat_age_seconds", "0") not in {
            (s.name, s.labels.get("task"))
            for family in text_string_to_metric_families(requests.get(f"{api}/metrics", timeout=30).text)
            for s in family.samples
            if s.labels.get("connector") == name
        }

    wait_until(task_age_gone, timeout=30, what="the stopped task's heartbeat age to leave the scrape")


@pytest.fixture(scope="module")
def promtool() -> Path:
    try:
        ensure_debian_packages(("prometheus",), (PROMTOOL,))
    except DebianPackageError as exc:
        pytest.skip(f"promtool (Debian package prometheus) cannot be installed here: {exc}")
    return PROMTOOL


def test_the_alert_rules_pass_promtool_check(promtool: Path) -> None:
    result = subprocess.run([promtool, "check", "rules", RULES], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 8 rules found" in result.stdout


def test_every_alert_fires_and_clears_in_promtool_unit_tests(promtool: Path) -> None:
    alerts = {rule["alert"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]}
    cases = [case for test in yaml.safe_load(RULE_TESTS.read_text())["tests"] for case in test["alert_rule_test"]]
    fired = {c["alertname"] for c in cases if c["exp_alerts"]}
    cleared = {c["alertname"] for c in cases if not c["exp_alerts"]}
    assert fired == alerts and cleared == alerts, (alerts - fired, alerts - cleared)
    result = subprocess.run(
        [promtool, "test", "rules", RULE_TESTS.name], cwd=MONITORING, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_dashboard_is_importable_grafana_json() -> None:
    """What Grafana's import needs: unique panel ids on the grid, and every query on the `datasource` variable."""
    dashboard = json.loads(DASHBOARD.read_text())
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "connector", "worst"} <= variables
    for panel in panels:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert all(t["datasource"]["uid"] == "${datasource}" and t["expr"] for t in panel["targets"]), panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
