"""The estate's map around the flows: the topics each connector selects on its source cluster and the topics it
writes on its destination cluster (one row per connector; topics listed inside)."""

from dataclasses import dataclass, field

import dagster as dg

from mirus_dagster.constants import (
    ASSET_GROUP,
    CONNECTORS_ASSET,
    DESTINATION_TOPICS_ASSET,
    FLOWS_ASSET,
    SOURCE_TOPICS_ASSET,
)
from mirus_dagster.dagster_resources import PlatformDatabase
from replicator.configuration.connector import ConnectorConfigError, load
from replicator.state.store import Store

SOURCE_TOPICS = dg.AssetKey(SOURCE_TOPICS_ASSET)
DESTINATION_TOPICS = dg.AssetKey(DESTINATION_TOPICS_ASSET)
LISTED_TOPICS = 30  # per connector in the table; the count is always complete


def _listed(topics: list[str]) -> str:
    shown = ", ".join(topics[:LISTED_TOPICS])
    return shown + (f" … (+{len(topics) - LISTED_TOPICS})" if len(topics) > LISTED_TOPICS else "")


@dataclass(frozen=True)
class Topology:
    """One connector's topics on both sides (or why its config could not be read)."""

    connector: str
    error: str | None = None
    source_cluster: str = ""
    target_cluster: str = ""
    source_topics: list[str] = field(default_factory=list)
    source_partitions: int = 0
    destination_topics: list[str] = field(default_factory=list)
    destination_partitions: int = 0
    missing_topics: list[str] = field(default_factory=list)


def topology_rows(store: Store) -> list[Topology]:
    """Per connector: clusters, selected source topics and their destination topics, with partition counts."""
    rows = []
    for record in store.list_connectors():
        try:
            config = load(record.properties)
        except ConnectorConfigError as exc:
            rows.append(Topology(record.name, error=str(exc)))
            continue
        source_snapshot = store.latest_snapshot(record.name, "source")
        destination_snapshot = store.latest_snapshot(record.name, "destination")
        source = source_snapshot.topics if source_snapshot else {}
        destination = destination_snapshot.topics if destination_snapshot else {}
        selected = [t for t in config.selector.select(source) if not config.namer.is_cycle(t)]
        targets = sorted({config.namer.destination_topic(t) for t in selected})
        rows.append(
            Topology(
                record.name,
                source_cluster=config.source_cluster_alias,
                target_cluster=config.target_cluster_alias,
                source_topics=selected,
                source_partitions=sum(source[t] for t in selected),
                destination_topics=targets,
                destination_partitions=sum(destination.get(t, 0) for t in targets),
                missing_topics=[t for t in targets if t not in destination],
            )
        )
    return rows


def _table(rows: list[Topology], side: str) -> str:
    if side == "source":
        lines = ["| connector | source cluster | topics | partitions | selected topics |", "|---|---|---|---|---|"]
    else:
        lines = [
            "| connector | destination cluster | topics | partitions | missing topics | destination topics |",
            "|---|---|---|---|---|---|",
        ]
    for r in rows:
        if r.error is not None:
            lines.append(f"| {r.connector} | configuration error: {r.error} |")
        elif side == "source":
            lines.append(
                f"| {r.connector} | {r.source_cluster} | {len(r.source_topics)} | {r.source_partitions} "
                f"| {_listed(r.source_topics)} |"
            )
        else:
            lines.append(
                f"| {r.connector} | {r.target_cluster} | {len(r.destination_topics)} "
                f"| {r.destination_partitions} | {_listed(r.missing_topics) or '—'} "
                f"| {_listed(r.destination_topics)} |"
            )
    return "\n".join(lines) if rows else "No connectors."


@dg.asset(
    key=SOURCE_TOPICS,
    group_name=ASSET_GROUP,
    deps=[CONNECTORS_ASSET],
    description="Per connector: the source cluster's topics it selects (latest metadata the monitor saw).",
)
def source_topics(platform: PlatformDatabase) -> dg.MaterializeResult:
    rows = topology_rows(platform.store())
    return dg.MaterializeResult(
        metadata={
            "connectors": dg.MetadataValue.md(_table(rows, "source")),
            "topics": sum(len(r.source_topics) for r in rows),
        }
    )


@dg.asset(
    key=DESTINATION_TOPICS,
    group_name=ASSET_GROUP,
    deps=[FLOWS_ASSET],
    description="Per connector: the destination topics its flow writes, and which of them do not exist.",
)
def destination_topics(platform: PlatformDatabase) -> dg.MaterializeResult:
    rows = topology_rows(platform.store())
    return dg.MaterializeResult(
        metadata={
            "connectors": dg.MetadataValue.md(_table(rows, "destination")),
            "topics": sum(len(r.destination_topics) for r in rows),
            "missing topics": sum(len(r.missing_topics) for r in rows),
        }
    )
