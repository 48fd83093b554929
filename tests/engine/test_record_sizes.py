"""Records of any size the topics take. The task's clients follow its topics' `max.message.bytes`
(`replicator.engine.record_limits`): records of megabytes between topics of 10 MiB arrive intact and in order at
default settings, and a record larger than its destination topic takes pauses its partition alone, with a reason
that names the limit, both sizes and what to change — on the REST status, `/metrics` and the `connectors` asset —
until the limit is raised at the destination, which lets it through without a restart. Both delivery modes.

On Apache Kafka (`apache_kafka`): the embedded broker does not enforce `max.message.bytes`. Its single-broker
clusters need no `replica.fetch.max.bytes` (no replica fetches, and since Kafka 0.10.1 a fetch returns a batch larger
than its limit anyway).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import requests
from confluent_kafka.admin import AdminClient, ConfigResource
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine

from assets.connectors import connectors_markdown
from mirus.api.auth import ApiSettings
from mirus.waiting import wait_until
from mirus_dagster.settings import StackEndpoints
from replicator.clusters import SizeLimit
from replicator.configuration.connector import load
from replicator.engine.record_limits import Readings, RecordLimits
from replicator.engine.task import TaskExit
from replicator.state.records import PartitionHealth
from replicator.state.store import Store
from tests.fixtures.api_helpers import serve_api
from tests.fixtures.engine_helpers import TaskThread, connector_properties, create_connector
from tests.fixtures.kafka_helpers import create_topics, produce
from tests.fixtures.replica_check import check_replica

MIB = 1024 * 1024
TOPIC_LIMIT = 10 * MIB  # 10,485,760
EXACTLY_ONCE = {"exactly.once.support": "required"}
MODES = pytest.mark.parametrize("mode", [{}, EXACTLY_ONCE], ids=["at-least-once", "exactly-once"])


@pytest.fixture(scope="module")
def api(apache_kafka: StackEndpoints, db_engine: Engine) -> Iterator[str]:
    with serve_api(Store(db_engine), ApiSettings(), apache_kafka.destination_bootstrap_servers) as url:
        yield url


def _payload(size: int, tag: bytes) -> bytes:
    """`size` bytes that say which record they are, so a copy of the wrong record cannot pass for it."""
    return (tag * (size // len(tag) + 1))[:size]


def _topics(kafka: StackEndpoints, topic: str, source_limit: int, destination_limit: int) -> None:
    create_topics(kafka.source_bootstrap_servers, {topic: 2}, config={"max.message.bytes": str(source_limit)})
    create_topics(kafka.destination_bootstrap_servers, {topic: 2}, config={"max.message.bytes": str(destination_limit)})


def _produce(kafka: StackEndpoints, records: list[dict[str, Any]]) -> None:
    produce(kafka.source_bootstrap_servers, records, **{"message.max.bytes": 3 * TOPIC_LIMIT})


def _set_limit(bootstrap: str, topic: str, limit: int) -> None:
    """AlterConfigs, as an operator raises a topic's limit (Kafka 1.0 replaces the topic's overrides: all given)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, set_config={"max.message.bytes": str(limit)})
    for future in admin.alter_configs([resource]).values():
        future.result(timeout=30)


def _paused_on(store: Store, connector: str, tp: tuple[str, int]) -> str | None:
    status = store.partition_statuses(connector).get(tp)
    return status.reason if status and status.state == PartitionHealth.PAUSED else None


def _paused_metric(api: str, connector: str) -> dict[str, float]:
    """`mirus_partitions_paused` of `connector` by cause, as Prometheus scrapes it."""
    text = requests.get(f"{api}/metrics", timeout=30).text
    family = next(f for f in text_string_to_metric_families(text) if f.name == "mirus_partitions_paused")
    return {s.labels["cause"]: s.value for s in family.samples if s.labels["connector"] == connector}


def _check(kafka: StackEndpoints, topic: str, written: int, mode: dict[str, str]) -> None:
    replica = check_replica(
        kafka.source_bootstrap_servers, topic, kafka.destination_bootstrap_servers, partitions=2, written=written
    )
    if mode:
        replica.assert_exactly_once()
    else:
        replica.assert_at_least_once()


@MODES
def test_records_of_megabytes_arrive_intact_and_in_order_at_default_settings(
    apache_kafka: StackEndpoints, store: Store, unique: str, mode: dict[str, str]
) -> None:
    _topics(apache_kafka, unique, TOPIC_LIMIT, TOPIC_LIMIT)
    sizes = [10, 1_500_000, 20, 8_000_000, 30]  # each large record between small neighbours
    _produce(
        apache_kafka,
        [
            {"topic": unique, "partition": p, "key": b"k%d-%d" % (p, i), "value": _payload(size, b"%d-%d." % (p, i))}
            for p in range(2)
            for i, size in enumerate(sizes)
        ],
    )
    create_connector(
        store,
        connector_properties(apache_kafka, unique, **{"topics.whitelist": unique, **mode}),
        {0: [(unique, 0), (unique, 1)]},
    )

    runner = TaskThread.start(store, unique)
    wait_until(
        lambda: store.load_offsets(unique) == {(unique, 0): 5, (unique, 1): 5}, timeout=90, what="every record copied"
    )
    assert runner.finish() is TaskExit.STOPPED
    assert not [e for e in runner.events if "paused" in e], runner.events
    # Key, value, headers and timestamp of each, in source order, once (one task that never restarted).
    check_replica(
        apache_kafka.source_bootstrap_servers,
        unique,
        apache_kafka.destination_bootstrap_servers,
        partitions=2,
        written=10,
    ).assert_exactly_once()


@MODES
def test_a_record_too_large_for_its_destination_pauses_only_its_partition_until_the_limit_is_raised(
    apache_kafka: StackEndpoints, store: Store, unique: str, api: str, mode: dict[str, str]
) -> None:
    src, dst = apache_kafka.source_bootstrap_servers, apache_kafka.destination_bootstrap_servers
    _topics(apache_kafka, unique, 2 * TOPIC_LIMIT, TOPIC_LIMIT)
    big = 12 * MIB
    _produce(
        apache_kafka,
        [{"topic": unique, "partition": 0, "value": v} for v in (b"before", _payload(big, b"big."), b"after")],
    )
    create_connector(
        store,
        connector_properties(apache_kafka, unique, **{"topics.whitelist": unique, **mode}),
        {0: [(unique, 0), (unique, 1)]},
    )
    runner = TaskThread.start(store, unique)

    reason = wait_until(lambda: _paused_on(store, unique, (unique, 0)), what="partition 0 paused for its record")
    shown = re.fullmatch(
        rf"record of ([\d,]+) bytes at {re.escape(unique)}\[0\] offset 1 exceeds the destination topic "
        rf"{re.escape(unique)}'s max\.message\.bytes \(10,485,760\); raise it there",
        reason,
    )
    assert shown, reason
    assert big < int(shown[1].replace(",", "")) < big + 1024  # the record as written: headers and framing included
    # The other partition flows on, and nothing of partition 0 is committed past the record.
    produce(src, [{"topic": unique, "partition": 1, "value": b"%d" % i} for i in range(20)])
    wait_until(lambda: store.load_offsets(unique).get((unique, 1)) == 20, what="partition 1 keeps flowing")
    assert store.load_offsets(unique)[(unique, 0)] == 1

    # Where an operator looks: the REST status, the metric, the connectors asset.
    status = requests.get(f"{api}/connectors/{unique}/status", timeout=30).json()
    assert [{k: v for k, v in p.items() if k != "since"} for p in status["partitions"]] == [
        {"topic": unique, "partition": 0, "state": "PAUSED", "reason": reason, "task": 0}
    ]
    assert _paused_metric(api, unique) == {"record_too_large": 1, "operator": 0, "other": 0}
    table = connectors_markdown(store.connector_statuses(unique), {}, {}, {}, datetime.now(UTC))
    assert f"{unique}[0] PAUSED: {reason}" in table

    lease = store.lease_of(unique, 0)
    _set_limit(dst, unique, 2 * TOPIC_LIMIT)
    wait_until(
        lambda: store.load_offsets(unique).get((unique, 0)) == 3, timeout=90, what="partition 0 resumed past the record"
    )
    assert store.partition_statuses(unique)[(unique, 0)].state == PartitionHealth.ACTIVE
    assert "partitions" not in requests.get(f"{api}/connectors/{unique}/status", timeout=30).json()
    assert _paused_metric(api, unique)["record_too_large"] == 0
    # The same task instance: no restart, no takeover.
    assert runner.outcome is None and store.lease_of(unique, 0).epoch == lease.epoch
    assert runner.finish() is TaskExit.STOPPED
    _check(apache_kafka, unique, 23, mode)


def test_the_connectors_own_size_settings_win(apache_kafka: StackEndpoints, store: Store, unique: str) -> None:
    _topics(apache_kafka, unique, TOPIC_LIMIT, TOPIC_LIMIT)
    _produce(apache_kafka, [{"topic": unique, "partition": 0, "value": _payload(8_000_000, b"own.")}])
    own = {"producer.message.max.bytes": "5000000", "consumer.max.partition.fetch.bytes": "2097152"}
    create_connector(
        store,
        connector_properties(apache_kafka, unique, **{"topics.whitelist": unique, **own}),
        {0: [(unique, 0), (unique, 1)]},
    )
    runner = TaskThread.start(store, unique)
    reason = wait_until(lambda: _paused_on(store, unique, (unique, 0)), what="the record refused by the producer")
    assert re.fullmatch(
        rf"record of [\d,]+ bytes at {re.escape(unique)}\[0\] offset 0 exceeds the producer's message\.max\.bytes "
        r"\(5,000,000, set by the connector's producer\.message\.max\.bytes; raise or remove that setting\) "
        r"\(MSG_SIZE_TOO_LARGE\)",
        reason,
    ), reason
    # The clients were made with the connector's values; what it did not set follows the topics (10 MiB).
    consumer, producer = runner.task.clients.reader.flowing.settings, runner.task.clients.deliveries.settings
    assert (consumer["max.partition.fetch.bytes"], consumer["fetch.max.bytes"]) == ("2097152", 16 * MIB)
    assert (producer["message.max.bytes"], producer["batch.size"]) == ("5000000", MIB)
    assert runner.finish() is TaskExit.STOPPED
    assert store.load_offsets(unique).get((unique, 0), 0) == 0


def test_a_limit_read_late_at_the_value_the_clients_already_have_makes_nothing_again() -> None:
    # A task that took over under load read its topics' limits only later, and made every client again for them
    # although librdkafka's own sizes already fitted (a source topic at Kafka's default, 1,000,012 bytes).
    config = load(
        {"name": "late", "consumer.bootstrap.servers": "a:9092", "producer.bootstrap.servers": "b:9092"}
        | {"topics.whitelist": "t"}
    )
    limits = RecordLimits()
    limits.serve(config, ["t"], only=True)
    made_with = limits.sizes_of(config, 0)
    limits.apply(Readings(source={"t": SizeLimit(1_000_012, False)}, asked_source={"t"}))
    assert limits.sizes_of(config, 0) == made_with
    # A source topic of 10 MiB needs larger fetches, and a destination limit above the producer's own, a larger one.
    limits.apply(Readings(source={"t": SizeLimit(TOPIC_LIMIT, True)}, asked_source={"t"}))
    assert limits.sizes_of(config, 0) != made_with
    made_with = limits.sizes_of(config, 0)
    limits.apply(Readings(destination={"t": SizeLimit(TOPIC_LIMIT, True)}, asked_destination={"t"}))
    assert limits.sizes_of(config, 0) != made_with
