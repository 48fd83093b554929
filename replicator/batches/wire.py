"""One Kafka cluster as the batch copier speaks to it, through kafka-python's protocol layer: its connection manager
(connections, ApiVersions, SASL, TLS, metadata) and its request classes (Fetch, Produce, InitProducerId). Nothing of
the wire protocol is written here; records travel as the bytes the broker sent.

`KafkaWire` runs kafka-python's event loop on its own IO thread (as kafka-python's admin client does); each public
method schedules one coroutine on it and blocks until it is done. Broker errors and client failures (a connection
lost, a request timed out) come back as data, a `Problem` per partition; only `init_producer_id` raises.
"""

from __future__ import annotations

import collections
import selectors
import ssl
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import kafka.errors as kafka_errors
from kafka.net.manager import KafkaConnectionManager
from kafka.net.selector import NetworkSelector
from kafka.net.transport import KafkaSSLTransport, KafkaTCPTransport
from kafka.protocol.consumer import FetchRequest
from kafka.protocol.frame import KafkaBytes
from kafka.protocol.producer import InitProducerIdRequest, ProduceRequest

from replicator.batches.record_batch import AbortedTransaction

READ_COMMITTED = 1
ACKS_ALL = -1
# Request versions: v4 is the first Fetch with read_committed, v3 the first Produce of v2 batches. The caps are those
# kafka-python's own consumer and producer use (later versions name topics by id).
FETCH_VERSIONS = (4, 12)
PRODUCE_VERSIONS = (3, 9)
INIT_PRODUCER_ID_VERSIONS = (0, 4)
IN_FLIGHT = 5  # produce requests per connection: what a broker keeps of an idempotent producer's batches for dedup
# A response frame may exceed the fetch's max_bytes by a batch: Kafka returns the first batch of a partition whole
# even when it is larger than the limit, so that a fetch always makes progress.
LARGEST_BATCH = 64 * 1024 * 1024
UNKNOWN = -1  # the code of a failure on the client's side

# librdkafka's connection settings and kafka-python's names for them. Other `security.`, `sasl.` and `ssl.` settings
# are refused rather than dropped; settings of neither kind (a producer's linger.ms) do not concern a connection.
SETTINGS = {
    "bootstrap.servers": "bootstrap_servers",
    "client.id": "client_id",
    "security.protocol": "security_protocol",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.mechanisms": "sasl_mechanism",
    "sasl.username": "sasl_plain_username",
    "sasl.password": "sasl_plain_password",
    "sasl.kerberos.service.name": "sasl_kerberos_service_name",
    "ssl.ca.location": "ssl_cafile",
    "ssl.certificate.location": "ssl_certfile",
    "ssl.key.location": "ssl_keyfile",
    "ssl.key.password": "ssl_password",
    "ssl.crl.location": "ssl_crlfile",
}
SECURITY_PREFIXES = ("security.", "sasl.", "ssl.")
HOSTNAME_CHECK = "ssl.endpoint.identification.algorithm"


# kafka-python 3.0's transports read their socket 4 KB a call into new bytes, joined once the socket would block: a
# 16 MB fetch response took 4,000 calls, and the parser then copies each read again (a slice) before it copies it
# into the response's frame. Each transport reads into one buffer of its own instead (READ_BUFFER, grown when a
# turn fills it); a read of PASSED_AS_VIEW or more is passed on as a view of it, which the parser copies from at once
# (the next read comes after). Smaller reads (a SASL token, metadata) stay bytes of their own. Everything else about
# reading stays the library's.
READ_BUFFER = 1_048_576
PASSED_AS_VIEW = 64 * 1024


def _read_into_one_buffer(transport: type[KafkaTCPTransport], would_block: tuple[type[BaseException], ...]) -> None:
    if not callable(getattr(transport, "_sock_recv", None)):
        raise ImportError(f"kafka-python's {transport.__name__} no longer reads through _sock_recv")

    def _sock_recv(self: Any) -> tuple[bytes | memoryview, Exception | None]:
        """The library's own loop (read until the socket would block; empty data or an error fails the
        connection), into the transport's buffer."""
        buffer = self.__dict__.get("_read_buffer")
        if buffer is None:
            buffer = self._read_buffer = memoryview(bytearray(READ_BUFFER))
        size = 0
        while True:
            if size == len(buffer):  # read on until the socket would block (TLS may hold decrypted bytes back)
                grown = memoryview(bytearray(2 * size))
                grown[:size] = buffer
                buffer = self._read_buffer = grown
            try:
                received = self._sock.recv_into(buffer[size:])
            except would_block:
                break
            except Exception as exc:
                return b"", kafka_errors.KafkaConnectionError(exc)
            if not received:
                return b"", kafka_errors.KafkaConnectionError("socket disconnected")
            size += received
        return (buffer[:size] if size >= PASSED_AS_VIEW else bytes(buffer[:size])), None

    transport._sock_recv = _sock_recv


_read_into_one_buffer(KafkaTCPTransport, (BlockingIOError, InterruptedError))
_read_into_one_buffer(
    KafkaSSLTransport, (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)
)


# A response's rest at least this large is read as a view of its frame (see `_read_with_one_copy`).
VIEW_AT_LEAST = 1_048_576


def _read_with_one_copy(frame: type[KafkaBytes]) -> None:
    """kafka-python 3.0 reads a response frame (a bytearray) as `bytes(frame[start:end])`, two copies, the first a
    bytearray as large as the part read; its decoder then copies each field out. A fetch response's records are
    most of its 16 MB, and these copies were most of the fetch's CPU. Read through a memoryview instead: one copy,
    the same bytes; and none for the rest of a large frame, which the decoder only reads fields from (each field
    still a copy, so nothing refers to the frame once decoded). Small reads stay bytes: a SASL token is read so."""
    if not callable(getattr(frame, "read", None)) or not hasattr(frame(0), "_idx"):
        raise ImportError(f"kafka-python's {frame.__name__} no longer reads from _idx")

    def read(self: Any, nbytes: int | None = None) -> bytes | memoryview:
        start = self._idx
        end = self._idx = len(self) if nbytes is None else min(start + nbytes, len(self))
        if nbytes is None and end - start >= VIEW_AT_LEAST:
            return memoryview(self)[start:end]
        return bytes(memoryview(self)[start:end])

    frame.read = read


_read_with_one_copy(KafkaBytes)


class _Selector(selectors.DefaultSelector):
    """The standard selector, but a socket it does not hold is a KeyError without the socket's repr. kafka-python
    asks for a socket's key each time it waits on it, and registers it when that fails: the error's message, with
    the repr's two system calls (getsockname, getpeername), was 4 % of the batch path's CPU."""

    def get_key(self, fileobj: Any) -> selectors.SelectorKey:
        if self.get_map() is None:
            raise RuntimeError("Selector is closed")
        try:
            return self._fd_to_key[self._fileobj_lookup(fileobj)]  # type: ignore[attr-defined,no-any-return]
        except KeyError:
            raise KeyError(fileobj) from None


with _Selector() as _probe:
    if not hasattr(_probe, "_fd_to_key"):
        raise ImportError("the standard selectors no longer keep _fd_to_key")


class Partition(NamedTuple):
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class Problem:
    """A partition's error: Kafka's code and name, or (code -1) the client's failure; retriable as Kafka says."""

    code: int
    name: str
    retriable: bool

    @classmethod
    def of_code(cls, code: int) -> Problem | None:
        if code == 0:
            return None
        error = kafka_errors.for_code(code)
        return cls(code, str(getattr(error, "message", error.__name__)), bool(error.retriable))

    @classmethod
    def of_exception(cls, exc: BaseException) -> Problem:
        code = exc.errno if isinstance(exc, kafka_errors.BrokerResponseError) else UNKNOWN
        return cls(code, str(exc) or type(exc).__name__, bool(getattr(exc, "retriable", False)))


class Fetched(NamedTuple):
    """One partition of a read_committed fetch: the records blob as the broker sent it, or the problem."""

    problem: Problem | None
    records: bytes = b""
    aborted: tuple[AbortedTransaction, ...] = ()
    high_watermark: int = -1
    last_stable_offset: int = -1


class Produced(NamedTuple):
    """One produced batch: where the broker wrote it, or the problem."""

    problem: Problem | None
    base_offset: int = -1


@dataclass(frozen=True, slots=True)
class ProducerIdentity:
    producer_id: int
    epoch: int


class BrokerError(RuntimeError):
    """A request the cluster refused as a whole (InitProducerId)."""

    def __init__(self, what: str, problem: Problem) -> None:
        super().__init__(f"{what}: {problem.name} (error {problem.code})")
        self.problem = problem


class UnsupportedSettingError(ValueError):
    """A librdkafka security setting the protocol library has no counterpart for."""


def connection_settings(librdkafka: Mapping[str, str]) -> dict[str, Any]:
    """kafka-python's connection settings for a librdkafka-style dict (a connector's client settings)."""
    settings: dict[str, Any] = {}
    unsupported = []
    for key, value in librdkafka.items():
        if key in SETTINGS:
            settings[SETTINGS[key]] = value
        elif key == HOSTNAME_CHECK:
            settings["ssl_check_hostname"] = value.lower() == "https"
        elif key.startswith(SECURITY_PREFIXES):
            unsupported.append(key)
    if unsupported:
        raise UnsupportedSettingError(f"no kafka-python counterpart for {', '.join(sorted(unsupported))}")
    if "security_protocol" in settings:
        settings["security_protocol"] = settings["security_protocol"].upper()
    return settings


class KafkaWire:
    """Raw fetches, InitProducerId and raw produces against one cluster."""

    def __init__(self, settings: Mapping[str, str], *, request_timeout_ms: int = 40_000, fetch_max_bytes: int) -> None:
        self._net = NetworkSelector(selector=_Selector)
        self._manager = KafkaConnectionManager(
            self._net,
            **connection_settings(settings),
            receive_message_max_bytes=fetch_max_bytes + LARGEST_BATCH,
            request_timeout_ms=request_timeout_ms,
            # Room beside a pipeline of produce requests for the library's own metadata requests.
            max_in_flight_requests_per_connection=IN_FLIGHT + 2,
        )
        # The manager's metadata asks for its topics only; a destination topic is never created by asking.
        self._manager.cluster.config["allow_auto_create_topics"] = False
        self.fetch_max_bytes = fetch_max_bytes
        # The last fetch's request entries, by partition, used again where a partition's position and size did not
        # change: the library builds an entry in 12 µs, and over thousands of lanes most stand still. (Never changed
        # once made: a request being sent may hold them.)
        self._entries: dict[Partition, tuple[tuple[int, int], Any]] = {}
        self._topics: set[str] = set()
        self._stale = False
        # The last grouping of partitions by leader, used again for the same partitions until the metadata changes:
        # a fetch names every lane, and over 5,000 lanes the grouping was 5 % of an idle step's CPU.
        self._grouping: tuple[tuple[Partition, ...], dict[int, list[Partition]]] | None = None
        self._manager.cluster.add_listener(self._metadata_changed)
        self._net.start()
        try:
            self._manager.bootstrap(request_timeout_ms)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self._manager.close()
        self._net.close()

    def __enter__(self) -> KafkaWire:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def fetch(
        self,
        positions: Mapping[Partition, int],
        *,
        partition_max_bytes: Mapping[Partition, int] | int = 1_048_576,
        max_wait_ms: int = 500,
        min_bytes: int = 1,
    ) -> dict[Partition, Fetched]:
        """The records of each partition from its position (read_committed), one request per leader, sent together;
        at most `fetch_max_bytes` in all (more only for one batch larger than that). A leader answers once it has
        `min_bytes` for the request, or after `max_wait_ms`."""
        limits = partition_max_bytes
        sizes = limits if isinstance(limits, Mapping) else dict.fromkeys(positions, limits)
        return dict(self._run(self._fetch, dict(positions), sizes, max_wait_ms, min_bytes))

    def init_producer_id(self) -> ProducerIdentity:
        """A new idempotent producer id (no transactional id) and its epoch; BrokerError if refused."""
        result: ProducerIdentity = self._run(self._init_producer_id)
        return result

    def produce(
        self, batches: Mapping[Partition, Sequence[bytes | bytearray]], *, timeout_ms: int = 30_000
    ) -> dict[Partition, list[Produced]]:
        """Produce each partition's batches in order with acks=all: a request holds one batch per partition (of
        every partition its leader leads), and up to IN_FLIGHT requests are in flight per leader. A partition's
        batches after one that failed are not sent. Each partition gets a `Produced` per batch sent."""
        return dict(self._run(self._produce, batches, timeout_ms))

    def _run(self, coroutine: Any, *args: Any) -> Any:
        return self._manager.run(coroutine, *args)

    def _metadata_changed(self, _cluster: object) -> None:
        self._grouping = None

    async def _leaders(
        self, partitions: Iterable[Partition]
    ) -> tuple[dict[int, list[Partition]], dict[Partition, Problem]]:
        """The partitions grouped by leader (not to be changed: it may be the last call's), and those without one
        (metadata read again once before saying so)."""
        wanted = tuple(partitions)
        if not self._stale and self._grouping is not None and self._grouping[0] == wanted:
            return self._grouping[1], {}
        cluster = self._manager.cluster
        if self._stale or not {p.topic for p in wanted} <= self._topics:
            self._topics |= {p.topic for p in wanted}
            cluster.set_topics(sorted(self._topics))
            await self._refresh()
        by_leader: dict[int, list[Partition]] = collections.defaultdict(list)
        missing: dict[Partition, Problem] = {}
        for attempt in (1, 2):
            missing.clear()
            by_leader.clear()
            for partition in wanted:
                leader = cluster.leader_for_partition(partition)
                if leader is None:
                    missing[partition] = Problem(3, "UNKNOWN_TOPIC_OR_PARTITION", True)
                elif leader == -1:
                    missing[partition] = Problem(5, "LEADER_NOT_AVAILABLE", True)
                else:
                    by_leader[leader].append(partition)
            if not missing or attempt == 2:
                break
            await self._refresh()
        grouped = dict(by_leader)
        if not missing and not self._stale:
            self._grouping = (wanted, grouped)
        return grouped, missing

    async def _refresh(self) -> None:
        try:
            await self._manager.cluster.refresh_metadata()
            self._stale = False
        except kafka_errors.KafkaError:
            self._stale = True  # the partitions without a leader say so; the next call reads metadata again

    def _noted(self, problem: Problem | None) -> Problem | None:
        """`problem`, having marked the metadata stale when it says so (a leader moved, a connection failed)."""
        if problem is not None and (problem.code == UNKNOWN or kafka_errors.for_code(problem.code).invalid_metadata):
            self._stale = True
        return problem

    async def _fetch(
        self, positions: dict[Partition, int], sizes: Mapping[Partition, int], max_wait_ms: int, min_bytes: int
    ) -> dict[Partition, Fetched]:
        by_leader, missing = await self._leaders(positions)
        results = {partition: Fetched(problem) for partition, problem in missing.items()}
        pending = {}
        entries, self._entries = self._entries, {}
        for leader, partitions in by_leader.items():
            topics: dict[str, list[Any]] = collections.defaultdict(list)
            for p in partitions:
                asked = (positions[p], sizes[p])
                kept = entries.get(p)
                entry = kept[1] if kept is not None and kept[0] == asked else None
                if entry is None:
                    entry = FetchRequest.FetchTopic.FetchPartition(
                        partition=p.partition,
                        current_leader_epoch=-1,
                        fetch_offset=asked[0],
                        last_fetched_epoch=-1,
                        log_start_offset=-1,
                        partition_max_bytes=asked[1],
                    )
                self._entries[p] = (asked, entry)
                topics[p.topic].append(entry)
            request = FetchRequest(
                replica_id=-1,
                max_wait_ms=max_wait_ms,
                min_bytes=min_bytes,
                max_bytes=self.fetch_max_bytes,
                isolation_level=READ_COMMITTED,
                session_id=0,
                session_epoch=-1,  # no fetch session: every request names its partitions
                topics=[FetchRequest.FetchTopic(topic=t, partitions=ps) for t, ps in topics.items()],
                forgotten_topics_data=[],
                rack_id="",
                min_version=FETCH_VERSIONS[0],
                max_version=FETCH_VERSIONS[1],
            )
            pending[leader] = self._manager.send(request, node_id=leader)
        for leader, future in pending.items():
            try:
                response = await future
            except Exception as exc:
                failed = self._noted(Problem.of_exception(exc))
                results.update({p: Fetched(failed) for p in by_leader[leader]})
                continue
            # tuple.__new__, not the named tuples' own (a Python call): most of thousands of answers are empty.
            make = tuple.__new__
            for topic in response.responses:
                name = topic.topic
                for data in topic.partitions:
                    problem = self._noted(Problem.of_code(data.error_code)) if data.error_code else None
                    found = data.aborted_transactions
                    aborted = tuple(AbortedTransaction(a.producer_id, a.first_offset) for a in found) if found else ()
                    records = bytes(data.records or b"")
                    answer = (problem, records, aborted, data.high_watermark, data.last_stable_offset)
                    results[make(Partition, (name, data.partition_index))] = make(Fetched, answer)
        return results

    async def _init_producer_id(self) -> ProducerIdentity:
        request = InitProducerIdRequest(
            transactional_id=None,
            transaction_timeout_ms=60_000,
            producer_id=-1,
            producer_epoch=-1,
            min_version=INIT_PRODUCER_ID_VERSIONS[0],
            max_version=INIT_PRODUCER_ID_VERSIONS[1],
        )
        try:
            response = await self._manager.send(request)
        except Exception as exc:
            raise BrokerError("InitProducerId", Problem.of_exception(exc)) from exc
        if problem := Problem.of_code(response.error_code):
            raise BrokerError("InitProducerId", problem)
        return ProducerIdentity(response.producer_id, response.producer_epoch)

    async def _produce(
        self, batches: Mapping[Partition, Sequence[bytes | bytearray]], timeout_ms: int
    ) -> dict[Partition, list[Produced]]:
        by_leader, missing = await self._leaders(p for p, bs in batches.items() if bs)
        results: dict[Partition, list[Produced]] = {p: [Produced(problem)] for p, problem in missing.items()}
        pipelines = [
            self._manager.call_soon(self._pipeline, leader, {p: batches[p] for p in partitions}, timeout_ms, results)
            for leader, partitions in by_leader.items()
        ]
        for pipeline in pipelines:
            await pipeline
        return results

    async def _pipeline(
        self,
        leader: int,
        batches: Mapping[Partition, Sequence[bytes | bytearray]],
        timeout_ms: int,
        results: dict[Partition, list[Produced]],
    ) -> None:
        """One leader's requests: request i holds batch i of each partition that has not failed; IN_FLIGHT at most
        in flight, acknowledged in order."""
        in_flight: collections.deque[tuple[list[Partition], Any]] = collections.deque()
        failed: set[Partition] = set()
        for partition in batches:
            results[partition] = []

        async def settle_oldest() -> None:
            partitions, future = in_flight.popleft()
            try:
                response = await future
            except Exception as exc:
                problem = self._noted(Problem.of_exception(exc))
                for p in partitions:
                    results[p].append(Produced(problem))
                    failed.add(p)
                return
            for topic in response.responses:
                for answer in topic.partition_responses:
                    p = Partition(topic.name, answer.index)
                    problem = self._noted(Problem.of_code(answer.error_code))
                    results[p].append(Produced(problem, answer.base_offset))
                    if problem is not None:
                        failed.add(p)

        for i in range(max(len(b) for b in batches.values())):
            round_ = [p for p, b in batches.items() if i < len(b) and p not in failed]
            if not round_:
                break
            topics: dict[str, list[Any]] = collections.defaultdict(list)
            for p in round_:
                topics[p.topic].append(
                    ProduceRequest.TopicProduceData.PartitionProduceData(index=p.partition, records=batches[p][i])
                )
            request = ProduceRequest(
                transactional_id=None,
                acks=ACKS_ALL,
                timeout_ms=timeout_ms,
                topic_data=[ProduceRequest.TopicProduceData(name=t, partition_data=ps) for t, ps in topics.items()],
                min_version=PRODUCE_VERSIONS[0],
                max_version=PRODUCE_VERSIONS[1],
            )
            in_flight.append((round_, self._manager.send(request, node_id=leader)))
            if len(in_flight) >= IN_FLIGHT:
                await settle_oldest()
        while in_flight:
            await settle_oldest()
