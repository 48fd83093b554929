"""Latency of `PUT /connectors/{name}/config` until the new version is stored, over real HTTP.

    python benchmarks/api_put_latency.py [--requests 200]

Starts a private embedded stack on free ports (or uses MIRUS_SOURCE_BOOTSTRAP_SERVERS /
MIRUS_DESTINATION_BOOTSTRAP_SERVERS / MIRUS_DATABASE_URL) and `mirus api` as its own process, as an operator runs
it, then sends the Mirus quick-start config again and again (each a new version: `tasks.max` alternates). The
response is sent only after the version's transaction committed, so request-to-response time is the time to
stored; each version is checked in Postgres afterwards. The first 10 requests warm up and are not counted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import common
import requests

from mirus.waiting import wait_until
from replicator.state.database import make_engine, upgrade
from replicator.state.store import Store

TARGET_MS = 100.0
WARM_UP = 10
NAME = "mirus-quickstart-source"


def _answers(url: str) -> bool:
    try:
        requests.get(url, timeout=1)
    except requests.ConnectionError:
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="mirus-bench-api-") as state:
        stack = common.embedded_stack(Path(state))
        api_port = common.free_port()
        endpoints = stack.up()
        api = None
        try:
            engine = make_engine(endpoints.database_url)
            upgrade(engine)
            store = Store(engine)
            env = {**os.environ, **endpoints.as_env(), "MIRUS_STATE_DIR": state}
            argv = [sys.executable, "-m", "mirus.cli.main", "api", "--port", str(api_port)]
            api = common.start_process(argv, env)
            url = f"http://127.0.0.1:{api_port}"
            wait_until(lambda: _answers(url), 60, 0.1, "mirus api to answer")

            config = {
                "name": NAME,
                "connector.class": "com.salesforce.mirus.MirusSourceConnector",
                "topics.whitelist": "test",
                "destination.topic.name.suffix": ".mirror",
                "destination.consumer.bootstrap.servers": endpoints.destination_bootstrap_servers,
                "consumer.bootstrap.servers": endpoints.source_bootstrap_servers,
                "consumer.client.id": "mirus-quickstart",
                "consumer.key.deserializer": "org.apache.kafka.common.serialization.ByteArrayDeserializer",
                "consumer.value.deserializer": "org.apache.kafka.common.serialization.ByteArrayDeserializer",
            }
            session = requests.Session()
            timings_ms = []
            for i in range(args.requests + WARM_UP):
                body = {**config, "tasks.max": str(1 + i % 5)}
                start = time.perf_counter()
                response = session.put(f"{url}/connectors/{NAME}/config", json=body)
                elapsed = (time.perf_counter() - start) * 1000
                if response.status_code not in (200, 201):
                    raise RuntimeError(f"PUT failed: {response.status_code} {response.text}")
                if store.get_connector(NAME).tasks_max != 1 + i % 5:
                    raise RuntimeError(f"version {i + 1} was not stored when the response came")
                if i >= WARM_UP:
                    timings_ms.append(elapsed)
        finally:
            if api is not None:
                api.terminate()
                api.wait(15)
            stack.down()

    timings_ms.sort()
    median = statistics.median(timings_ms)
    p95 = timings_ms[int(0.95 * (len(timings_ms) - 1))]
    verdict = "met" if median <= TARGET_MS else "NOT met"
    print(f"PUT /connectors/{{name}}/config -> stored, {len(timings_ms)} requests over real HTTP")
    print(f"  median {median:.1f} ms   p95 {p95:.1f} ms   max {timings_ms[-1]:.1f} ms   min {timings_ms[0]:.1f} ms")
    print(f"  target median <= {TARGET_MS:.0f} ms: {verdict}")


if __name__ == "__main__":
    main()
