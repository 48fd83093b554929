"""Where each partition's records go at the destination: the partition of the same number of its destination topic
(with `enable.partition.matching=false`, the producer's partitioner), routed through that topic's producer
(`Deliveries.route`); a partition whose destination topic or partition is missing pauses until metadata names it.
Checked when partitions start and every `DESTINATION_CHECK_INTERVAL_S` per `DESTINATION_CHECK_PARTITIONS`."""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor

from confluent_kafka.admin import AdminClient

from replicator.assignment import SourcePartition
from replicator.clusters import ClusterAdmin, TopicPartitions, topic_partitions
from replicator.engine.clients import Clients
from replicator.engine.partitions import UNASSIGNED_PARTITION, PartitionBook, PartitionState
from replicator.engine.pauses import PartitionPauses
from replicator.engine.scheduler import CHECKING_DESTINATIONS, Scheduler

log = logging.getLogger(__name__)

DESTINATION_CHECK_INTERVAL_S = 5.0  # route or pause partitions by destination metadata ...
# ... per this many destination partitions: librdkafka's answer is turned into Python objects partition by partition,
# so a task of many partitions checks less often rather than spend a share of a core on it.
DESTINATION_CHECK_PARTITIONS = 1_000


class Destinations:
    """The destination's metadata as the task reads it, and each partition routed (or paused) by it."""

    def __init__(
        self,
        pauses: PartitionPauses,
        book: PartitionBook,
        scheduler: Scheduler,
        background: ThreadPoolExecutor,
        name: str,
    ) -> None:
        self.pauses = pauses
        self.book = book
        self.scheduler = scheduler
        self.background = background  # the task's thread beside the loop: metadata is read there
        self.name = name  # the task's, in logs
        self.clients: Clients  # the current ones (`use`)
        self.metadata_in_flight: Future[dict[str, TopicPartitions]] | None = None

    def use(self, clients: Clients) -> None:
        """The clients `ReplicationTask.rebuild` made: partitions are routed through their producers from now on."""
        self.clients = clients

    def tick(self, now: float) -> None:
        """The loop's periodic check: the last reading applied, the next one sent in the background when due."""
        if self.metadata_in_flight is not None and self.metadata_in_flight.done():
            layouts_done, self.metadata_in_flight = self.metadata_in_flight, None
            if layouts_done.exception() is None:
                self.map(list(self.book.states.values()), layouts_done.result())
            else:
                log.warning("destination metadata unavailable for %s: %s", self.name, layouts_done.exception())
        states = self.book.states
        if (
            self.metadata_in_flight is None
            and states
            and self.scheduler.due(
                CHECKING_DESTINATIONS,
                DESTINATION_CHECK_INTERVAL_S * max(1.0, len(states) / DESTINATION_CHECK_PARTITIONS),
                now,
            )
        ):
            topics = {state.destination_topic for state in states.values()}
            self.metadata_in_flight = self.background.submit(self.layouts, topics)

    def layouts(self, topics: set[str]) -> dict[str, TopicPartitions]:
        return topic_partitions(self.admin(), topics)

    def admin(self) -> AdminClient:
        """An admin client for one request: a long-lived one's background thread wakes 100 times a second, and the
        task asks every few seconds."""
        return ClusterAdmin(self.clients.config.admin_settings("destination"))

    def check(self, partitions: list[SourcePartition] | None = None) -> None:
        """Map each partition to its destination partition; pause those whose destination is missing."""
        book = self.book
        states = [book.states[tp] for tp in partitions] if partitions else list(book.states.values())
        if not states:
            return
        try:
            layouts = self.layouts({state.destination_topic for state in states})
        except Exception as exc:
            log.warning("destination metadata unavailable for %s: %s", self.name, exc)
            for state in states:
                if not state.routed and state.paused_reason is None:
                    # Its destination partition is unknown: producing now would let the partitioner scatter the
                    # partition's records over the destination's partitions, out of order. Wait and retry.
                    self.pauses.pause(state, f"destination metadata unavailable: {exc}")
            return
        self.map(states, layouts)

    def map(self, states: list[PartitionState], layouts: dict[str, TopicPartitions]) -> None:
        config, deliveries = self.clients.config, self.clients.deliveries
        for state in states:
            topic = layouts.get(state.destination_topic)
            if topic is None or topic.error is not None:
                if state.paused_reason is None:
                    error = topic.error if topic is not None else None
                    why = f" ({error})" if error is not None and "nknown topic" not in error else ""
                    self.pauses.pause(state, f"destination topic {state.destination_topic!r} does not exist{why}")
                continue
            if config.enable_partition_matching is not False and state.partition in topic.ids:
                deliveries.route(state, state.partition, len(topic.ids))
            elif config.requires_destination_partition:
                if state.paused_reason is None:
                    self.pauses.pause(
                        state,
                        f"destination partition {state.destination_topic}[{state.partition}] "
                        "does not exist (partitions are preserved)",
                    )
            else:
                deliveries.route(state, UNASSIGNED_PARTITION, len(topic.ids))
