"""Provenance headers: where a replicated record came from.

Two headers are appended to every replicated record unless turned off:
- `mirus.origin`: the Kafka cluster id (`replicator.clusters`) of the cluster where the record was first
  produced, carried unchanged across hops; a record whose origin is the destination cluster is never written back
  (cycle guard). Ids, not aliases: two clusters may share an alias, never an id.
- `mirus.source`: this hop's `<source cluster id>/<topic>/<partition>/<offset>`; topic names cannot contain
  `/`, so it parses from the right. It makes resume, verification and consumer-offset translation exact.

Two headers rather than one per field: every header costs per record on the hot path.
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
    """The cluster a record was first produced on, if an earlier hop recorded it."""
    for name, value in headers or ():
        if name == ORIGIN and value is not None:
            return value.decode()
    return None


def user_headers(headers: Headers | None) -> list[tuple[str, bytes | None]]:
    """The record's headers without any provenance headers (order and duplicates kept)."""
    return [(n, v) for n, v in headers or () if not n.startswith(PREFIX)]


def source_prefix(source_cluster: str, topic: str, partition: int) -> bytes:
    """The constant part of a partition's `mirus.source` value; the offset is appended per record."""
    return f"{source_cluster}/{topic}/{partition}/".encode()


def copy_headers(
    headers: Headers | None, origin: str, source_cluster: str, topic: str, partition: int, offset: int
) -> list[tuple[str, bytes | None]]:
    """The headers of a record's copy: its own headers without provenance (order and duplicates kept), then this
    hop's provenance; the origin an earlier hop recorded is kept, else it is `origin`. The forwarding loop
    (`replicator.engine.forwarder`) writes the same inline, since a call per record costs; a test holds the two
    together."""
    first = origin_cluster(headers) or origin
    return [
        *user_headers(headers),
        (ORIGIN, first.encode()),
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
    if origin is None or source is None:
        return None
    try:
        cluster, topic, partition, offset = source.rsplit("/", 3)
        return Provenance(origin, cluster, topic, int(partition), int(offset))
    except ValueError:
        return None
