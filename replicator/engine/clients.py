"""The clients a task replicates with, made together for one configuration version by `ReplicationTask.rebuild` and
handed whole to the parts that use them, and the clusters they are made for (`identify`). Made again (a new
configuration version, a restart, record size limits the clients no longer fit) means a new set handed to those
parts: none is changed in place."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from replicator.clusters import ClusterAdmin, ClusterIdentityError, cluster_id
from replicator.configuration.connector import ConnectorConfig
from replicator.engine.deliveries import Deliveries
from replicator.engine.source_reader import SourceReader

if TYPE_CHECKING:  # (imported by a task that copies batches alone: `ReplicationTask.rebuild`)
    from replicator.engine.batch_lanes import BatchLanes

# The settings and aliases of both clusters, and the Kafka cluster ids they answered with (source, destination).
Identified = tuple[tuple[object, ...], str, str]


@dataclass(frozen=True)
class Clients:
    """The source reader, the destination producers and the batch lanes, with what they were made for."""

    config: ConnectorConfig
    version: int  # of the configuration
    restart_marker: object  # the connector's last restart request they were made after
    sized_for: tuple[object, ...]  # the size settings they were made with (`RecordLimits.sizes_of`)
    source_cluster: str  # Kafka cluster ids (aliases are display names that may coincide)
    destination_cluster: str
    reader: SourceReader
    deliveries: Deliveries
    lanes: BatchLanes | None = None  # copy.mode=batches: partitions copied as record batches

    def close(self) -> None:
        """Close the source consumers, the lanes and the destination producers (what they still hold is dropped)."""
        try:
            self.reader.close()
            if self.lanes is not None:
                self.lanes.close()
        finally:
            self.deliveries.close()


def identify(config: ConnectorConfig, last: Identified | None, on_event: Callable[[str], None]) -> Identified:
    """The source and destination clusters' Kafka cluster ids (aliases are display names that may coincide).

    Asked first: a cluster that refuses the connection fails the start here at once, naming the refusal, before any
    other request waits out its timeout against it. Asked again whenever clients are made (a cluster may have been
    replaced behind the same address), but clients made again for the same clusters keep the ids they have (`last`)
    when the clusters do not answer: one metadata time-out must not end a replicating task."""
    clusters = (
        config.admin_settings("source"),
        config.source_cluster_alias,
        config.admin_settings("destination"),
        config.target_cluster_alias,
    )
    try:
        source_cluster = cluster_id(ClusterAdmin(clusters[0]), "source", config.source_cluster_alias)
        destination_cluster = cluster_id(ClusterAdmin(clusters[2]), "destination", config.target_cluster_alias)
    except ClusterIdentityError as exc:
        if last is None or clusters != last[0]:
            raise
        on_event(f"{exc}: the ids read before for the same clusters are kept")
        return last
    return clusters, source_cluster, destination_cluster
