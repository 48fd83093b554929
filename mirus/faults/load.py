"""The steady load of a fault run (`mirus.faults.harness`): records written into the source topic at a fixed rate,
each partition's acknowledged end known."""

from __future__ import annotations

import threading
import time

from confluent_kafka import Message, Producer

THIRTY_DAYS_MS = 30 * 24 * 3600 * 1000


class Load:
    """Writes `rate` records/s round-robin into the source topic and knows each partition's acknowledged end.

    Records carry what replication must keep: keys (some null), values (some null), duplicate headers and
    CreateTime timestamps thirty days old.
    """

    def __init__(self, bootstrap: str, topic: str, partitions: int, rate: int) -> None:
        self.topic = topic
        self.partitions = partitions
        self.rate = rate
        self.ends = dict.fromkeys(range(partitions), 0)  # next offset per partition, from acknowledgements
        self.errors: list[str] = []
        self._producer = Producer(
            {"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5}
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fault-load", daemon=True)
        self.started = self.stopped = 0.0
        self.sent = 0

    def start(self) -> None:
        self.started = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        if self._producer.flush(60) or self.errors:
            raise RuntimeError(f"the load could not write every record to the source: {self.errors[:3]}")
        self.stopped = time.monotonic()

    @property
    def produced(self) -> int:
        return sum(self.ends.values())

    def _delivered(self, err: object, msg: Message) -> None:
        if err is not None:
            self.errors.append(str(err))
        else:
            p, offset = msg.partition(), msg.offset()
            assert p is not None and offset is not None  # set on every delivered record
            self.ends[p] = max(self.ends[p], offset + 1)

    def _run(self) -> None:
        tick = 0.01
        per_tick = self.rate * tick
        due = 0.0
        next_tick = time.monotonic()
        while not self._stop.is_set():
            due += per_tick
            while due >= 1:
                due -= 1
                i = self.sent
                self._produce(
                    i % self.partitions,
                    None if i % 7 == 0 else b"key-%d" % i,
                    None if i % 11 == 0 else b"value-%d-" % i + b"x" * 80,
                    [("trace", b"%d" % i), ("trace", b"again"), ("empty", None)],
                    int(time.time() * 1000) - THIRTY_DAYS_MS,
                )
                self.sent += 1
            self._producer.poll(0)
            next_tick += tick
            self._stop.wait(max(0.0, next_tick - time.monotonic()))

    def _produce(
        self,
        partition: int,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, str | bytes | None]],
        timestamp: int,
    ) -> None:
        while True:
            try:
                self._producer.produce(
                    self.topic, value, key, partition, on_delivery=self._delivered, timestamp=timestamp, headers=headers
                )
                return
            except BufferError:
                self._producer.poll(0.05)
