"""A new user's first hour: `mirus dev` as the README starts it, its console, the Dagster UI in a real headless
Chromium, the CLI against the running demo, and Ctrl-C.

One `mirus dev` (and so one `dagster dev`) serves the whole module; it runs on the session's clusters and on a
database of its own, so that what it leaves behind after Ctrl-C (offsets, runs) can be checked. The tests run
in file order; the last one stops it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
import yaml
from sqlalchemy import create_engine, text

from mirus_dagster.constants import DEMO_CONNECTOR, DEMO_TOPIC, TAG_CONNECTOR
from mirus_dagster.demo import EXAMPLE_CONNECTOR, example_connector
from mirus_dagster.devserver import DagsterDev
from mirus_dagster.settings import PlatformSettings
from mirus_dagster.stack import LocalStack, StackEndpoints, free_port
from replicator import provenance
from replicator.database import make_engine
from replicator.store import Store
from tests.browser import Browser, start_chromium
from tests.kafka_helpers import wait_for

ROOT = Path(__file__).resolve().parent.parent
CONNECTOR = TAG_CONNECTOR


@dataclass
class Demo:
    dev: DagsterDev
    console: Path
    endpoints: StackEndpoints
    ui_answered_when_announced: bool

    @property
    def store(self) -> Store:
        return Store(make_engine(self.endpoints.database_url))

    def console_text(self) -> str:
        return self.console.read_text(errors="replace")


@pytest.fixture(scope="module")
def demo(stack: StackEndpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    workdir = tmp_path_factory.mktemp("mirus-dev")
    database = f"first_hour_{os.getpid()}_{int(time.time())}"
    admin = create_engine(stack.database_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{database}"'))
    admin.dispose()
    endpoints = StackEndpoints(
        stack.source_bootstrap_servers,
        stack.destination_bootstrap_servers,
        stack.database_url.rsplit("/", 1)[0] + f"/{database}",
    )
    port = free_port()
    env = {**os.environ, **endpoints.as_env(), "MIRUS_STATE_DIR": str(workdir / "state"), "PYTHONUNBUFFERED": "1"}
    console = workdir / "console.log"
    with console.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "mirus_dagster.cli", "dev", "--port", str(port)],
            env=env, cwd=workdir, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: a SIGINT to it is what Ctrl-C in a terminal sends
        )  # fmt: skip
    dev = DagsterDev(process, port, workdir / "state" / "dagster-home", console)
    try:
        announced = dev.until(lambda: f"Dagster UI: {dev.url}" in console.read_text(), 240, "the UI address")
        answered = bool(announced) and requests.get(f"{dev.url}/server_info", timeout=5).ok
        dev.wait_until_ready()
        yield Demo(dev, console, endpoints, answered)
    finally:
        dev.shutdown()


@pytest.fixture(scope="module")
def browser(chromium: None) -> Iterator[Browser]:
    started = start_chromium()
    yield started
    started.quit()


def page_text(browser: Browser, url: str, *expected: str, timeout: float = 90) -> str:
    """Open `url` and wait until the page shows every `expected` text; the page's text."""
    browser.driver.get(url)
    body: list[str] = []

    def shows_all() -> bool:
        body[:] = [browser.driver.find_element("tag name", "body").text]
        return all(e in body[0] for e in expected)

    try:
        wait_for(shows_all, timeout, 0.5, what=f"{url} to show {expected}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n--- page text ---\n{body[0][:3000] if body else ''}") from None
    return body[0]


# -- the console --------------------------------------------------------------------------------------------


def test_the_start_is_quiet_and_names_the_ui_once_it_answers(demo: Demo) -> None:
    console = demo.console_text()

    assert demo.ui_answered_when_announced, "the UI address was printed before the UI answered"
    assert console.count("Dagster UI: ") == 1, console
    for noise in ("Warning", "Traceback", "dg dev", "%6|", "DEBUG", "INFO"):
        assert noise not in console, f"{noise!r} on the console:\n{console}"
    assert f"demo: connector {DEMO_CONNECTOR} copies {DEMO_TOPIC} to {DEMO_TOPIC}.mirror" in console
    # Dagster's first-visit community modal is turned off by the platform's instance settings.
    assert demo.dev.query("query { shouldShowNux }")["shouldShowNux"] is False


# -- the UI in a browser ------------------------------------------------------------------------------------


def test_the_connectors_page_lists_the_demo_connector_running_with_its_tasks(demo: Demo, browser: Browser) -> None:
    demo.dev.wait_for_runs({CONNECTOR: DEMO_CONNECTOR}, statuses={"STARTED"}, count=2, job_name="replicator",
                           timeout=120, what="both demo tasks running")  # fmt: skip
    text = page_text(browser, f"{demo.dev.url}/assets/connectors", DEMO_CONNECTOR, "RUNNING", "0: RUNNING",
                     "1: RUNNING", "partitions")  # fmt: skip
    row = next(line for line in text.splitlines() if line.startswith(DEMO_CONNECTOR))
    shown = re.match(rf"{DEMO_CONNECTOR} RUNNING (\d+) ", row)  # its state, then its partitions
    per_task = [int(n) for n in re.findall(r"\d: RUNNING \((\d+) partitions, run [0-9a-f]{8}", row)]
    assert shown and len(per_task) == 2, row  # both tasks, each with its run
    assert int(shown.group(1)) == sum(per_task) >= 3, row  # the three partitions of `orders` at least
    assert "UNASSIGNED" not in text and "heartbeat never" not in text, text[:3000]


def test_the_launchpad_opens_with_an_example_that_is_accepted_as_is(demo: Demo, browser: Browser) -> None:
    location = demo.dev.query("query { workspaceOrError { ... on Workspace { locationEntries { name } } } }")
    name = location["workspaceOrError"]["locationEntries"][0]["name"]
    page_text(browser, f"{demo.dev.url}/locations/{name}/jobs/put_connector/playground", f"name: {EXAMPLE_CONNECTOR}",
              "No errors")  # fmt: skip
    launch = next(b for b in browser.driver.find_elements("tag name", "button") if b.text.strip() == "Launch Run")
    wait_for(launch.is_enabled, 60, 0.5, what="the Launch Run button to be enabled (config validated)")
    launch.click()
    (put,) = demo.dev.wait_for_runs(job_name="put_connector", timeout=120, what="the run Launch Run started")

    run = demo.dev.wait_for_status(put.run_id, {"SUCCESS"}, timeout=120)

    # Its page names the connector it acted on (the op's event), and it carries the connector's tag.
    page_text(browser, f"{demo.dev.url}/runs/{run.run_id}", f"connector {EXAMPLE_CONNECTOR} stored as version 1")
    assert run.tags[CONNECTOR] == EXAMPLE_CONNECTOR, run.tags
    record = demo.store.get_connector(EXAMPLE_CONNECTOR)
    assert record.state == "RUNNING"
    # The example replicates on the demo clusters: its tasks are started by the monitor.
    demo.dev.wait_for_runs({CONNECTOR: EXAMPLE_CONNECTOR}, statuses={"STARTED"}, count=2, job_name="replicator",
                           timeout=120, what="the example connector's two tasks running")  # fmt: skip


def test_the_readme_example_is_the_launchpad_example_for_the_default_clusters() -> None:
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```yaml\n(.*?)```", readme, re.S)
    assert block is not None
    example = yaml.safe_load(textwrap.dedent(block.group(1)))
    default_endpoints = LocalStack(PlatformSettings(state_dir=Path("unused"))).endpoints
    properties = example["ops"]["store_connector"]["config"]["properties"]
    assert properties == example_connector(default_endpoints)


def test_a_run_page_names_its_connector(demo: Demo, browser: Browser) -> None:
    (run, *_) = demo.dev.wait_for_runs({CONNECTOR: DEMO_CONNECTOR}, statuses={"STARTED"}, job_name="replicator",
                                       timeout=60)  # fmt: skip
    task = f"{DEMO_CONNECTOR}-{run.tags['mirus/task']}"
    # The run's own events name the connector's task (an owner's "replicating …", a standby's "standing by …"), and
    # so do its tags.
    page_text(browser, f"{demo.dev.url}/runs/{run.run_id}", f"{task}: ")
    tags = next(b for b in browser.driver.find_elements("tag name", "button") if "View tags and config" in b.text)
    tags.click()
    wait_for(lambda: f"{CONNECTOR}" in browser.driver.find_element("tag name", "body").text, 30, 0.5,
             what="the run's tags")  # fmt: skip
    assert DEMO_CONNECTOR in browser.driver.find_element("tag name", "body").text


# -- the CLI against the running demo ------------------------------------------------------------------------


def test_verify_on_the_running_demo_ends_with_a_verdict(demo: Demo) -> None:
    """The demo's traffic never stops: the check is bounded by the source's end offsets taken at its start."""
    demo.dev.wait_for_runs({CONNECTOR: DEMO_CONNECTOR}, statuses={"STARTED"}, count=2, job_name="replicator",
                           timeout=120)  # fmt: skip
    env = {**os.environ, **demo.endpoints.as_env()}
    result = subprocess.run(
        [sys.executable, "-m", "mirus_dagster.cli", "verify", "--topic", f"{DEMO_TOPIC}:{DEMO_TOPIC}.mirror"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "result: OK" in result.stdout
    assert "checked up to" in result.stdout


# -- Ctrl-C ------------------------------------------------------------------------------------------------


def test_ctrl_c_ends_replicator_runs_canceled_after_committing_and_says_what_it_stopped(demo: Demo) -> None:
    """Last in the module: it stops the demo."""
    running = demo.dev.wait_for_runs({"mirus/kind": "replicator"}, statuses={"STARTED"}, count=2,
                                     job_name="replicator", timeout=120)  # fmt: skip
    tasks = {(r.tags[CONNECTOR], int(r.tags["mirus/task"])): r.run_id for r in running}

    shutdown = demo.dev.shutdown()

    console = demo.console_text()
    assert shutdown.clean and shutdown.exit_code == 0, (shutdown, console, _unended_runs(demo))
    assert "Traceback" not in console and "KeyboardInterrupt" not in console, console
    stopped = next(line for line in console.splitlines() if line.startswith("stopped: "))
    for connector, task in tasks:
        assert f"{connector}-{task} CANCELED" in stopped, stopped
    assert "Dagster (webserver, daemon, code server)" in stopped and "demo traffic" in stopped, stopped

    import dagster as dg
    from dagster._core.instance.ref import InstanceRef

    with dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(demo.dev.home))) as instance:
        for run_id in tasks.values():
            run = instance.get_run_by_id(run_id)
            assert run is not None and run.status == dg.DagsterRunStatus.CANCELED, (run_id, run and run.status)
            messages = [e.user_message for e in instance.all_logs(run_id)]
            assert any(": stopped: " in m for m in messages), f"no final task event in run {run_id}: {messages}"

    # Flushed and committed: every record at the destination is covered by the committed offsets, exactly.
    store = demo.store
    copied = _copied_up_to(demo.endpoints, f"{DEMO_TOPIC}.mirror")
    assignment = [tp for tps in store.read_assignment(DEMO_CONNECTOR).values() for tp in tps]
    committed = store.load_offsets(DEMO_CONNECTOR, assignment)
    assert copied, "nothing was replicated before Ctrl-C"
    assert {tp: committed.get(tp) for tp in copied} == copied


def _unended_runs(demo: Demo) -> dict[str, list[str]]:
    """Each run still not ended, with its last events: what a failed shutdown was waiting for."""
    import dagster as dg
    from dagster._core.instance.ref import InstanceRef

    with dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(demo.dev.home))) as instance:
        live = instance.get_runs(dg.RunsFilter(statuses=[s for s in dg.DagsterRunStatus if s not in (
            dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)]))  # fmt: skip
        return {f"{r.run_id} {r.status.value} {r.tags}": [f"{e.dagster_event_type} {e.user_message}"
                for e in instance.all_logs(r.run_id)][-20:] for r in live}  # fmt: skip


def _copied_up_to(endpoints: StackEndpoints, topic: str) -> dict[tuple[str, int], int]:
    """Per source partition, one past the highest source offset found at the destination (by provenance)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": endpoints.destination_bootstrap_servers, "group.id": "tests-first-hour",
                         "enable.auto.commit": False})  # fmt: skip
    metadata = consumer.list_topics(topic, timeout=10).topics[topic]
    consumer.assign([TopicPartition(topic, p, 0) for p in metadata.partitions])
    copied: dict[tuple[str, int], int] = {}
    try:
        while batch := consumer.consume(1000, 3.0):  # the platform is stopped: the topic no longer grows
            for msg in batch:
                origin = provenance.parse(msg.headers()) if not msg.error() else None
                if origin is not None:
                    tp = (origin.source_topic, origin.source_partition)
                    copied[tp] = max(copied.get(tp, 0), origin.source_offset + 1)
    finally:
        consumer.close()
    return copied
