"""A new user's first hour: `mirus dev` exactly as the README gives it, its console, the Dagster UI in a real
headless Chromium, the REST API on its port, the CLI against the running demo, and Ctrl-C.

One `mirus dev` (and so one `dagster dev`) serves the whole module: the README's command with no option and none of
the suite's settings in its environment, so it starts its own embedded stack (two clusters and Postgres) on the
default ports and keeps its state in `.mirus` of its working directory (a fresh one: a new checkout). The tests run
in file order; the last one stops it with Ctrl-C.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
import yaml
from kafka_connect import KafkaConnect

from mirus.local.devserver import DagsterDev, RunInfo
from mirus.local.stack import LocalStack, port_is_free
from mirus.waiting import wait_until
from mirus_dagster.constants import DEMO_CONNECTOR, DEMO_TOPIC, TAG_CONNECTOR, TAG_WORKER, WORKER_JOB
from mirus_dagster.settings import (
    EXAMPLE_CONNECTOR,
    PlatformSettings,
    StackEndpoints,
    default_workers,
    example_connector,
)
from replicator.state.database import make_engine
from replicator.state.records import LEASE_HELD
from replicator.state.store import Store
from tests.fixtures.browser import Browser, start_chromium

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
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


def readme_dev_command() -> list[str]:
    """The README's first set-up command, after its install steps: `.venv/bin/mirus dev`, run with the `mirus` of
    the environment the suite runs in (the README's `.venv` when run as the README says)."""
    setup = re.search(r"```bash\n(python3 -m venv .venv && .venv/bin/pip install -e . && (.*))\n```", README)
    assert setup is not None, "the README's first set-up command was not found"
    command = setup.group(2).split()
    assert command == [".venv/bin/mirus", "dev"], f"the README now runs {command}: update this test to run it"
    return [str(Path(sys.executable).parent / "mirus"), *command[1:]]


def user_environment() -> dict[str, str]:
    """The suite's environment without anything a new user would not have set: no MIRUS_* or DAGSTER_* setting."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("MIRUS_", "DAGSTER_"))}


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    checkout = tmp_path_factory.mktemp("checkout")
    defaults = PlatformSettings(state_dir=checkout / ".mirus")
    taken = [
        p
        for p in (defaults.source_port, defaults.destination_port, defaults.postgres_port, 3000, 8083)
        if not port_is_free(p)
    ]
    assert not taken, f"the README's `mirus dev` uses the default ports; {taken} taken on this machine: free them"
    console = checkout / "console.log"
    with console.open("wb") as out:
        process = subprocess.Popen(
            readme_dev_command(),
            env={**user_environment(), "PYTHONUNBUFFERED": "1"},
            cwd=checkout,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: a SIGINT to it is what Ctrl-C in a terminal sends
        )
    dev = DagsterDev(process, 3000, defaults.state_dir / "dagster-home", console)
    try:
        announced = dev.until(lambda: f"Dagster UI: {dev.url}" in console.read_text(), 240, "the UI address")
        answered = bool(announced) and requests.get(f"{dev.url}/server_info", timeout=5).ok
        dev.wait_until_ready()
        yield Demo(dev, console, LocalStack(defaults).endpoints, answered)
    finally:
        dev.shutdown()


@pytest.fixture(scope="module")
def browser(chromium: None) -> Iterator[Browser]:
    started = start_chromium()
    yield started
    started.quit()


def worker_runs(demo: Demo, timeout: float = 120) -> list[RunInfo]:
    """The default shape: `default_workers()` started worker runs (one per two cores), hosting every task."""
    return demo.dev.wait_for_runs(
        statuses={"STARTED"},
        count=default_workers(),
        job_name=WORKER_JOB,
        timeout=timeout,
        what=f"{default_workers()} worker run(s)",
    )


def tasks_held(demo: Demo, connector: str, tasks: int, timeout: float = 120) -> None:
    """Every task of the connector claimed: its lease held by a worker run."""
    store = demo.store
    try:
        wait_until(
            lambda: all((lease := store.lease_of(connector, t)) and lease.state == LEASE_HELD for t in range(tasks)),
            timeout,
            0.5,
            what=f"{connector}'s {tasks} task(s) held",
        )
    finally:
        store.engine.dispose()


def page_text(browser: Browser, url: str, *expected: str, timeout: float = 90) -> str:
    """Open `url` and wait until the page shows every `expected` text; the page's text."""
    browser.driver.get(url)
    body: list[str] = []

    def shows_all() -> bool:
        body[:] = [browser.driver.find_element("tag name", "body").text]
        return all(e in body[0] for e in expected)

    try:
        wait_until(shows_all, timeout, 0.5, what=f"{url} to show {expected}")
    except TimeoutError as exc:
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
    worker_runs(demo)
    tasks_held(demo, DEMO_CONNECTOR, 2)
    text = page_text(
        browser,
        f"{demo.dev.url}/assets/connectors",
        DEMO_CONNECTOR,
        "RUNNING",
        "0: RUNNING",
        "1: RUNNING",
        "partitions",
    )
    row = next(line for line in text.splitlines() if line.startswith(DEMO_CONNECTOR))
    shown = re.match(rf"{DEMO_CONNECTOR} RUNNING (\d+) ", row)  # its state, then its partitions
    per_task = [int(n) for n in re.findall(r"\d: RUNNING \((\d+) partitions, run [0-9a-f]{8}", row)]
    assert shown and len(per_task) == 2, row  # both tasks, each with the worker run holding it
    assert int(shown.group(1)) == sum(per_task) >= 3, row  # the three partitions of `orders` at least
    assert "UNASSIGNED" not in text and "heartbeat never" not in text, text[:3000]


def test_the_launchpad_opens_with_an_example_that_is_accepted_as_is(demo: Demo, browser: Browser) -> None:
    location = demo.dev.query("query { workspaceOrError { ... on Workspace { locationEntries { name } } } }")
    name = location["workspaceOrError"]["locationEntries"][0]["name"]
    page_text(
        browser,
        f"{demo.dev.url}/locations/{name}/jobs/put_connector/playground",
        f"name: {EXAMPLE_CONNECTOR}",
        "No errors",
    )
    launch = next(b for b in browser.driver.find_elements("tag name", "button") if b.text.strip() == "Launch Run")
    wait_until(launch.is_enabled, 60, 0.5, what="the Launch Run button to be enabled (config validated)")
    launch.click()
    (put,) = demo.dev.wait_for_runs(job_name="put_connector", timeout=120, what="the run Launch Run started")

    run = demo.dev.wait_for_status(put.run_id, {"SUCCESS"}, timeout=120)

    # Its page names the connector it acted on (the op's event), and it carries the connector's tag.
    page_text(browser, f"{demo.dev.url}/runs/{run.run_id}", f"connector {EXAMPLE_CONNECTOR} stored as version 1")
    assert run.tags[CONNECTOR] == EXAMPLE_CONNECTOR, run.tags
    record = demo.store.get_connector(EXAMPLE_CONNECTOR)
    assert record.state == "RUNNING"
    # The example replicates on the demo clusters: the worker runs take its tasks up.
    tasks_held(demo, EXAMPLE_CONNECTOR, 2)


def test_the_readme_example_is_the_launchpad_example_for_the_default_clusters() -> None:
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```yaml\n(.*?)```", readme, re.S)
    assert block is not None
    example = yaml.safe_load(textwrap.dedent(block.group(1)))
    default_endpoints = LocalStack(PlatformSettings(state_dir=Path("unused"))).endpoints
    properties = example["ops"]["store_connector"]["config"]["properties"]
    assert properties == example_connector(default_endpoints)


def test_a_worker_runs_page_names_the_tasks_it_hosts(demo: Demo, browser: Browser) -> None:
    tasks_held(demo, DEMO_CONNECTOR, 2)
    holder = demo.store.lease_of(DEMO_CONNECTOR, 0)
    assert holder is not None
    (run,) = [r for r in worker_runs(demo) if holder.owner.endswith(r.run_id)]
    # The run's own events name each task it hosts (an owner's "replicating …", a standby's "standing by …"); its
    # tags say which worker it is.
    page_text(browser, f"{demo.dev.url}/runs/{run.run_id}", f"{DEMO_CONNECTOR}-0: ")
    tags = next(b for b in browser.driver.find_elements("tag name", "button") if "View tags and config" in b.text)
    tags.click()
    shown = f"{TAG_WORKER}: {run.tags[TAG_WORKER]}"  # the tag with its value, as the tags dialog lists it
    body: list[str] = []

    def tag_shown() -> bool:
        body[:] = [browser.driver.find_element("tag name", "body").text]
        return shown in body[0]

    try:
        wait_until(tag_shown, 30, 0.5, what=f"the run's tag {shown!r}")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n--- page text ---\n{body[0][-3000:] if body else ''}") from None


# -- the REST API ------------------------------------------------------------------------------------------


def test_the_rest_api_answers_on_its_port_with_the_demo_connector_running(demo: Demo) -> None:
    api = "http://127.0.0.1:8083"
    assert f"Kafka Connect REST API and /metrics: {api}" in demo.console_text()
    assert DEMO_CONNECTOR in requests.get(f"{api}/connectors", timeout=30).json()

    def running() -> dict | None:
        status = requests.get(f"{api}/connectors/{DEMO_CONNECTOR}/status", timeout=30).json()
        tasks_running = [t["state"] for t in status["tasks"]] == ["RUNNING", "RUNNING"]
        return status if status["connector"]["state"] == "RUNNING" and tasks_running else None

    status = wait_until(running, 120, 0.5, what="the demo connector and its two tasks RUNNING in the REST API")
    assert [t["id"] for t in status["tasks"]] == [0, 1]
    config = requests.get(f"{api}/connectors/{DEMO_CONNECTOR}/config", timeout=30).json()
    assert config["name"] == DEMO_CONNECTOR and config["topics.whitelist"] == DEMO_TOPIC, config


def test_a_kafka_connect_client_from_pypi_resets_the_demo_connectors_topics(demo: Demo) -> None:
    client = KafkaConnect("http://127.0.0.1:8083")
    client.reset_connector_topics(DEMO_CONNECTOR)  # raises on an error status, as against Kafka Connect
    # The demo's topic stays listed (it is in use), once the monitor has assigned it.
    wait_until(
        lambda: DEMO_TOPIC in client.list_connector_topics(DEMO_CONNECTOR)[DEMO_CONNECTOR]["topics"],
        120,
        0.5,
        what="the demo topic among the connector's active topics",
    )
    with pytest.raises(requests.HTTPError, match="404"):
        client.reset_connector_topics("no-such-connector")


# -- the CLI against the running demo ------------------------------------------------------------------------


def test_verify_on_the_running_demo_ends_with_a_verdict(demo: Demo) -> None:
    """The demo's traffic never stops: the check is bounded by the source's end offsets taken at its start."""
    tasks_held(demo, DEMO_CONNECTOR, 2)
    env = {**os.environ, **demo.endpoints.as_env()}
    result = subprocess.run(
        [sys.executable, "-m", "mirus.cli.main", "verify", "--topic", f"{DEMO_TOPIC}:{DEMO_TOPIC}.mirror"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "result: OK" in result.stdout
    assert "checked up to" in result.stdout


# -- no false alarms ---------------------------------------------------------------------------------------


def test_a_connector_restarted_then_deleted_leaves_no_red_run(demo: Demo) -> None:
    """The launchpad's example connector, restarted and then deleted by its admin jobs: every run of the session
    (the Runs page's list) is free of FAILURE, and the worker runs that hosted its tasks go on with the demo's."""
    tasks_held(demo, EXAMPLE_CONNECTOR, 2)
    workers = {r.run_id for r in worker_runs(demo)}
    for action in ("restart", "delete"):
        run_id = demo.dev.client.submit_job_execution(
            f"{action}_connector",
            run_config={"ops": {f"{action}_connector_op": {"config": {"name": EXAMPLE_CONNECTOR}}}},
        )
        demo.dev.wait_for_status(run_id, {"SUCCESS"}, timeout=120)
    store = demo.store
    wait_until(lambda: store.lease_of(EXAMPLE_CONNECTOR, 0) is None, 90, 0.5, what="the deleted connector's leases")
    store.engine.dispose()
    assert {r.run_id for r in worker_runs(demo)} == workers
    assert demo.dev.runs(statuses=["FAILURE"]) == []


# -- Ctrl-C ------------------------------------------------------------------------------------------------


def test_a_run_canceled_in_the_queue_as_it_was_launched_is_asked_to_terminate_again() -> None:
    """The race behind a Ctrl-C that waited its whole timeout: canceled while QUEUED just as the dequeuer launched
    it, a run goes on to start, as Dagster's own storage records it; the stop asks it again once it has started."""
    import dagster as dg
    from dagster._core.events import DagsterEvent, DagsterEventType

    from mirus.local.dev import runs_to_terminate
    from mirus_dagster.jobs import replicator
    from sensors.task_runs import run_request

    def as_seen(instance: dg.DagsterInstance, run_id: str) -> RunInfo:
        run = instance.get_run_by_id(run_id)
        assert run is not None
        return RunInfo(run_id, run.job_name, run.status.value, dict(run.tags), 0.0, None, None)

    with dg.instance_for_test() as instance:
        request = run_request(DEMO_CONNECTOR, 0, "assigned, never ran")
        run = instance.create_run_for_job(replicator, run_config=request.run_config, tags=request.tags)
        # What QueuedRunCoordinator.cancel_run does to a QUEUED run, then the launch the dequeuer had begun.
        instance.report_run_canceling(run, message="Canceling run from the queue.")
        instance.report_run_canceled(run)
        assert runs_to_terminate([as_seen(instance, run.run_id)]) == []
        for event in (DagsterEventType.PIPELINE_STARTING, DagsterEventType.PIPELINE_START):
            instance.report_dagster_event(DagsterEvent(event.value, job_name=run.job_name), run.run_id)
        seen = as_seen(instance, run.run_id)
        assert seen.status == "STARTED", "Dagster no longer lets a canceled run start: this retry can go"
        assert runs_to_terminate([seen]) == [run.run_id]


def test_ctrl_c_ends_replicator_runs_canceled_after_committing_and_says_what_it_stopped(demo: Demo) -> None:
    """Last in the module: it stops the demo. Each run's last event is written after its final flush and offset
    commit (that termination commits everything delivered is proven in tests/mirus_dagster/test_dagster_dev.py;
    here the embedded stack holding the offsets stops too)."""
    # The worker runs hosting both demo tasks (and whatever else replicates).
    tasks_held(demo, DEMO_CONNECTOR, 2)
    running = worker_runs(demo)
    assert demo.dev.runs({"mirus/kind": "replicator"}, job_name="replicator", statuses=["STARTED"]) == []

    shutdown = demo.dev.shutdown()

    console = demo.console_text()
    assert shutdown.clean and shutdown.exit_code == 0, (shutdown, console, _unended_runs(demo))
    assert "Traceback" not in console and "KeyboardInterrupt" not in console, console
    stopped = next(line for line in console.splitlines() if line.startswith("stopped: "))
    for run in running:
        assert f"worker {run.tags[TAG_WORKER]} CANCELED" in stopped, stopped
    for part in (
        "Dagster (webserver, daemon, code server)",
        "demo traffic",
        "REST API",
        "source",
        "destination",
        "postgres",
    ):
        assert part in stopped, (part, stopped)
    settings = PlatformSettings(state_dir=demo.dev.home.parent)
    for port in (3000, 8083, settings.source_port, settings.destination_port, settings.postgres_port):
        assert port_is_free(port), f"port {port} still taken after Ctrl-C"

    import dagster as dg
    from dagster._core.instance.ref import InstanceRef

    with dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(demo.dev.home))) as instance:
        for started in running:
            run = instance.get_run_by_id(started.run_id)
            assert run is not None and run.status == dg.DagsterRunStatus.CANCELED, (started, run and run.status)
            messages = [e.user_message for e in instance.all_logs(run.run_id)]
            # Each task's last event is written after its final flush and commit.
            for task in (0, 1):
                assert any(m.startswith(f"{DEMO_CONNECTOR}-{task}: stopped: ") for m in messages), (
                    f"no final event of task {task} in run {run.run_id}: {messages}"
                )


def _unended_runs(demo: Demo) -> dict[str, list[str]]:
    """Each run still not ended, with its last events: what a failed shutdown was waiting for."""
    import dagster as dg
    from dagster._core.instance.ref import InstanceRef

    with dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(demo.dev.home))) as instance:
        live = instance.get_runs(
            dg.RunsFilter(
                statuses=[
                    s
                    for s in dg.DagsterRunStatus
                    if s not in (dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)
                ]
            )
        )
        return {
            f"{r.run_id} {r.status.value} {r.tags}": [
                f"{e.dagster_event_type} {e.user_message}" for e in instance.all_logs(r.run_id)
            ][-20:]
            for r in live
        }
