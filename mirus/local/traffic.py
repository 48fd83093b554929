"""The demo's traffic: a steady stream of orders to the demo clusters' source topics, until interrupted.

`mirus dev` runs it as `python -m mirus.local.traffic`, a process that imports only what it writes with, not the
whole `mirus` command line; `mirus demo traffic` is the same command.
"""

from __future__ import annotations

import json
import random
import time

import click
from confluent_kafka import Producer

from mirus_dagster.constants import DEMO_TOPIC, EXAMPLE_TOPIC


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


if __name__ == "__main__":
    traffic()
