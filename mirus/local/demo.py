"""The demo that `mirus dev` sets up: `orders` on the source cluster mirrored to `orders.mirror`, with traffic."""

from __future__ import annotations

import json
import random
import time

import click
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from mirus_dagster.constants import DEMO_CONNECTOR, DEMO_PARTITIONS, DEMO_TOPIC
from mirus_dagster.settings import EXAMPLE_TOPIC, StackEndpoints
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


@click.command("traffic")
@click.option("--bootstrap-servers", required=True, help="Source cluster to write to.")
@click.option("--topic", "topics", multiple=True, default=(DEMO_TOPIC, EXAMPLE_TOPIC), show_default=True)
@click.option("--rate", default=10.0, show_default=True, help="Records per second.")
def traffic(bootstrap_servers: str, topics: tuple[str, ...], rate: float) -> None:
    """Write a steady stream of demo orders (keys, JSON values, headers) to the topics until interrupted."""
    producer = Producer({"bootstrap.servers": bootstrap_servers, "enable.idempotence": True, "linger.ms": 20})
    number = 0
    try:
        while True:
            number += 1
            customer = f"customer-{random.randint(1, 50)}"
            order = {"order": number, "customer": customer, "amount": round(random.uniform(5, 500), 2)}
            topic = topics[number % len(topics)]
            producer.produce(topic, json.dumps(order).encode(), customer.encode(), headers=[("source", b"demo")])
            producer.poll(0)
            time.sleep(1 / rate)
    except KeyboardInterrupt:
        pass
    finally:
        producer.flush(5)
