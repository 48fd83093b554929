"""The compose deployment, up for real: docker-compose.yml with deploy/compose/host-network.yml, as a user runs it
against their own clusters and Postgres (docs/DEPLOYMENT.md, section 1).

One platform start for the module (`compose_platform`, tests/deploy/conftest.py): the engine from the shared script,
both images built by `docker-compose build` (runtime and Spark, from deploy/Dockerfile, with layer caching), the
platform's services (code server on the Spark image; webserver, daemon and API on the runtime image) started with
`docker-compose up --no-deps`, against the session's Apache Kafka clusters and databases of its own on the session's
Postgres. The scenarios run in order on it: the UI and REST API answer; a connector PUT over REST gets each task's
owner and standby run in a labelled container of its own (runtime image), which copy every record; `docker kill` of
an owner's container hands its task to the standby, nothing lost; the connector deleted over REST ends its
containers; a report run (launched as the platform came up) ran from the Spark image and succeeded; every service's
HEALTHCHECK passes; then the platform's default shape, worker containers (`MIRUS_REPLICATOR_WORKERS=2`, services
recreated with `up -d`), host two connectors' tasks, `docker kill` of one moves its tasks to the other, nothing lost,
and the monitor starts its replacement; a rolling upgrade to images of a second tag moves every task into a
container of the new image while records flow, nothing lost; the last takes the deployment down and checks that
no container, volume or process is left.
"""

from __future__ import annotations

import json
import logging
import uuid
from datetime import UTC, datetime

import pytest
import requests

from mirus.waiting import wait_until
from mirus_dagster.constants import (
    KIND_REPLICATOR,
    KIND_REPORT,
    REPORTS_JOB,
    TAG_CONNECTOR,
    TAG_KIND,
    TAG_REASON,
    TAG_TASK,
    TAG_WORKER,
    TAG_WORKERS,
)
from mirus_dagster.report_schedule import hour_key
from mirus_dagster.settings import StackEndpoints
from replicator.state.records import LeaseRow
from replicator.state.store import Store
from tests.fixtures.compose_platform import (
    RUN_LABEL,
    ComposePlatform,
    Container,
    containers,
    docker,
    git_commit,
)
from tests.fixtures.jvm import SHORT_LIVED_JVM_OPTIONS
from tests.fixtures.kafka_helpers import Traffic, create_topics, produce
from tests.fixtures.replica_check import check_replica

CONNECTOR = f"ct-{uuid.uuid4().hex[:6]}"
TOPIC = f"{CONNECTOR}-orders"
PARTITIONS = 4
TASKS = 2
FIRST_RECORDS = 400
RUNS_TIMEOUT_S = 180.0
REPORT_TIMEOUT_S = 300.0

log = logging.getLogger(__name__)


@pytest.fixture(scope="module")
def report_run(compose_platform: tuple[ComposePlatform, Store]) -> str:
    """A report run launched as soon as the platform is up; test_a_report_run_starts_from_the_spark_image_and_succeeds
    collects it. Its Spark JVM runs beside the first scenarios, which mostly wait on containers starting, instead of
    for about a minute alone. Nothing is recorded yet: the reports of a new deployment's first hour."""
    return compose_platform[0].launch(REPORTS_JOB, {"dagster/partition": hour_key(datetime.now(UTC))})


@pytest.fixture(scope="module")
def platform(compose_platform: tuple[ComposePlatform, Store], report_run: str) -> ComposePlatform:
    return compose_platform[0]


@pytest.fixture(scope="module")
def store(compose_platform: tuple[ComposePlatform, Store]) -> Store:
    return compose_platform[1]


def task_containers(platform: ComposePlatform, task: int | None = None) -> list[Container]:
    """The running containers `docker ps` shows for the connector's tasks (or for one task)."""
    filters = [f"label={RUN_LABEL}", f"label={TAG_CONNECTOR}={CONNECTOR}"]
    if task is not None:
        filters.append(f"label={TAG_TASK}={task}")
    found = containers(*filters, running_only=True)
    platform.run_containers.update(c.id for c in found)
    return found


def owner_run(store: Store, task: int) -> tuple[str, LeaseRow] | None:
    """The run that holds the task's lease (its id ends the lease's owner), and the lease."""
    lease = store.lease_of(CONNECTOR, task)
    if lease is None or lease.state != "RUNNING" or not lease.owner:
        return None
    return lease.owner.rsplit(":", 1)[-1], lease


def put_connector_with_records(platform: ComposePlatform, clusters: StackEndpoints, name: str, topic: str) -> None:
    """`topic` created with FIRST_RECORDS records, and a connector of TASKS tasks copying it PUT over REST."""
    src, dst = clusters.source_bootstrap_servers, clusters.destination_bootstrap_servers
    create_topics(src, {topic: PARTITIONS})
    produce(src, ({"topic": topic, "partition": i % PARTITIONS, "value": b"%06d" % i} for i in range(FIRST_RECORDS)))
    properties = {
        "name": name,
        "connector.class": "com.salesforce.mirus.MirusSourceConnector",
        "consumer.bootstrap.servers": src,
        "destination.consumer.bootstrap.servers": dst,
        "topics.whitelist": topic,
        "tasks.max": str(TASKS),
    }
    put = platform.rest("PUT", f"/connectors/{name}/config", properties)
    assert put.status_code == 201, put.text


def test_the_ui_and_the_api_answer(platform: ComposePlatform) -> None:
    assert requests.get(f"{platform.ui}/server_info", timeout=10).ok
    root = requests.get(f"{platform.api}/", timeout=10)
    assert root.ok, root.text
    assert root.json()["commit"] == git_commit()  # the build argument the images were built with
    # Every other route asks for the token the token service generated into its volume.
    assert platform.rest("GET", "/connectors").json() == []
    guess = requests.get(f"{platform.api}/connectors", headers={"Authorization": "Bearer guess"}, timeout=10)
    assert guess.status_code == 401
    # Each service runs from the image meant for it, as the image's unprivileged user.
    services = {c.labels["com.docker.compose.service"]: c for c in platform.service_containers() if c.running}
    assert {name: c.image for name, c in services.items()} == {
        "mirus-code": platform.spark_image,
        "dagster-webserver": platform.runtime_image,
        "dagster-daemon": platform.runtime_image,
        "mirus-api": platform.runtime_image,
    }
    for container in services.values():
        assert docker("exec", container.id, "id", "-u").strip() == "10001", container.name


def test_a_connector_put_over_rest_runs_each_task_in_a_labelled_container_of_its_own(
    platform: ComposePlatform, store: Store, apache_kafka: StackEndpoints
) -> None:
    src, dst = apache_kafka.source_bootstrap_servers, apache_kafka.destination_bootstrap_servers
    put_connector_with_records(platform, apache_kafka, CONNECTOR, TOPIC)

    # Each task's owner and its warm standby: a run each, each run a container of its own from the runtime image,
    # labelled with the connector and task it runs.
    def every_run_in_its_container() -> list[Container] | None:
        runs = platform.runs({TAG_CONNECTOR: CONNECTOR, TAG_KIND: KIND_REPLICATOR}, statuses=["STARTED"])
        running = task_containers(platform)
        by_run = {c.labels.get("dagster/run_id"): c for c in running}
        per_task = {task: [r for r in runs if r["tags"].get(TAG_TASK) == str(task)] for task in range(TASKS)}
        if not all(len(r) >= 2 for r in per_task.values()) or not all(r["runId"] in by_run for r in runs):
            return None
        return [by_run[r["runId"]] for r in runs]

    started = platform.until(every_run_in_its_container, RUNS_TIMEOUT_S, "an owner and a standby container per task")
    assert len({c.id for c in started}) == len(started), "two runs share a container"
    for container in started:
        assert container.image == platform.runtime_image, container
        assert container.labels[TAG_CONNECTOR] == CONNECTOR and container.labels[TAG_TASK] in {"0", "1"}
        assert container.labels[TAG_KIND] == KIND_REPLICATOR
        # The replicator's tighter memory limit (deploy/compose/run-launcher.yaml, runtime_container_kwargs).
        assert container.memory_limit == 512 * 2**20, container
    platform.remember_processes()
    check_replica(src, TOPIC, dst, partitions=PARTITIONS, written=FIRST_RECORDS, timeout=120).assert_exactly_once()
    # How long an owner's container took from its start to its task's claim (Python, Dagster, the code location).
    for task in range(TASKS):
        owner = owner_run(store, task)
        assert owner is not None and owner[1].claimed_at is not None
        [container] = [c for c in started if c.labels.get("dagster/run_id") == owner[0]]
        log.info(
            "task %d claimed %.1f s after its container started",
            task,
            owner[1].claimed_at.timestamp() - container.started_at,
        )


def test_docker_kill_of_the_owners_container_hands_the_task_to_its_standby_and_loses_nothing(
    platform: ComposePlatform, store: Store, apache_kafka: StackEndpoints
) -> None:
    src, dst = apache_kafka.source_bootstrap_servers, apache_kafka.destination_bootstrap_servers
    traffic = Traffic(src, {TOPIC: PARTITIONS}, rate=100)
    try:
        owner = platform.until(lambda: owner_run(store, 0), 60, "task 0's owner")
        victim_run, lease = owner
        [victim] = [c for c in task_containers(platform, 0) if c.labels.get("dagster/run_id") == victim_run]
        standbys = {c.id for c in task_containers(platform, 0)} - {victim.id}
        assert standbys, "task 0 has no standby container"
        platform.remember_processes()
        docker("kill", victim.id)

        def taken_over() -> tuple[str, LeaseRow] | None:
            now = owner_run(store, 0)
            return now if now and now[1].epoch > lease.epoch and now[0] != victim_run else None

        new_owner, _ = platform.until(taken_over, 60, "task 0's standby to take the lease")
        [successor] = [c for c in task_containers(platform, 0) if c.labels.get("dagster/run_id") == new_owner]
        assert successor.id in standbys, "the task moved to another container than its standby"
        # Records produced after the takeover too, for the new owner to copy.
        more = traffic.written + 200
        wait_until(lambda: traffic.written >= more, 60, 0.2, "200 more records produced")
    finally:
        written = traffic.stop()
    assert not docker("ps", "-q", f"--filter=id={victim.id}").strip(), "the killed container still runs"
    report = check_replica(src, TOPIC, dst, partitions=PARTITIONS, written=FIRST_RECORDS + written, timeout=120)
    report.assert_at_least_once()
    # The platform restores the task's standby: a new container for task 0 beside the new owner.
    platform.until(
        lambda: {c.id for c in task_containers(platform, 0)} - {victim.id, successor.id},
        RUNS_TIMEOUT_S,
        "a new standby container for task 0",
    )


def test_a_connector_deleted_over_rest_ends_its_runs_and_their_containers(platform: ComposePlatform) -> None:
    deleted = platform.rest("DELETE", f"/connectors/{CONNECTOR}")
    assert deleted.status_code == 204, deleted.text
    platform.until(lambda: not task_containers(platform), RUNS_TIMEOUT_S, f"{CONNECTOR}'s containers to stop")
    live = platform.runs({TAG_CONNECTOR: CONNECTOR}, statuses=["QUEUED", "STARTING", "STARTED", "CANCELING"])
    assert not live, f"runs still live: {[r['runId'] for r in live]}"


def test_a_report_run_starts_from_the_spark_image_and_succeeds(platform: ComposePlatform, report_run: str) -> None:
    """Report runs keep the code location's image (the Spark one: Java and pyspark), with every run's limits (a
    Spark driver beside Python) and the deployment's SPARK_SUBMIT_OPTS, and compute the reports."""
    run_id = report_run

    def finished() -> dict[str, object] | None:
        [run] = [r for r in platform.runs({TAG_KIND: KIND_REPORT}) if r["runId"] == run_id]
        return run if run["status"] in ("SUCCESS", "FAILURE", "CANCELED") else None

    run = platform.until(finished, REPORT_TIMEOUT_S, "the report run to end")
    log.info("report run: %.0f s from its launch to its end", run["endTime"] - run["creationTime"])
    [container] = platform.run_containers_of([run_id])
    assert container.image == platform.spark_image and container.labels[TAG_KIND] == KIND_REPORT
    assert container.memory_limit == 2 * 2**30
    assert f"SPARK_SUBMIT_OPTS={SHORT_LIVED_JVM_OPTIONS}" in json.loads(
        docker("inspect", "--format", "{{json .Config.Env}}", container.id)
    )
    assert run["status"] == "SUCCESS", (
        f"report run {run_id} ended {run['status']}: {docker('logs', '--tail', '30', container.id)}"
    )


def test_the_services_report_healthy(platform: ComposePlatform) -> None:
    """The images' HEALTHCHECK, in each role: the code server's gRPC health, the webserver's /server_info, the
    daemon's liveness check, the API's GET / (deploy/healthcheck.py). Docker runs a service's first check one
    interval after its start: 30 s (the image's), 5 s for the code server, 2 minutes for the daemon."""

    def healthy() -> dict[str, str] | None:
        health = {c.labels["com.docker.compose.service"]: c.health for c in platform.service_containers() if c.running}
        return health if set(health.values()) == {"healthy"} else None

    health = platform.until(healthy, 180, "every service's healthcheck to pass")
    assert set(health) == {"mirus-code", "dagster-webserver", "dagster-daemon", "mirus-api"}


# -- workers: the platform's default shape, a few worker containers hosting every connector's tasks ----------------

WORKERS = 2
WORKER_CONNECTORS = tuple(f"{CONNECTOR}-w{i}" for i in range(2))  # two connectors, their tasks among the workers
UPGRADE_TAG = f"upgrade-{CONNECTOR}"


def worker_topic(connector: str) -> str:
    return f"{connector}-orders"


def worker_containers(platform: ComposePlatform) -> dict[int, Container]:
    """The running worker containers, by worker index."""
    found = containers(f"label={RUN_LABEL}", f"label={TAG_WORKERS}={WORKERS}", running_only=True)
    platform.run_containers.update(c.id for c in found)
    return {int(c.labels[TAG_WORKER]): c for c in found}


def task_owners(platform: ComposePlatform, store: Store) -> dict[tuple[str, int], Container] | None:
    """Every task of the worker connectors with the worker container that owns it (holds its RUNNING lease), or
    None while a task has no owner in a running worker container."""
    by_run = {c.labels.get("dagster/run_id"): c for c in worker_containers(platform).values()}
    owners = {}
    for connector in WORKER_CONNECTORS:
        for task in range(TASKS):
            owner = owner_run_of(store, connector, task)
            if owner is None or owner[0] not in by_run:
                return None
            owners[(connector, task)] = by_run[owner[0]]
    return owners


def owner_run_of(store: Store, connector: str, task: int) -> tuple[str, LeaseRow] | None:
    lease = store.lease_of(connector, task)
    if lease is None or lease.state != "RUNNING" or not lease.owner:
        return None
    return lease.owner.rsplit(":", 1)[-1], lease


def topic_records(traffic: Traffic, topic: str) -> int:
    """How many records `topic` holds: the traffic's acknowledged offsets are the topic's own."""
    return sum(offset + 1 for (name, _), offset in traffic.acked.items() if name == topic)


def replaced(
    platform: ComposePlatform, store: Store, index: int, old: Container
) -> dict[tuple[str, int], Container] | None:
    """Every task owned, none by `old`, once worker `index` runs again from the deployment's current image."""
    worker = worker_containers(platform).get(index)
    if worker is None or worker.id == old.id or worker.image != platform.runtime_image:
        return None
    owners = task_owners(platform, store)
    return owners if owners and all(o.id != old.id for o in owners.values()) else None


def epoch(store: Store, connector: str, task: int) -> int:
    owner = owner_run_of(store, connector, task)
    return owner[1].epoch if owner else -1


def check_worker_replicas(apache_kafka: StackEndpoints, traffic: Traffic) -> dict[str, int]:
    """Every record of the worker connectors' topics copied (at least once); duplicates per topic."""
    src, dst = apache_kafka.source_bootstrap_servers, apache_kafka.destination_bootstrap_servers
    duplicates = {}
    for connector in WORKER_CONNECTORS:
        topic = worker_topic(connector)
        written = topic_records(traffic, topic)
        report = check_replica(src, topic, dst, partitions=PARTITIONS, written=written, timeout=120)
        report.assert_at_least_once()
        duplicates[topic] = sum(report.duplicated.values())
    return duplicates


def test_worker_containers_host_every_connectors_tasks(
    platform: ComposePlatform, store: Store, apache_kafka: StackEndpoints
) -> None:
    """The platform's default shape (a run per task is `MIRUS_REPLICATOR_WORKERS=0`, as above): the operator sets
    the workers and `up -d` recreates the services with it; two connectors' tasks land in the worker containers."""
    platform.reconfigure({"MIRUS_REPLICATOR_WORKERS": str(WORKERS)})
    src, dst = apache_kafka.source_bootstrap_servers, apache_kafka.destination_bootstrap_servers
    for connector in WORKER_CONNECTORS:
        put_connector_with_records(platform, apache_kafka, connector, worker_topic(connector))

    owners = platform.until(lambda: task_owners(platform, store), RUNS_TIMEOUT_S, "every task owned by a worker")
    workers = worker_containers(platform)
    assert sorted(workers) == list(range(WORKERS)), workers
    for index, container in workers.items():
        assert container.image == platform.runtime_image, container
        assert container.labels[TAG_KIND] == KIND_REPLICATOR and container.labels[TAG_WORKERS] == str(WORKERS)
        assert TAG_CONNECTOR not in container.labels, f"worker {index} is labelled as one connector's"
    # No run of its own for any task: the workers are every replicator container.
    assert not task_containers(platform)
    for connector in WORKER_CONNECTORS:
        assert not containers(f"label={TAG_CONNECTOR}={connector}", running_only=True), connector
    log.info("task owners: %s", {f"{c}/{t}": o.labels[TAG_WORKER] for (c, t), o in owners.items()})
    platform.remember_processes()
    for connector in WORKER_CONNECTORS:
        topic = worker_topic(connector)
        check_replica(src, topic, dst, partitions=PARTITIONS, written=FIRST_RECORDS, timeout=120).assert_exactly_once()


def test_docker_kill_of_a_worker_container_moves_its_tasks_and_loses_nothing(
    platform: ComposePlatform, store: Store, apache_kafka: StackEndpoints
) -> None:
    traffic = Traffic(
        apache_kafka.source_bootstrap_servers, {worker_topic(c): PARTITIONS for c in WORKER_CONNECTORS}, rate=100
    )
    try:
        owners = platform.until(lambda: task_owners(platform, store), 60, "every task owned by a worker")
        # The worker that owns the most tasks (every task has its standby in the other: 1 + 1 standby of 2 workers).
        counts = {c.id: sum(1 for o in owners.values() if o.id == c.id) for c in owners.values()}
        victim = max(owners.values(), key=lambda c: counts[c.id])
        moved = {task for task, o in owners.items() if o.id == victim.id}
        epochs = {task: epoch(store, *task) for task in moved}
        platform.remember_processes()
        docker("kill", victim.id)

        def moved_away() -> dict[tuple[str, int], Container] | None:
            now = task_owners(platform, store)
            if now is None or any(o.id == victim.id for o in now.values()):
                return None
            return now if all(epoch(store, *task) > e for task, e in epochs.items()) else None

        platform.until(moved_away, 60, f"the tasks of worker {victim.labels[TAG_WORKER]} to move")
        more = traffic.written + 200
        wait_until(lambda: traffic.written >= more, 60, 0.2, "200 more records produced")
        # The monitor replaces the killed worker: a new container of the same index, its run saying why.
        index = int(victim.labels[TAG_WORKER])
        replacement = platform.until(
            lambda: (c := worker_containers(platform).get(index)) is not None and c.id != victim.id and c,
            RUNS_TIMEOUT_S,
            f"a new container of worker {index}",
        )
        run_id = replacement.labels["dagster/run_id"]
        [run] = [r for r in platform.runs({TAG_WORKER: str(index)}) if r["runId"] == run_id]
        assert run["tags"][TAG_REASON].startswith("restart: "), run["tags"]
    finally:
        traffic.stop()
    log.info("%d tasks moved; duplicates per topic: %s", len(moved), check_worker_replicas(apache_kafka, traffic))


def test_a_rolling_upgrade_moves_every_task_into_the_new_image_and_loses_nothing(
    platform: ComposePlatform, store: Store, apache_kafka: StackEndpoints
) -> None:
    """docs/DEPLOYMENT.md, section 6, with a second image tag: the new images built, `up -d` with the new tag
    recreates the services, then each worker run of the old image is terminated in turn (as the UI's Terminate
    button does); the monitor starts its replacement from the new image, and the tasks it owned move to the other
    worker meanwhile. Records flow throughout."""
    old_image = platform.runtime_image
    traffic = Traffic(
        apache_kafka.source_bootstrap_servers, {worker_topic(c): PARTITIONS for c in WORKER_CONNECTORS}, rate=100
    )
    try:
        platform.until(lambda: task_owners(platform, store), 60, "every task owned by a worker")
        new_commit = f"{git_commit()}+{UPGRADE_TAG}"
        platform.env.update({"MIRUS_IMAGE_TAG": UPGRADE_TAG, "MIRUS_COMMIT": new_commit})
        log.info("new images built in %.0f s", platform.build())
        log.info("services recreated in %.0f s", platform.up())
        assert platform.runtime_image != old_image
        assert requests.get(f"{platform.api}/", timeout=10).json()["commit"] == new_commit
        services = [c for c in platform.service_containers() if c.running]
        assert {c.image for c in services} == {platform.runtime_image, platform.spark_image}, services
        # Running tasks are untouched by the services' recreation: their containers are the old image's.
        assert {c.image for c in worker_containers(platform).values()} == {old_image}

        for index in range(WORKERS):
            [old_run] = [c for i, c in worker_containers(platform).items() if i == index]
            platform.terminate(old_run.labels["dagster/run_id"])

            platform.until(
                lambda: replaced(platform, store, index, old_run),  # noqa: B023 (awaited within the iteration)
                RUNS_TIMEOUT_S,
                f"worker {index} to run from the new image, its tasks owned",
            )
        owners = platform.until(lambda: task_owners(platform, store), 60, "every task owned by a worker")
        assert {o.image for o in owners.values()} == {platform.runtime_image}, owners
        assert {c.image for c in worker_containers(platform).values()} == {platform.runtime_image}
        more = traffic.written + 200
        wait_until(lambda: traffic.written >= more, 60, 0.2, "200 more records produced")
    finally:
        traffic.stop()
    log.info("duplicates per topic across the rolling upgrade: %s", check_worker_replicas(apache_kafka, traffic))


def test_down_leaves_no_container_volume_or_process_behind(platform: ComposePlatform) -> None:
    platform.remember_processes()
    seen = set(platform.run_containers)
    assert seen, "no run container was seen"
    leftovers = platform.down()
    assert not leftovers, f"left behind: {leftovers}"
    assert not [c for c in containers(f"label={RUN_LABEL}") if c.id in seen]
