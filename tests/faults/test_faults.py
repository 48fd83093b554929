"""The fault-injection harness: replication under kill -9, Postgres restarts and network cuts loses nothing.

The long run (10 minutes, Apache Kafka, broker restarts and refusals too) is `mirus faults run`, documented in
benchmarks/README.md; these are its short forms, on Apache Kafka from the kit (the harness starts ZooKeeper and
two brokers of its own on free ports). The proxy tests run on the embedded broker.
"""

from __future__ import annotations

import contextlib
import random
import socket
import threading
import time
from collections import Counter
from pathlib import Path

from confluent_kafka import Producer
from sqlalchemy import Engine

from mirus.faults.brokers import tansu_broker
from mirus.faults.harness import EMBEDDED_FAULTS, FaultPlan, FaultReport, FaultRun
from mirus.faults.proxy import TcpProxy
from mirus.local.stack import free_port
from mirus.waiting import wait_until
from mirus_dagster.settings import StackEndpoints
from replicator.state.store import Store
from tests.fixtures.engine_helpers import TaskThread, connector_properties, create_connector
from tests.fixtures.kafka_helpers import consume_all, create_topics, produce


def test_a_cut_proxy_stops_every_client_because_the_broker_advertises_it(tmp_path: Path, unique: str) -> None:
    # Clients reconnect to the address in metadata: if the broker advertised its own port, a cut proxy would only
    # block the bootstrap connection and records would still flow.
    with TcpProxy(("127.0.0.1", free_port())) as proxy:
        broker = tansu_broker("proxied", proxy.target[1], proxy.port, tmp_path / "broker.log")
        broker.start()
        try:
            create_topics(proxy.address, {unique: 1})
            outcomes: list[str] = []
            producer = Producer({"bootstrap.servers": proxy.address, "message.timeout.ms": 2000})
            producer.produce(unique, b"before", on_delivery=lambda err, _m: outcomes.append(f"before:{err}"))
            assert producer.flush(30) == 0
            proxy.cut()
            producer.produce(unique, b"during", on_delivery=lambda err, _m: outcomes.append(f"during:{err}"))
            producer.flush(30)  # returns when the record times out (message.timeout.ms)
            proxy.restore()
            producer.produce(unique, b"after", on_delivery=lambda err, _m: outcomes.append(f"after:{err}"))
            assert producer.flush(30) == 0
            assert outcomes[0] == "before:None"
            assert outcomes[1].startswith("during:") and "timed out" in outcomes[1]
            assert outcomes[2] == "after:None"
            wait_until(lambda: proxy.connections > 0, what="connections through the proxy")
            assert [r.value for r in consume_all(proxy.address, unique, 1, expected=2)] == [b"before", b"after"]
        finally:
            broker.stop()


def test_a_task_started_while_the_destination_is_unreachable_waits_to_know_its_partitions(
    tmp_path: Path, stack: StackEndpoints, db_engine: Engine, unique: str
) -> None:
    # Found by a fault run: a task restarted during a broker outage had no destination metadata, produced through
    # the partitioner, and scattered its partitions over the destination's (one record out of order per 600,000).
    with TcpProxy(("127.0.0.1", free_port())) as proxy:
        broker = tansu_broker("unreachable", proxy.target[1], proxy.port, tmp_path / "broker.log")
        broker.start()
        try:
            idle = f"{unique}-idle"  # the task's first partition, so that it runs before the destination goes away
            create_topics(proxy.address, {f"{unique}.copy": 2, f"{idle}.copy": 1})
            create_topics(stack.source_bootstrap_servers, {unique: 2, idle: 1})
            produce(
                stack.source_bootstrap_servers,
                [{"topic": unique, "partition": i % 2, "key": b"k%d" % i, "value": b"%d" % i} for i in range(60)],
            )
            store = Store(db_engine)
            create_connector(
                store,
                connector_properties(
                    stack,
                    unique,
                    **{
                        "topics.whitelist": f"{unique},{idle}",
                        "destination.topic.name.suffix": ".copy",
                        "destination.consumer.bootstrap.servers": proxy.address,
                    },
                ),
                {0: [(idle, 0)]},
            )
            task = TaskThread.start(store, unique)
            wait_until(lambda: any(e.startswith("replicating") for e in task.events), what="the task running")
            proxy.cut()  # the destination goes away, then the task is given its partitions
            store.write_assignment(unique, {0: [(idle, 0), (unique, 0), (unique, 1)]})
            # Without metadata (or with metadata that cannot name the topic) each partition waits, paused.
            try:
                wait_until(lambda: sum(e.startswith("paused") for e in task.events) >= 2, timeout=60)
            except TimeoutError:
                raise AssertionError(f"both partitions should wait for destination metadata: {task.events}") from None
            proxy.restore()
            copied = consume_all(proxy.address, f"{unique}.copy", 2, expected=60)
            task.finish()
            assert sorted(int(r.value) for r in copied) == list(range(60))
            assert [r for r in copied if int(r.value) % 2 != r.partition] == []  # each kept its partition
        finally:
            broker.stop()


def assert_every_record_checked(report: FaultReport, plan: FaultPlan) -> None:
    """Records flowed into every partition and the independent reader checked every one produced. How many a
    short run on a busy shared machine produces is no behaviour: throughput under faults is measured by `mirus
    faults run` (benchmarks/README.md, "Fault injection")."""
    assert report.verify.complete and report.verify.totals["source_records"] == report.produced, report.to_text()
    written = {p.source_partition: p.source_records for p in report.verify.partitions}
    assert sorted(written) == list(range(plan.partitions)) and all(written.values()), written


def assert_every_fault_and_nothing_lost(report: FaultReport, plan: FaultPlan) -> None:
    """Every kind of fault of the plan happened (each kill as often as planned, and each killed task restarted); the
    independent reader found every record, in order, unchanged, each copy in the partition of its source's number."""
    kinds = Counter(e.kind for e in report.events)
    assert set(kinds) == set(plan.faults) and kinds["kill"] >= plan.faults.count("kill"), report.to_text()
    assert report.task_restarts >= len(report.kills), report.to_text()
    assert_every_record_checked(report, plan)
    totals = report.verify.totals
    assert totals["missing"] == 0 and totals["out_of_order"] == 0 and totals["mismatched"] == 0, report.to_text()
    assert totals["elsewhere"] == 0, report.to_text()
    assert report.drained and report.ok


def test_nothing_is_lost_or_reordered_under_kills_database_restarts_and_network_cuts(tmp_path: Path) -> None:
    # On Apache Kafka (the harness starts its own from the kit). On the embedded broker this schedule stalls: after
    # the third network cut to the destination, the source broker stops answering the tasks' fetches with records
    # (a new consumer still reads them), which is that broker's own fault.
    plan = FaultPlan(
        duration_s=40,
        rate=400,
        partitions=4,
        tasks=2,
        faults=EMBEDDED_FAULTS,
        gap_s=(2.0, 4.0),
        outage_s=(4.0, 6.0),
        seed=12,
        work_dir=tmp_path,
        apache_kafka=True,
    )
    report = FaultRun(plan).run()
    print(report.to_text())

    assert_every_fault_and_nothing_lost(report, plan)
    # At-least-once: each kill re-sends at most what its task had not committed when it died.
    for kill in report.kills:
        assert kill.resent <= kill.uncommitted, kill


def test_batches_lose_nothing_under_every_kind_of_fault(tmp_path: Path) -> None:
    # The batch path (copy.mode=batches) starting after its own copies at the destination: a copy carries no
    # provenance header, so the independent reader matches copies to sources by the segments the tasks stored.
    # A partition's copies past the commit may be of both paths in turn (handed back during a broker restart or
    # a refusal): the start finds the last of them whichever path made it (tests/engine/test_batch_path.py holds
    # that at 0 re-sent). Before 2c3a577, 20 of 21 runs re-sent nothing and one re-sent 1,277 records of a partition
    # whose start did not read the destination (its stored destination offset already at the partition's end): a
    # run acknowledged behind an unanswered one moved the stored destination offset past copies still to be made
    # (tests/engine/test_engine_parts.py). 8 of 8 runs since re-sent nothing; the cause is read in the code, not
    # reproduced, so every kill is held to the at-least-once bound here, and its re-send is printed.
    plan = FaultPlan(
        duration_s=45,  # a broker restart alone takes 13 s here, 26 s on a slow machine (then the round runs on)
        rate=400,
        partitions=4,
        tasks=2,
        faults=("kill", "network", "postgres", "broker", "refuse", "kill"),  # kills twice per round
        gap_s=(1.0, 2.0),
        outage_s=(3.0, 5.0),
        seed=3,
        work_dir=tmp_path,
        apache_kafka=True,
        copy_batches=True,
        start_after_copies=True,
    )
    report = FaultRun(plan).run()
    print(report.to_text())

    assert_every_fault_and_nothing_lost(report, plan)
    for kill in report.kills:
        assert kill.resent <= kill.uncommitted, kill


def test_exactly_once_loses_and_duplicates_nothing_under_every_kind_of_fault(tmp_path: Path) -> None:
    # On Apache Kafka (the harness starts its own from the kit): the embedded broker returns aborted transactions'
    # records to read_committed readers.
    plan = FaultPlan(
        duration_s=30,
        rate=400,
        partitions=4,
        tasks=2,
        faults=("kill", "postgres", "kill", "network", "refuse", "broker"),  # kills twice per round
        gap_s=(1.0, 2.0),
        outage_s=(3.0, 5.0),
        seed=7,
        work_dir=tmp_path,
        apache_kafka=True,
        exactly_once=True,
    )
    report = FaultRun(plan).run()
    print(report.to_text())

    # Counted by an independent read_committed reader from the provenance of each copy, not by the engine.
    assert_every_fault_and_nothing_lost(report, plan)
    assert report.verify.totals["duplicated"] == 0, report.to_text()


def test_a_delaying_proxy_adds_its_delay_each_way_and_carries_every_byte_in_order() -> None:
    # benchmarks/wan.py's wide-area link: a slow link must not reorder, drop or cut bytes, however large the burst.
    with socket.create_server(("127.0.0.1", 0)) as server:
        echoed = threading.Thread(target=_echo_one_connection, args=(server,), daemon=True)
        echoed.start()
        with TcpProxy(("127.0.0.1", server.getsockname()[1]), delay_s=0.025) as proxy:
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as client:
                started = time.monotonic()
                client.sendall(b"ping")
                assert _read_exactly(client, 4) == b"ping"
                assert time.monotonic() - started >= 0.05  # 25 ms there, 25 ms back
                burst = random.Random(7).randbytes(8 * 1024 * 1024)  # more than the socket buffers hold
                sender = threading.Thread(target=client.sendall, args=(burst,), daemon=True)
                sender.start()
                assert _read_exactly(client, len(burst)) == burst
                sender.join(10)
            # The proxy counts a chunk once its send returned, which may be after the client has read it.
            wait_until(
                lambda: proxy.bytes_to_target == proxy.bytes_from_target == 4 + len(burst),
                timeout=10,
                what=f"the proxy's counts at {4 + len(burst)} bytes each way",
            )


def _echo_one_connection(server: socket.socket) -> None:
    conn, _ = server.accept()
    with conn, contextlib.suppress(ConnectionResetError):  # the proxy closes with a reset
        while data := conn.recv(65536):
            conn.sendall(data)


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    chunks, held = [], 0
    while held < size:
        chunk = sock.recv(min(1 << 20, size - held))
        assert chunk, f"the connection closed after {held} of {size} bytes"
        chunks.append(chunk)
        held += len(chunk)
    return b"".join(chunks)
