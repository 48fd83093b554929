"""The demo that `mirus dev` sets up: `orders` on the source cluster mirrored to `orders.mirror`, with traffic."""

from __future__ import annotations

from confluent_kafka.admin import AdminClient, NewTopic

from mirus_dagster.constants import DEMO_CONNECTOR, DEMO_PARTITIONS, DEMO_TOPIC, EXAMPLE_TOPIC
from mirus_dagster.settings import StackEndpoints
from replicator.configuration.connector import validate_submission
from replicator.state.records import UnknownConnectorError
from replicator.state.store import Store


def _ensure_topic(bootstrap: str, topic: str, partitions: int) -> None:
    # Notices and worse only: librdkafka's informational lines would land on the console of `mirus dev`.
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 5})
    if topic in admin.list_topics(timeout=10).topics:
        return
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(timeout=30)


def register_demo(endpoints: StackEndpoints, store: Store) -> None:
    """Create the demo topics and the Mirus-style demo connector unless they exist (idempotent)."""
    _ensure_topic(endpoints.source_bootstrap_servers, DEMO_TOPIC, DEMO_PARTITIONS)
    _ensure_topic(endpoints.destination_bootstrap_servers, f"{DEMO_TOPIC}.mirror", DEMO_PARTITIONS)
    _ensure_topic(endpoints.source_bootstrap_servers, EXAMPLE_TOPIC, DEMO_PARTITIONS)
    _ensure_topic(endpoints.destination_bootstrap_servers, f"{EXAMPLE_TOPIC}.dr", DEMO_PARTITIONS)
    try:
        store.get_connector(DEMO_CONNECTOR)
        return
    except UnknownConnectorError:
        pass
    config = validate_submission(
        {
            "name": DEMO_CONNECTOR,
            "connector.class": "com.salesforce.mirus.MirusSourceConnector",
            "tasks.max": "2",
            "topics.whitelist": DEMO_TOPIC,
            "destination.topic.name.suffix": ".mirror",
            "consumer.bootstrap.servers": endpoints.source_bootstrap_servers,
            "consumer.client.id": "mirus-demo",
            "destination.consumer.bootstrap.servers": endpoints.destination_bootstrap_servers,
        }
    )
    store.put_connector(config.name, config.raw, config.tasks_max)
