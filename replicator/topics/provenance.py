"""Provenance headers: where a replicated record came from.

Appended to every replicated record unless turned off:
- `mirus.source`: this hop's `<source cluster id>/<topic>/<partition>/<offset>`; topic names cannot contain
  `/`, so it parses from the right. It makes resume, verification and consumer-offset translation exact.
- `mirus.origin`: the Kafka cluster id (`replicator.clusters`) of the cluster where the record was first produced,
  carried unchanged across hops. A record whose origin is the destination cluster is never written back (cycle
  guard). Ids, not aliases: two clusters may share an alias, never an id.

A record's origin is its `mirus.origin`, else the cluster its `mirus.source` names: the compact layout
(`provenance.headers.compact`) writes `mirus.origin` only where it is not that cluster (a copy of a copy), so that a
first hop carries one header; every header costs per record on the hot path. Both layouts read the same here, but
releases before this reader see no origin on a compact copy: the layout is the connector's choice, both headers by
default.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

PREFIX = "mirus."
ORIGIN = "mirus.origin"
SOURCE = "mirus.source"

Headers = Sequence[tuple[str, bytes | None]]


@dataclass(frozen=True)
class Provenance:
    origin_cluster: str
    source_cluster: str
    source_topic: str
    source_partition: int
    source_offset: int


def origin_cluster(headers: Headers | None) -> str | None:
    """The cluster a record was first produced on, if an earlier hop recorded it: its `mirus.origin`, else the
    cluster its `mirus.source` names."""
    source = None
    for name, value in headers or ():
        if value is None:
            continue
        if name == ORIGIN:
            return value.decode()
        if name == SOURCE:
            source = value
    return _source_cluster(source.decode()) if source is not None else None


def _source_cluster(source: str) -> str | None:
    parts = source.rsplit("/", 3)
    return parts[0] if len(parts) == 4 else None


def user_headers(headers: Headers | None) -> list[tuple[str, bytes | None]]:
    """The record's headers without any provenance headers (order and duplicates kept)."""
    return [(n, v) for n, v in headers or () if not n.startswith(PREFIX)]


def source_prefix(source_cluster: str, topic: str, partition: int) -> bytes:
    """The constant part of a partition's `mirus.source` value; the offset is appended per record."""
    return f"{source_cluster}/{topic}/{partition}/".encode()


def copy_headers(
    headers: Headers | None, source_cluster: str, topic: str, partition: int, offset: int, *, compact: bool = False
) -> list[tuple[str, bytes | None]]:
    """The headers of a record's copy: its own headers without provenance (order and duplicates kept), then its
    origin (the one an earlier hop recorded, else this hop's source cluster; in the compact layout only where it
    is not this hop's source cluster), then this hop's `mirus.source`. The forwarding loop
    (`replicator.engine.forwarder`) writes the same inline, since a call per record costs; a test holds the two
    together."""
    first = origin_cluster(headers) or source_cluster
    return [
        *user_headers(headers),
        *([(ORIGIN, first.encode())] if first != source_cluster or not compact else []),
        (SOURCE, source_prefix(source_cluster, topic, partition) + b"%d" % offset),
    ]


def parse(headers: Headers | None) -> Provenance | None:
    """The provenance of a replicated record, or None for a record without (valid) provenance headers."""
    origin = source = None
    for name, value in headers or ():
        if name == ORIGIN and value is not None:
            origin = value.decode()
        elif name == SOURCE and value is not None:
            source = value.decode()
    if source is None:
        return None
    try:
        cluster, topic, partition, offset = source.rsplit("/", 3)
        return Provenance(origin or cluster, cluster, topic, int(partition), int(offset))
    except ValueError:
        return None
