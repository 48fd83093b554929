"""Everything the engine reads from and writes to Postgres, in one place.

Fencing rule: a task writes offsets, copy segments, producer ids, heartbeats and partition claims only in a
transaction that first updates its own lease row *with its epoch in the WHERE clause*. A newer claim raises the
epoch, so the older instance's next write matches no row and it learns it was fenced; the row lock makes a claim
wait for an in-flight commit.
"""

from __future__ import annotations

from replicator.state.assignment_store import AssignmentStore
from replicator.state.connector_store import ConnectorStore
from replicator.state.flow_store import FlowStore
from replicator.state.metric_store import MetricStore
from replicator.state.offset_store import OffsetStore
from replicator.state.ownership_store import OwnershipStore
from replicator.state.segment_store import SegmentStore


class Store(ConnectorStore, AssignmentStore, OwnershipStore, OffsetStore, MetricStore, FlowStore, SegmentStore):
    """The platform database as the engine, the monitor and the surfaces use it; each part stores one thing."""
