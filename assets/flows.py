"""Replication flows as assets: one dynamic partition per connector, so lineage shows each connector's flow.

The metadata watcher job records `flow_materialization` events; it gets the function from
`mirus_dagster.definitions`.
"""

from __future__ import annotations

import dagster as dg

from mirus_dagster.constants import (
    ASSET_GROUP,
    CONNECTOR_PARTITIONS,
    CONNECTORS_ASSET,
    FLOWS_ASSET,
    SOURCE_TOPICS_ASSET,
)
from replicator.discovery.monitor import MonitorResult

connector_partitions = dg.DynamicPartitionsDefinition(name=CONNECTOR_PARTITIONS)

flows_spec = dg.AssetSpec(
    FLOWS_ASSET,
    description="Per connector: which source topics flow to which destination topics, over how many tasks. "
    "Recorded by the monitor each time a connector's assignment generation changes.",
    group_name=ASSET_GROUP,
    deps=[CONNECTORS_ASSET, SOURCE_TOPICS_ASSET],
    partitions_def=connector_partitions,
)


def flow_materialization(connector: str, result: MonitorResult) -> dg.AssetMaterialization:
    topics = sorted({topic for topic, _ in result.plan.replicate})
    return dg.AssetMaterialization(
        asset_key=FLOWS_ASSET,
        partition=connector,
        description=f"assignment generation {result.generation}",
        metadata={
            "generation": result.generation,
            "partitions": len(result.plan.replicate),
            "tasks": len(result.tasks),
            "topics": dg.MetadataValue.json(topics),
            "missing at destination": dg.MetadataValue.json([f"{t}[{p}]" for t, p in result.plan.missing_destination]),
            "cycles skipped": dg.MetadataValue.json(result.plan.cycles),
        },
    )
