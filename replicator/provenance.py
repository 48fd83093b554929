"""Provenance headers: where a replicated record came from.

Appended to every replicated record unless turned off. `mirus.origin.cluster` names the cluster where the
record was first produced and is carried unchanged across hops (it stops cycles); the `mirus.source.*` headers
name this hop's source topic, partition and offset (they make resume, verification and consumer-offset
translation exact). Values are UTF-8 text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

PREFIX = "mirus."
ORIGIN_CLUSTER = "mirus.origin.cluster"
SOURCE_CLUSTER = "mirus.source.cluster"
SOURCE_TOPIC = "mirus.source.topic"
SOURCE_PARTITION = "mirus.source.partition"
SOURCE_OFFSET = "mirus.source.offset"

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
        if name == ORIGIN_CLUSTER and value is not None:
            return value.decode()
    return None


def user_headers(headers: Headers | None) -> list[tuple[str, bytes | None]]:
    """The record's headers without any provenance headers (order and duplicates kept)."""
    return [(n, v) for n, v in headers or () if not n.startswith(PREFIX)]


def with_provenance(
    headers: Headers | None, origin: str, source_cluster: str, topic: str, partition: int, offset: int
) -> list[tuple[str, bytes | None]]:
    """The user's headers followed by this hop's provenance headers."""
    return [
        *user_headers(headers),
        (ORIGIN_CLUSTER, origin.encode()),
        (SOURCE_CLUSTER, source_cluster.encode()),
        (SOURCE_TOPIC, topic.encode()),
        (SOURCE_PARTITION, str(partition).encode()),
        (SOURCE_OFFSET, str(offset).encode()),
    ]


def parse(headers: Headers | None) -> Provenance | None:
    """The provenance of a replicated record, or None for a record without (complete) provenance headers."""
    found = {n: v.decode() for n, v in headers or () if n.startswith(PREFIX) and v is not None}
    try:
        return Provenance(
            origin_cluster=found[ORIGIN_CLUSTER],
            source_cluster=found[SOURCE_CLUSTER],
            source_topic=found[SOURCE_TOPIC],
            source_partition=int(found[SOURCE_PARTITION]),
            source_offset=int(found[SOURCE_OFFSET]),
        )
    except (KeyError, ValueError):
        return None
