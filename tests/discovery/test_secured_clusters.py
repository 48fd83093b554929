"""Replication between secured clusters (`secured_kafka`: SASL_SSL, SCRAM, a CA of its own, ACLs enforced), as the
`replicator` principal holding only the ACLs docs/SECURITY.md lists, with credentials given as references: every
client the platform opens (task, metadata watcher, topic creation and config sync, heartbeats, offset translation)
carries the connector's security settings, and no secret shows anywhere."""

from __future__ import annotations

import json
import logging
import re
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path

import certifi
import dagster as dg
import pytest
import requests
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ConfigResource,
    ResourcePatternType,
    ResourceType,
)
from sqlalchemy import Engine, text

from assets.connectors import connectors_markdown
from mirus.api.auth import ApiSettings
from mirus.faults.brokers import KafkaKit
from mirus.faults.kit_security import KitSecurity
from mirus.waiting import wait_until
from mirus_dagster.definitions import run_starter
from replicator.clusters import ClusterIdentityError
from replicator.configuration.secrets import ENV_ALLOWED_PATHS
from replicator.discovery.heartbeats import HEARTBEATS_TOPIC, flow_liveness_s
from replicator.discovery.watcher import MetadataWatcher
from replicator.state.records import ConnectorStatus, PartitionHealth
from replicator.state.store import Store
from tests.fixtures.api_helpers import serve_api
from tests.fixtures.dagster_runs import InProcessRun, evaluate, files_containing, requests_for
from tests.fixtures.engine_helpers import TaskThread, create_connector, step_failure_message
from tests.fixtures.kafka_helpers import consume_all, create_topics, produce
from tests.fixtures.replica_check import check_replica

DOCS = Path(__file__).resolve().parents[2] / "docs" / "SECURITY.md"
PRINCIPAL = "User:replicator"
CERTIFICATE_PRINCIPAL = "User:CN=replicator"  # the subject of the kit's client certificate
# The monitor's periodic duties off: a test of replication alone grants none of their ACLs.
DUTIES_OFF = {
    "sync.topic.configs.enabled": "false",
    "sync.topic.acls.enabled": "false",
    "emit.heartbeats.enabled": "false",
    "emit.checkpoints.enabled": "false",
}
RESOURCE_TYPES = {
    "Topic": ResourceType.TOPIC,
    "Group": ResourceType.GROUP,
    "Cluster": ResourceType.BROKER,
    "TransactionalId": ResourceType.TRANSACTIONAL_ID,
}


@pytest.fixture(scope="module")
def security(secured_kafka: KafkaKit) -> KitSecurity:
    assert secured_kafka.security is not None
    return secured_kafka.security


@pytest.fixture(autouse=True)
def no_grants(secured_kafka: KafkaKit) -> None:
    """Each test starts with the replicator holding no ACL (the clusters are shared, grants would pile up)."""
    everything = [
        AclBindingFilter(
            ResourceType.ANY, None, ResourcePatternType.ANY, principal, None, AclOperation.ANY, AclPermissionType.ANY
        )
        for principal in (PRINCIPAL, CERTIFICATE_PRINCIPAL)
    ]
    for role in ("source", "destination"):
        admin = AdminClient(_cluster(secured_kafka, role))
        for future in admin.delete_acls(everything).values():
            future.result(timeout=30)


def _cluster(kit: KafkaKit, role: str, user: str = "admin") -> dict[str, str]:
    """A client's settings for `role`'s cluster as `user`."""
    broker = kit.brokers[0 if role == "source" else 1]
    assert kit.security is not None
    return {**kit.security.client_settings(user), "bootstrap.servers": broker.bootstrap}


# -- the documented ACLs --------------------------------------------------------------------------------------


def documented_acls() -> list[tuple[str, str, str, str, list[str]]]:
    """docs/SECURITY.md's ACL table: (feature, cluster, resource, name, operations) per row."""
    table = DOCS.read_text().split("<!-- acl-table -->")[1].split("<!-- /acl-table -->")[0]
    rows = [line.strip().strip("|").split("|") for line in table.strip().splitlines()[2:]]
    return [
        (f.strip(), c.strip(), r.strip(), n.strip(" `"), [o.strip() for o in ops.split(",")])
        for f, c, r, n, ops in rows
    ]


def grant_documented(
    kit: KafkaKit,
    features: set[str],
    names: Mapping[str, list[str]],
    only: str | None = None,
    principal: str = PRINCIPAL,
) -> list[AclBinding]:
    """Grant `principal` exactly the documented ACLs of `features`; `names` expands a row's name ("each source
    topic" -> the topics); `only`: on that cluster alone. Returns the bindings granted."""
    granted = []
    by_cluster: dict[str, list[AclBinding]] = {"source": [], "destination": []}
    rows = [row for row in documented_acls() if row[0] in features]
    assert {row[0] for row in rows} == features, f"features without ACL rows: {features - {row[0] for row in rows}}"
    for _feature, cluster, resource, name, operations in rows:
        if only not in (None, cluster):
            continue
        for resource_name in names.get(name, [name]):
            for operation in operations:
                binding = AclBinding(
                    RESOURCE_TYPES[resource],
                    resource_name,
                    ResourcePatternType.LITERAL,
                    principal,
                    "*",
                    AclOperation[re.sub(r"(?<!^)(?=[A-Z])", "_", operation).upper()],
                    AclPermissionType.ALLOW,
                )
                by_cluster[cluster].append(binding)
                granted.append(binding)
    for cluster, bindings in by_cluster.items():
        if bindings:
            admin = AdminClient(_cluster(kit, cluster))
            for future in admin.create_acls(list(set(bindings))).values():  # features may share an ACL
                future.result(timeout=30)
    return granted


# -- a connector as an operator writes it ---------------------------------------------------------------------


def secured_properties(kit: KafkaKit, name: str, credentials: tuple[str, Path], **extra: str) -> dict[str, str]:
    """The source's credentials from the environment (Mirus names), the destination's from a file (MM2 names)."""
    assert kit.security is not None
    ca, (secret_env, password_file) = str(kit.security.ca_pem), credentials
    return {
        "name": name,
        "connector.class": "com.salesforce.mirus.MirusSourceConnector",
        "consumer.bootstrap.servers": kit.brokers[0].bootstrap,
        "consumer.security.protocol": "SASL_SSL",
        "consumer.sasl.mechanism": "SCRAM-SHA-512",
        "consumer.sasl.username": "replicator",
        "consumer.sasl.password": f"${{env:{secret_env}}}",
        "consumer.ssl.ca.location": ca,
        "target.cluster.bootstrap.servers": kit.brokers[1].bootstrap,
        "target.cluster.security.protocol": "SASL_SSL",
        "target.cluster.sasl.mechanism": "SCRAM-SHA-256",
        "target.cluster.sasl.username": "replicator",
        "target.cluster.sasl.password": f"${{file:{password_file}:password}}",
        "target.cluster.ssl.ca.location": ca,
        "offset.flush.interval.ms": "200",
        **extra,
    }


def secret_variable(name: str) -> str:
    """An environment variable the default allow-list (`MIRUS_SECRET_.*`) lets a config reference."""
    return "MIRUS_SECRET_" + re.sub(r"\W", "_", name).upper()


@pytest.fixture
def credentials(
    security: KitSecurity, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unique: str
) -> Iterator[tuple[str, Path]]:
    """The replicator's password as an allowed environment variable and in an allowed properties file."""
    env = secret_variable(unique)
    monkeypatch.setenv(env, security.passwords["replicator"])
    monkeypatch.setenv(ENV_ALLOWED_PATHS, str(tmp_path))
    password_file = tmp_path / "kafka.properties"
    password_file.write_text(f"password={security.passwords['replicator']}\n")
    yield env, password_file


def _secrets(security: KitSecurity) -> list[str]:
    return [*security.passwords.values(), security.store_password]


def _nothing_shows(security: KitSecurity, *texts: str) -> None:
    for secret in _secrets(security):
        leaked = [t[:200] for t in texts if secret in t]
        assert not leaked, f"a secret shows in: {leaked}"


def _stored_text(db_engine: Engine, connector: str) -> str:
    """Every row of the platform's tables that names the connector, as text (what the UI and API show)."""
    with db_engine.connect() as conn:
        tables = conn.execute(
            text("SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()")
        ).scalars()
        dumped = []
        for table in tables:
            rows = conn.execute(text(f'SELECT t::text FROM "{table}" t')).scalars()
            dumped += [row for row in rows if connector in row]
    return "\n".join(dumped)


def test_a_connector_replicates_between_secured_clusters_with_only_the_documented_acls(
    secured_kafka: KafkaKit,
    security: KitSecurity,
    store: Store,
    db_engine: Engine,
    unique: str,
    credentials: tuple[str, Path],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    admin_source, admin_destination = _cluster(secured_kafka, "source"), _cluster(secured_kafka, "destination")
    topic, group, total = unique, f"{unique}-app", 100_000
    create_topics(admin_source, {topic: 4}, config={"retention.ms": "3600000"})
    produce(
        admin_source,
        ({"topic": topic, "partition": i % 4, "key": b"%d" % (i % 97), "value": b"%08d" % i} for i in range(total)),
    )
    _commit(admin_source, group, topic, {0: 100, 1: 200})
    destination_topic = f"{topic}.copy"
    app, intruder = f"User:{unique}-app", f"User:{unique}-intruder"
    source_acls = [
        _acl(topic, app, AclOperation.READ),
        _acl(topic, app, AclOperation.DESCRIBE),
        _acl(topic, app, AclOperation.WRITE),  # never granted downstream
        _acl(topic, intruder, AclOperation.ALL),  # becomes READ
        _acl(topic, intruder, AclOperation.WRITE, AclPermissionType.DENY),  # copied as it is
        _acl("*", app, AclOperation.ALTER),  # not a literal topic name: not copied
        _acl(f"{topic}-elsewhere", app, AclOperation.READ),  # not replicated: not copied
    ]
    source_admin = AdminClient(admin_source)
    for future in source_admin.create_acls(source_acls).values():
        future.result(timeout=30)
    grant_documented(
        secured_kafka,
        {"replication", "topic creation", "config sync", "heartbeats", "offset translation", "offset sync", "ACL sync"},
        {
            "each source topic": [topic, HEARTBEATS_TOPIC],
            "each destination topic": [destination_topic, f"{HEARTBEATS_TOPIC}.copy"],
            "each translated group": [group],
            "mirus-<connector>": [f"mirus-{unique}"],
            "mirus-<connector>-translate": [f"mirus-{unique}-translate"],
        },
    )
    properties = secured_properties(
        secured_kafka,
        unique,
        credentials,
        **{
            "topics.whitelist": f"{topic},{HEARTBEATS_TOPIC}",
            "destination.topic.name.suffix": ".copy",
            "sync.topic.configs.interval.seconds": "1",
            "emit.heartbeats.interval.seconds": "1",
            "groups": group,
            "emit.checkpoints.interval.seconds": "1",
            "sync.group.offsets.enabled": "true",
            "sync.group.offsets.interval.seconds": "1",
        },
    )
    create_connector(store, properties, {})
    watcher = MetadataWatcher(store)
    wait_until(
        lambda: watcher.watch_once() is not None and len(store.current_assignment(unique)[1].get(0, [])) == 5,
        timeout=60,
        what="the topic's 4 partitions and the heartbeats partition assigned",
    )
    runner = TaskThread.start(store, unique)
    try:
        report = check_replica(
            admin_source, topic, admin_destination, destination_topic, partitions=4, written=total, timeout=120
        )
        report.assert_at_least_once()
        assert not report.duplicated, f"{sum(report.duplicated.values())} copies made twice"

        _set_configs(admin_source, topic, {"retention.ms": "7200000"})

        def watched(condition: Callable[[], object], what: str) -> None:
            def met() -> object:
                watcher.watch_once()
                return condition()

            wait_until(met, timeout=60, interval=0.5, what=f"{what} (flow problems: {store.flow(unique).problems})")

        watched(lambda: _config(admin_destination, destination_topic, "retention.ms") == "7200000", "config sync")
        watched(lambda: flow_liveness_s(store, unique) is not None, "a heartbeat replicated")
        watched(lambda: {c.partition for c in store.checkpoints(unique, group)} == {0, 1}, "the group's checkpoints")
        translated = {c.partition: c.destination_offset for c in store.checkpoints(unique, group)}
        watched(lambda: _committed(admin_destination, group, destination_topic) == translated, "the group synced")
        expected_acls = {
            (app, AclOperation.READ, AclPermissionType.ALLOW),
            (app, AclOperation.DESCRIBE, AclPermissionType.ALLOW),
            (intruder, AclOperation.READ, AclPermissionType.ALLOW),
            (intruder, AclOperation.WRITE, AclPermissionType.DENY),
        }
        watched(lambda: _acls_of(admin_destination, {app, intruder}) == expected_acls, "topic ACLs synced")
        assert _acls_of(admin_destination, {app, intruder}, "*") == set()
        # ... and shown on the connectors asset: the test's ACLs and the principals' own grants on its topics.
        shown = re.compile(r"topic ACLs: (\d+) mirrored at ")

        def synced_shown() -> bool:
            found = shown.search(_asset(store.connector_statuses(unique)[0]))
            return found is not None and int(found.group(1)) >= len(expected_acls)

        watched(synced_shown, "the ACL sync shown on the connectors asset")
    finally:
        runner.finish()
    assert store.flow(unique).problems == {}
    _nothing_shows(
        security,
        _stored_text(db_engine, unique),
        *runner.events,
        *(record.getMessage() for record in caplog.records),
        repr(store.get_connector(unique)),
    )


# -- helpers ----------------------------------------------------------------------------------------------------


def _acl(
    topic: str, principal: str, operation: AclOperation, permission: AclPermissionType = AclPermissionType.ALLOW
) -> AclBinding:
    return AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, principal, "*", operation, permission)


def _acls_of(
    cluster: dict[str, str], principals: set[str], topic: str | None = None
) -> set[tuple[str, AclOperation, AclPermissionType]]:
    """The topic ACLs of `principals` on every topic (or on `topic`)."""
    admin = AdminClient(cluster)
    found = admin.describe_acls(
        AclBindingFilter(
            ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, None, None, AclOperation.ANY, AclPermissionType.ANY
        )
    ).result(timeout=10)
    return {(b.principal, b.operation, b.permission_type) for b in found if b.principal in principals}


def _asset(status: ConnectorStatus) -> str:
    """The connector's row of the `connectors` asset."""
    return connectors_markdown([status], {}, {}, {}, datetime.now(UTC))


def _commit(cluster: dict[str, str], group: str, topic: str, offsets: Mapping[int, int]) -> None:
    consumer = Consumer({**cluster, "group.id": group, "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False)
    finally:
        consumer.close()


def _committed(cluster: dict[str, str], group: str, topic: str) -> dict[int, int]:
    consumer = Consumer({**cluster, "group.id": group, "enable.auto.commit": False})
    try:
        found = consumer.committed([TopicPartition(topic, p) for p in range(4)], timeout=10)
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in found if tp.offset >= 0}


def _config(cluster: dict[str, str], topic: str, name: str) -> str | None:
    admin, resource = AdminClient(cluster), ConfigResource(ResourceType.TOPIC, topic)
    return admin.describe_configs([resource])[resource].result(timeout=10)[name].value


def _set_configs(cluster: dict[str, str], topic: str, configs: dict[str, str]) -> None:
    """Replace the topic's configs (Kafka 1.0 has no incremental AlterConfigs)."""
    admin, resource = AdminClient(cluster), ConfigResource(ResourceType.TOPIC, topic, set_config=configs)
    with warnings.catch_warnings():  # deprecated for incremental_alter_configs, which Kafka 1.0 lacks
        warnings.simplefilter("ignore", DeprecationWarning)
        admin.alter_configs([resource])[resource].result(timeout=10)


# -- refusals ---------------------------------------------------------------------------------------------------

REFUSALS: dict[str, tuple[str, Callable[[KafkaKit], str], str, str]] = {
    # case: (the property that is wrong, its value, the cluster refusing, what the broker or the handshake says)
    "wrong password": (
        "consumer.sasl.password",
        lambda _kit: "${env:MIRUS_SECRET_WRONG_PASSWORD}",
        "source",
        "SASL authentication error: Authentication failed due to invalid credentials with SASL mechanism SCRAM-SHA-512",
    ),
    "unknown CA": (
        "target.cluster.ssl.ca.location",
        lambda _kit: certifi.where(),
        "destination",
        "certificate verify failed",
    ),
    # `127.1` reaches 127.0.0.1, but it is not a name the broker's certificate holds (IP:127.0.0.1, DNS:localhost).
    "host name mismatch": (
        "target.cluster.bootstrap.servers",
        lambda kit: f"127.1:{kit.brokers[1].listen_port}",
        "destination",
        "certificate verify failed",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_a_refused_connection_shows_on_the_connector_within_10_seconds(
    secured_kafka: KafkaKit,
    security: KitSecurity,
    store: Store,
    db_engine: Engine,
    unique: str,
    credentials: tuple[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
    case: str,
) -> None:
    """The cluster, the principal and the reason, on the connector's status (REST API, `connectors` asset) and the
    task's failure, never a silent retry loop; a corrected config is read at once. No secret in the status, the
    metrics, the stored rows, the task's events, the logs or librdkafka's output."""
    monkeypatch.setenv("MIRUS_SECRET_WRONG_PASSWORD", "not-" + security.passwords["replicator"])
    setting, value, cluster, reason = REFUSALS[case]
    properties = secured_properties(secured_kafka, unique, credentials, **{"topics.whitelist": unique})
    create_topics(_cluster(secured_kafka, "source"), {unique: 1})
    wrong = {**properties, setting: value(secured_kafka)}
    create_connector(store, wrong, {0: [(unique, 0)]})
    watcher = MetadataWatcher(store)
    bootstrap = wrong["consumer.bootstrap.servers" if cluster == "source" else "target.cluster.bootstrap.servers"]
    expected = f"{cluster} cluster ({bootstrap} over SASL_SSL as User:replicator) refused the connection: "

    # The task and the metadata watcher start together, as a connector's run and the code server's watcher do.
    started = time.monotonic()
    runner = TaskThread.start(store, unique)  # a task refused at its start fails, naming the refusal
    watcher.watch_once()
    with pytest.raises(ClusterIdentityError) as refused:
        runner.join(timeout=30)
    with serve_api(store, ApiSettings()) as url:
        body = requests.get(f"{url}/connectors/{unique}/status", timeout=10).json()
        shown_after = time.monotonic() - started
        metrics = requests.get(f"{url}/metrics", timeout=10).text
    assert shown_after < 10, f"shown after {shown_after:.1f} s"
    assert body["connector"]["state"] == "FAILED"
    trace = body["connector"]["trace"]
    assert trace.startswith(f"{cluster} metadata: {expected}") and reason in trace, trace
    [task] = body["tasks"]
    assert task["state"] == "FAILED" and expected in task["trace"] and reason in task["trace"], task
    assert expected in str(refused.value)
    assert f'mirus_connector_tasks{{connector="{unique}",state="FAILED"}} 1.0' in metrics
    [status] = store.connector_statuses(unique)
    assert f"{cluster} metadata: {expected}" in _asset(status)

    store.put_connector(unique, properties, 1)  # corrected
    wait_until(lambda: watcher.watch_once() and not store.connector_statuses(unique)[0].metadata_errors, timeout=30)
    _nothing_shows(
        security,
        _stored_text(db_engine, unique),
        json.dumps(body),
        metrics,
        _asset(status),
        *capfd.readouterr(),  # librdkafka's own log lines included
        *runner.events,
        *(record.getMessage() for record in caplog.records),
    )


def test_a_topic_refused_by_an_acl_pauses_alone_and_a_grant_resumes_it_without_a_restart(
    secured_kafka: KafkaKit, store: Store, unique: str, credentials: tuple[str, Path]
) -> None:
    admin_source, admin_destination = _cluster(secured_kafka, "source"), _cluster(secured_kafka, "destination")
    allowed, refused = f"{unique}-a", f"{unique}-b"
    create_topics(admin_source, {allowed: 1, refused: 1})
    produce(admin_source, [{"topic": t, "value": b"%03d" % i} for t in (allowed, refused) for i in range(100)])
    granted = grant_documented(
        secured_kafka,
        {"replication", "topic creation", "config sync"},
        {
            "each source topic": [allowed, refused],
            "each destination topic": [allowed, refused],
            "mirus-<connector>": [f"mirus-{unique}"],
        },
    )
    [read] = [b for b in granted if b.name == refused and b.operation == AclOperation.READ]
    source_admin = AdminClient(admin_source)
    source_admin.delete_acls([_filter(read)])[_filter(read)].result(timeout=30)  # Describe stays: it is listed
    # ACL sync (on by default) may read the source's ACLs but not create any at the destination.
    grant_documented(secured_kafka, {"ACL sync"}, {}, only="source")
    app_read = _acl(allowed, f"User:{unique}-app", AclOperation.READ)
    source_admin.create_acls([app_read])[app_read].result(timeout=30)
    properties = secured_properties(
        secured_kafka,
        unique,
        credentials,
        **{
            "topics.whitelist": f"{allowed},{refused}",
            "emit.heartbeats.enabled": "false",
            "emit.checkpoints.enabled": "false",
        },
    )
    create_connector(store, properties, {})
    watcher = MetadataWatcher(store)

    def paused() -> str | None:
        """Why the task paused the refused partition (before a task claims it, the watcher's hold shows)."""
        status = store.partition_statuses(unique).get((refused, 0))
        refusal = status is not None and status.state == PartitionHealth.PAUSED and status.task_id is not None
        return status.reason if refusal else None

    def ready() -> bool:
        watcher.watch_once()
        destination = AdminClient(admin_destination).list_topics(timeout=5).topics
        return len(store.current_assignment(unique)[1].get(0, [])) == 2 and {allowed, refused} <= destination.keys()

    wait_until(ready, timeout=60, what="both topics assigned, their destination topics created")
    started = time.monotonic()
    runner = TaskThread.start(store, unique)
    try:
        reason = wait_until(paused, timeout=30, interval=0.2, what=f"{refused}[0] paused")
        assert time.monotonic() - started < 10
        who = f"source cluster ({secured_kafka.brokers[0].bootstrap} over SASL_SSL as User:replicator)"
        assert reason.startswith(f"{who} refused reading topic {refused!r}: "), reason
        assert reason.endswith(
            f"Topic authorization failed (TOPIC_AUTHORIZATION_FAILED); the principal needs Read on Topic {refused!r} "
            "there (docs/SECURITY.md)"
        ), reason
        assert len(consume_all(admin_destination, allowed, 1, expected=100)) == 100  # the rest flows
        source_admin.create_acls([read])[read].result(timeout=30)
        resumed = consume_all(admin_destination, refused, 1, expected=100, timeout=90)
        assert [r.value for r in resumed] == [b"%03d" % i for i in range(100)]
        assert runner.thread is not None and runner.thread.is_alive()  # the same task, never restarted
        assert store.partition_statuses(unique)[(refused, 0)].state == PartitionHealth.ACTIVE
    finally:
        runner.finish()
    # ACL sync (on by default) lacks its ACLs here: shown on the connector, and replication goes on without it.
    [status] = store.connector_statuses(unique)
    who = f"destination cluster ({secured_kafka.brokers[1].bootstrap} over SASL_SSL as User:replicator)"
    shown = re.search(r"acl sync: [^;]*; [^)]*\)", _asset(status))
    assert shown is not None and shown.group().startswith(f"acl sync: {who} refused CreateAcls for "), _asset(status)
    assert shown.group().endswith(
        "(CLUSTER_AUTHORIZATION_FAILED); the principal needs Alter on the Cluster there (docs/SECURITY.md)"
    ), shown.group()


def _filter(binding: AclBinding) -> AclBindingFilter:
    return AclBindingFilter(
        binding.restype,
        binding.name,
        binding.resource_pattern_type,
        binding.principal,
        binding.host,
        binding.operation,
        binding.permission_type,
    )


def test_exactly_once_between_secured_clusters_with_only_the_documented_acls(
    secured_kafka: KafkaKit, store: Store, unique: str, credentials: tuple[str, Path]
) -> None:
    """Transactions, fencing and a restart's resume from the destination, as a principal holding only the
    documented ACLs of replication, topic creation and exactly-once; the destination's login as MirrorMaker 2 users
    write it, a Java JAAS config with the password from a file reference."""
    admin_source, admin_destination = _cluster(secured_kafka, "source"), _cluster(secured_kafka, "destination")
    create_topics(admin_source, {unique: 2})
    grant_documented(
        secured_kafka,
        {"replication", "topic creation", "exactly-once"},
        {
            "each source topic": [unique],
            "each destination topic": [unique],
            "mirus-<connector>": [f"mirus-{unique}"],
            "mirus-<connector>-<task>": [f"mirus-{unique}-0"],
        },
    )
    properties = secured_properties(
        secured_kafka,
        unique,
        credentials,
        **{
            "topics.whitelist": unique,
            "exactly.once.support": "required",
            **DUTIES_OFF,
        },
    )
    password_file = credentials[1]
    for setting in ("username", "password"):
        del properties[f"target.cluster.sasl.{setting}"]
    properties["target.cluster.sasl.jaas.config"] = (
        'org.apache.kafka.common.security.scram.ScramLoginModule required username="replicator" '
        f'password="${{file:{password_file}:password}}";'
    )
    create_connector(store, properties, {})
    watcher = MetadataWatcher(store)
    wait_until(lambda: watcher.watch_once() and len(store.current_assignment(unique)[1].get(0, [])) == 2, timeout=60)
    records = [{"topic": unique, "partition": i % 2, "value": b"%06d" % i} for i in range(4_000)]
    produce(admin_source, records[:2_000])
    runner = TaskThread.start(store, unique)
    try:
        consume_all({**admin_destination, "isolation.level": "read_committed"}, unique, 2, expected=2_000)
    finally:
        runner.finish()
    produce(admin_source, records[2_000:])
    runner = TaskThread.start(store, unique)  # fences the first instance's transactional.id, resumes
    try:
        report = check_replica(admin_source, unique, admin_destination, partitions=2, written=4_000)
    finally:
        runner.finish()
    report.assert_exactly_once()
    assert store.flow(unique).problems == {}


def test_a_credential_broken_then_fixed_costs_a_restart_and_copies_nothing_twice(
    secured_kafka: KafkaKit,
    security: KitSecurity,
    store: Store,
    unique: str,
    credentials: tuple[str, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    admin_source, admin_destination = _cluster(secured_kafka, "source"), _cluster(secured_kafka, "destination")
    create_topics(admin_source, {unique: 2})
    create_topics(admin_destination, {unique: 2})
    grant_documented(
        secured_kafka,
        {"replication"},
        {"each source topic": [unique], "each destination topic": [unique], "mirus-<connector>": [f"mirus-{unique}"]},
    )
    properties = secured_properties(
        secured_kafka,
        unique,
        credentials,
        **{
            "topics.whitelist": unique,
            "topic.creation.enable": "false",
            **DUTIES_OFF,
        },
    )
    create_connector(store, properties, {0: [(unique, 0), (unique, 1)]})
    records = [{"topic": unique, "partition": i % 2, "value": b"%06d" % i} for i in range(2_000)]
    produce(admin_source, records[:1_000])
    runner = TaskThread.start(store, unique)
    consume_all(admin_destination, unique, 2, expected=1_000)

    monkeypatch.setenv("MIRUS_SECRET_ROTATED_AWAY", "not-" + security.passwords["replicator"])
    store.put_connector(unique, {**properties, "consumer.sasl.password": "${env:MIRUS_SECRET_ROTATED_AWAY}"}, 1)
    with pytest.raises(
        ClusterIdentityError, match=r"source cluster \(.*\) refused the connection: .*SASL authentication"
    ):
        runner.join(timeout=60)  # the new version's clients are refused: the task fails, naming why

    store.put_connector(unique, properties, 1)  # fixed: the next run (the supervisor's restart) replicates
    produce(admin_source, records[1_000:])
    runner = TaskThread.start(store, unique)
    try:
        report = check_replica(admin_source, unique, admin_destination, partitions=2, written=2_000)
    finally:
        runner.finish()
    report.assert_exactly_once()


def test_mutual_tls_replicates_as_the_certificates_principal(
    secured_kafka: KafkaKit, security: KitSecurity, store: Store, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Client certificates instead of SASL (an SSL listener that requires one): the keystore's password from a
    reference, every client presenting the certificate, the principal its subject with only the documented ACLs."""
    admin_source, admin_destination = _cluster(secured_kafka, "source"), _cluster(secured_kafka, "destination")
    create_topics(admin_source, {unique: 2})
    produce(admin_source, [{"topic": unique, "partition": i % 2, "value": b"%05d" % i} for i in range(1_000)])
    grant_documented(
        secured_kafka,
        {"replication", "topic creation"},
        {"each source topic": [unique], "each destination topic": [unique], "mirus-<connector>": [f"mirus-{unique}"]},
        principal=CERTIFICATE_PRINCIPAL,
    )
    variable = secret_variable(unique)
    monkeypatch.setenv(variable, security.store_password)
    tls = {
        "security.protocol": "SSL",
        "ssl.ca.location": str(security.ca_pem),
        "ssl.keystore.location": str(security.client_keystore),
        "ssl.keystore.password": f"${{env:{variable}}}",
    }
    source, destination = (f"127.0.0.1:{broker.mtls_port}" for broker in secured_kafka.brokers)
    properties = {
        "name": unique,
        "connector.class": "org.apache.kafka.connect.mirror.MirrorSourceConnector",
        "topics": unique,
        "replication.policy.class": "org.apache.kafka.connect.mirror.IdentityReplicationPolicy",
        "source.cluster.bootstrap.servers": source,
        "target.cluster.bootstrap.servers": destination,
        **{f"source.cluster.{k}": v for k, v in tls.items()},
        **{f"target.cluster.{k}": v for k, v in tls.items()},
        **DUTIES_OFF,
    }
    create_connector(store, properties, {})
    watcher = MetadataWatcher(store)
    wait_until(lambda: watcher.watch_once() and len(store.current_assignment(unique)[1].get(0, [])) == 2, timeout=60)
    runner = TaskThread.start(store, unique)
    try:
        report = check_replica(admin_source, unique, admin_destination, partitions=2, written=1_000)
    finally:
        runner.finish()
    report.assert_exactly_once()
    assert store.flow(unique).problems == {}
    assert security.store_password not in json.dumps(store.get_connector(unique).properties)


def test_a_destination_topic_refused_by_an_acl_pauses_alone_and_a_grant_resumes_it(
    secured_kafka: KafkaKit, store: Store, unique: str, credentials: tuple[str, Path]
) -> None:
    admin_source, admin_destination = _cluster(secured_kafka, "source"), _cluster(secured_kafka, "destination")
    allowed, refused = f"{unique}-a", f"{unique}-b"
    for cluster in (admin_source, admin_destination):
        create_topics(cluster, {allowed: 1, refused: 1})
    produce(admin_source, [{"topic": t, "value": b"%03d" % i} for t in (allowed, refused) for i in range(100)])
    granted = grant_documented(
        secured_kafka,
        {"replication"},
        {
            "each source topic": [allowed, refused],
            "each destination topic": [allowed, refused],
            "mirus-<connector>": [f"mirus-{unique}"],
        },
    )
    [write] = [b for b in granted if b.name == refused and b.operation == AclOperation.WRITE]
    destination_admin = AdminClient(admin_destination)
    destination_admin.delete_acls([_filter(write)])[_filter(write)].result(timeout=30)
    properties = secured_properties(
        secured_kafka,
        unique,
        credentials,
        **{
            "topics.whitelist": f"{allowed},{refused}",
            "topic.creation.enable": "false",
            **DUTIES_OFF,
        },
    )
    create_connector(store, properties, {0: [(allowed, 0), (refused, 0)]})
    started = time.monotonic()
    runner = TaskThread.start(store, unique)
    try:

        def paused() -> str | None:
            status = store.partition_statuses(unique).get((refused, 0))
            return status.reason if status is not None and status.state == PartitionHealth.PAUSED else None

        reason = wait_until(paused, timeout=30, interval=0.2, what=f"{refused}[0] paused")
        assert time.monotonic() - started < 10
        who = f"destination cluster ({secured_kafka.brokers[1].bootstrap} over SASL_SSL as User:replicator)"
        assert reason == (
            f"{who} refused writing to {refused!r}: Broker: Topic authorization failed (TOPIC_AUTHORIZATION_FAILED); "
            f"the principal needs Write on Topic {refused!r} there (docs/SECURITY.md)"
        )
        # The rest flows. At least once: the refused batch stops the (gapless) producer that the other topic's
        # unacknowledged records were in, and they are written again by its successor.
        flowed = consume_all(admin_destination, allowed, 1, expected=100, distinct=lambda r: r.value)
        assert {r.value for r in flowed} == {b"%03d" % i for i in range(100)}
        destination_admin.create_acls([write])[write].result(timeout=30)
        resumed = consume_all(admin_destination, refused, 1, expected=100, timeout=90)
        assert [r.value for r in resumed] == [b"%03d" % i for i in range(100)]
        assert runner.thread is not None and runner.thread.is_alive()  # the same task, never restarted
    finally:
        runner.finish()


def test_a_named_topic_the_principal_may_not_see_is_shown_on_the_connector(
    secured_kafka: KafkaKit, store: Store, unique: str, credentials: tuple[str, Path]
) -> None:
    """Metadata leaves out a topic the principal may not describe, so a connector would silently replicate nothing
    of it: the topics its config names are asked about, and a refusal is a flow problem until the ACL is granted.
    A topic it sees but may not read the configs of (to create its copy) is held back naming that ACL."""
    admin_source = _cluster(secured_kafka, "source")
    visible, hidden = f"{unique}-a", f"{unique}-b"
    create_topics(admin_source, {visible: 1, hidden: 1})
    names = {"each source topic": [visible], "each destination topic": [visible, hidden]}
    grant_documented(secured_kafka, {"replication"}, names)
    grant_documented(secured_kafka, {"topic creation"}, names, only="destination")
    properties = secured_properties(
        secured_kafka,
        unique,
        credentials,
        **{
            "topics.whitelist": f"{visible},{hidden},{unique}-not-created-yet",
            **DUTIES_OFF,
        },
    )
    create_connector(store, properties, {})
    watcher = MetadataWatcher(store)
    started = time.monotonic()
    watcher.watch_once()
    who = f"source cluster ({secured_kafka.brokers[0].bootstrap} over SASL_SSL as User:replicator)"
    [status] = store.connector_statuses(unique)
    assert time.monotonic() - started < 10
    absent = f"{unique}-not-created-yet"  # without Describe, a missing topic is refused too: the ACL is missing
    hint = "the principal needs Describe and Read on Topic {!r} there (docs/SECURITY.md)"
    for topic in (hidden, absent):
        shown = f"source topic {topic}: {who} does not show topic {topic!r} (Broker: Topic authorization failed): "
        assert shown + hint.format(topic) in _asset(status)
    assert (
        f"{visible}[0] PAUSED: destination topic {visible!r} not created: source topic cannot read topic configs: "
        "Broker: Topic authorization failed (TOPIC_AUTHORIZATION_FAILED); the principal needs DescribeConfigs on "
        f"Topic {visible!r} (docs/SECURITY.md)"
    ) in _asset(status)

    grant_documented(secured_kafka, {"replication", "topic creation"}, {"each source topic": [hidden]}, only="source")
    wait_until(
        lambda: watcher.watch_once() and (hidden, 0) in store.current_assignment(unique)[1].get(0, []),
        timeout=30,
        what=f"{hidden} assigned once granted",
    )
    assert f"source topic {hidden}" not in store.flow(unique).problems


def test_a_refused_password_stays_out_of_the_dagster_run_history(
    secured_kafka: KafkaKit,
    security: KitSecurity,
    store: Store,
    unique: str,
    credentials: tuple[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    instance: dg.DagsterInstance,
    resources: dict,
) -> None:
    """The wrong-password case as the platform runs it: the run_starter sensor's replicator run fails naming the
    refusal, and neither the password given nor the right ones are in any file of the Dagster instance (runs, run
    configs, event logs, compute logs) — what the UI's run history shows."""
    wrong = "not-" + security.passwords["replicator"]
    monkeypatch.setenv("MIRUS_SECRET_WRONG_PASSWORD", wrong)
    properties = secured_properties(secured_kafka, unique, credentials, **{"topics.whitelist": unique, **DUTIES_OFF})
    create_topics(_cluster(secured_kafka, "source"), {unique: 1})
    refused = {**properties, "consumer.sasl.password": "${env:MIRUS_SECRET_WRONG_PASSWORD}"}
    create_connector(store, refused, {0: [(unique, 0)]})
    request = requests_for(evaluate(run_starter, instance, resources, None), unique)[0]
    run = InProcessRun(instance, resources, request).join()
    assert not run.success
    failure = step_failure_message(run, with_causes=True)
    assert "source cluster" in failure and "refused the connection" in failure, failure
    written = [*_secrets(security), wrong]
    leaks = {secret[:4]: files_containing(Path(instance.root_directory), secret.encode()) for secret in written}
    assert {start: files for start, files in leaks.items() if files} == {}
    # The search read where the refusal is kept: the run's events hold it.
    assert files_containing(Path(instance.root_directory), b"refused the connection")
