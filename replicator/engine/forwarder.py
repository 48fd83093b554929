"""Fetch, map, produce: records from the task's source reader to its destination producers, in order.

  fetch       `poll_once`: `SourceReader.consume()` on the assigned partitions, forwarding at once; partitions that
              flow are fetched eagerly, quiet ones cheaply (`replicator.engine.source_reader`)
  map         `forward`: destination topic and partition, user headers plus provenance headers, cycle guard
  produce     `forward`: `produce()` of the producer writing the record's destination topic (one per group of
              topics, `replicator.engine.deliveries`) with key, value, headers and source timestamp (`_produce_again`
              when the local queue is full or the record is refused before sending; a record too large for its
              destination topic is refused before that, `replicator.engine.record_limits`)

What is produced is acknowledged by the deliveries (`replicator.engine.deliveries`) and committed by the task's
committer (`replicator.engine.committer`); a record refused before sending is handed to the deliveries as a
`Refusal`, which the committer decides with the others (`replicator.engine.failures`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any, cast

from confluent_kafka import KafkaError, KafkaException, Message

from replicator.engine.clients import Clients
from replicator.engine.committer import Committer
from replicator.engine.deliveries import ACK_POLL_S, MAX_BLOCK_S, Refusal
from replicator.engine.partitions import InFlight, PartitionBook, PartitionState
from replicator.engine.record_limits import oversized, producer_refusal_reason
from replicator.engine.throttle import ThrottleShare
from replicator.partition_reader import Record
from replicator.topics import provenance

BATCH = 10000  # records taken from the consumer's queue at most per loop; never waited for
REFUSAL_DRAIN_S = 5.0  # how long a refusal before sending waits for the records produced just before it


class Forwarder:
    """The records on their way from the source reader to the destination producers."""

    def __init__(
        self,
        clients: Clients,
        book: PartitionBook,
        committer: Committer,
        *,
        source_error: Callable[[Message], None],
        head_changed: threading.Event,
        throttle: ThrottleShare,
    ) -> None:
        self.config = clients.config
        self.reader = clients.reader
        self.book = book
        self.deliveries = deliveries = clients.deliveries
        self.committer = committer  # asked whether to read (`accepting`) and how long to wait for acknowledgements
        self.source_error = source_error  # an error event among the records: the partition pauses' to handle
        self.head_changed = head_changed  # a long wait for records ends when the connector's row changed
        self.destination_cluster = clients.destination_cluster
        self.source_cluster = clients.source_cluster
        self.origin_header = (provenance.ORIGIN, clients.source_cluster.encode())
        queue_limit = int(deliveries.settings["queue.buffering.max.messages"])
        self.intake_limit = max(queue_limit - BATCH, queue_limit // 2)  # records waiting above which none are read
        self.throttle = throttle  # this task's share of the connector's throttle, asked before each batch
        self.lanes = clients.lanes  # copy.mode=batches: the partitions copied as record batches (`BatchLanes`)

    # -- fetch, map, produce ----------------------------------------------------------------------------

    def poll_once(self) -> None:
        deliveries, reader = self.deliveries, self.reader
        timeout = min(self.config.poll_timeout_ms / 1000, MAX_BLOCK_S)
        if self.lanes is not None and self.lanes.step(time.monotonic()):
            # The lanes' fetch waited for records: the record path's wait is short then, and none at all when it
            # holds no partition (a wait there would hold back the lanes' next produce).
            if not reader.holds_partitions():
                deliveries.poll_acks(0)
                return
            timeout = ACK_POLL_S
        if not self.book.states:
            time.sleep(min(timeout, 0.2))  # nothing assigned yet; housekeeping will pick work up
            return
        # Forward whatever has arrived, at once: `consume(n, t)` would hold records back until n arrived or t
        # passed. Only an empty queue is waited on, and only until its first record (or an acknowledgement) is due.
        msgs: list[Record]
        if not self.committer.accepting():  # exactly-once: until the transaction's records are acknowledged
            msgs = []
        elif len(deliveries) > self.intake_limit:
            # The destination is behind (e.g. thousands of partitions catching up, each sent as a request of its
            # own): read no more until a batch fits, so the backlog waits in Kafka, not in this process's memory.
            msgs = []
            deliveries.poll_acks(ACK_POLL_S)
        else:
            throttle = self.throttle.current
            allowed = BATCH if throttle is None else throttle.allowance(BATCH)
            if throttle is not None and not allowed:
                # Over the connector's throttle: read nothing (the backlog waits in Kafka) until the budget allows.
                msgs = []
                deliveries.poll_acks(min(throttle.wait_s(), timeout))
            else:
                msgs = reader.consume(allowed, 0)
                if not msgs:
                    msgs = reader.consume(1, ACK_POLL_S if len(deliveries) else timeout, until=self.head_changed.is_set)
                if throttle is not None:
                    throttle.take(msgs)
        if msgs:
            self.forward(msgs)
        deliveries.poll_acks(self.committer.ack_wait_s(), now_ms=time.time_ns() // 1_000_000)

    def forward(self, msgs: list[Record]) -> None:
        """Map and produce a batch of records, in order. This loop runs once per record: it stays flat, and the
        produce call is inline (a method call per record costs as much as the bookkeeping).

        Each record is produced once the next one is seen, which tells whether it ends its partition's run in this
        batch: only a run's last record carries a delivery callback (`InFlight`). The batch ends with `None`."""
        self.book.touched += 1
        acknowledged = self.deliveries.acknowledged
        partitions, with_provenance = self.book.states, self.config.provenance_headers_enabled
        destination, source_cluster, source = self.destination_cluster, self.source_cluster, provenance.SOURCE
        # `mirus.origin` on a first hop too, unless the connector asks for the compact layout (`provenance.py`).
        first_hop_origin = None if self.config.provenance_headers_compact else self.origin_header
        # The record seen and not yet produced: it, its partition, offset, outgoing headers and timestamp.
        unsent: Record | None = None
        # Read only while `unsent` is set: an Optional would cost a check per record.
        ustate: PartitionState = None  # type: ignore[assignment]
        uoffset = uts = 0
        uheaders: Any = None
        state: PartitionState | None = None
        for msg in (*msgs, None):
            cycle = False  # the record was first produced on the destination cluster: never written back
            if msg is not None:
                if msg.error() is not None:  # an error event, not a record (`Record`)
                    self.source_error(cast(Message, msg))
                    continue
                state = partitions.get((msg.topic(), msg.partition()))
                if state is None or state.paused_reason is not None:
                    continue  # released or paused while the batch was in flight; re-read from its offset later
                offset = msg.offset()
                headers = msg.headers()
                if headers is not None:
                    origin = provenance.origin_cluster(headers)
                    if origin == destination:
                        cycle = True
                    elif with_provenance:
                        headers = provenance.user_headers(headers)
                        if origin is not None and origin != source_cluster:  # a copy of a copy: its first cluster
                            headers.append((provenance.ORIGIN, origin.encode()))
                        elif first_hop_origin is not None:
                            headers.append(first_hop_origin)
                        headers.append((source, state.source_prefix + b"%d" % offset))
                elif with_provenance:
                    sourced = (source, state.source_prefix + b"%d" % offset)
                    headers = [sourced] if first_hop_origin is None else [first_hop_origin, sourced]
            else:
                state = None
            if unsent is not None:  # produce it: it ends its run unless the next record continues the run
                run = ustate.open_run or ustate.open(uoffset)
                last = cycle or ustate is not state or not ustate.ordered
                key, value = unsent.key(), unsent.value()
                size = (len(value) if value else 0) + (len(key) if key else 0)
                callback = partial(acknowledged, ustate, run) if last else None
                # Only a record near its destination topic's limit is measured (headers and framing included).
                if size > ustate.size_check and (why := oversized(ustate, uoffset, key, value, uheaders)):
                    ustate.too_large()
                    produced = self._refuse_unsent(ustate, run, uoffset, KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), why)
                else:
                    try:
                        # Positional: confluent-kafka parses keyword arguments at a cost per record. The
                        # order is its keyword list's: topic, value, key, partition, callback, on_delivery,
                        # timestamp, headers.
                        ustate.produce(
                            ustate.destination_topic,
                            value,
                            key,
                            ustate.destination_partition,
                            callback,
                            None,
                            uts,
                            uheaders,
                        )
                        produced = True
                    except (BufferError, KafkaException) as exc:
                        produced = self._produce_again(exc, ustate, run, uoffset, value, key, callback, uts, uheaders)
                if produced:
                    run.add(uoffset, size, uts)
                    if last:
                        ustate.sent(run)
                unsent = None
            if msg is None or state is None or state.paused_reason is not None:
                continue  # the end, or the record before it was refused: it is re-read from its offset later
            if cycle:
                state.skipped(offset)
                continue
            ts_type, ts = msg.timestamp()
            unsent, ustate, uoffset, uheaders, uts = msg, state, offset, headers, ts if ts_type else 0

    def _produce_again(
        self,
        exc: Exception,
        state: PartitionState,
        run: InFlight,
        offset: int,
        value: bytes | None,
        key: bytes | None,
        callback: Callable[..., None] | None,
        ts: int,
        headers: Any,
    ) -> bool:
        """`produce()` raised: poll for acknowledgements while the local queue is full, then try again; a record
        refused before sending pauses its partition and cuts its run short. Whether the record was produced."""
        while isinstance(exc, BufferError):
            self.deliveries.poll_acks(0.05)
            try:
                state.produce(
                    state.destination_topic, value, key, state.destination_partition, callback, None, ts, headers
                )
                return True
            except (BufferError, KafkaException) as again:
                exc = again
        assert isinstance(exc, KafkaException)  # refused before sending: too large, or the producer stopped
        err: KafkaError = exc.args[0]
        if err.code() == KafkaError.MSG_SIZE_TOO_LARGE:
            settings = self.deliveries.settings
            why = producer_refusal_reason(state, offset, (key, value, headers), settings, self.config, err)
            return self._refuse_unsent(state, run, offset, err, why)
        state.cut(run)
        self.deliveries.refuse(Refusal(state, offset, err))
        if run.count:  # the run's records so far carry no callback: find out whether they arrived
            self.deliveries.drain(REFUSAL_DRAIN_S)
        return False

    def _refuse_unsent(self, state: PartitionState, run: InFlight, offset: int, err: KafkaError, why: str) -> bool:
        """A record too large to be produced: its partition waits with `why` (and its limit is read again before the
        retry); the run's records before it are acknowledged once the producer delivered them. Never produced, so
        no transaction holds it: exactly-once mode goes on without an abort. Returns False (not produced)."""
        state.cut(run)
        self.deliveries.refuse(Refusal(state, offset, err, why, sent=False))
        if run.count:  # the run's records so far carry no callback: find out whether they arrived
            self.deliveries.drain(REFUSAL_DRAIN_S)
        return False
