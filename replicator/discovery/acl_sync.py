"""Topic ACLs kept in sync, as MirrorMaker 2 does (`sync.topic.acls.enabled`, `sync.topic.acls.interval.seconds`).

MirrorMaker 2's rules (`MirrorSourceConnector.syncTopicAcls`): the source's ACLs on the literal names of replicated
topics (never `*`, never a prefix) are created at the destination on the destination topic's name; write access is
never granted downstream (ALLOW WRITE is left out) and ALLOW ALL becomes ALLOW READ, so consumers of the source can
read the replica and nothing writes to it but the replicator. ACLs are only ever added, never removed (a revoked
source ACL stays at the destination, as in MirrorMaker 2). A source without an authorizer (or a broker without ACL
requests) has nothing to sync: not a problem.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from replicator.clusters import ClusterAdmin
from replicator.discovery.topic_sync import broker_reason, missing_acl

log = logging.getLogger(__name__)

ADMIN_TIMEOUT_S = 10.0
ACL_PROBLEM = "acl sync"  # the flow problem naming why the last sync failed
# A cluster without an authorizer answers SECURITY_DISABLED; a broker without ACL requests, unsupported.
NOTHING_TO_SYNC = frozenset({KafkaError.SECURITY_DISABLED, KafkaError._UNSUPPORTED_FEATURE})
# Every literal topic binding. confluent-kafka types a filter's name, principal and host as `str` (AclBinding's
# `__init__`), though None matches any value, as its documentation of AclBindingFilter says.
TOPIC_LITERALS = AclBindingFilter(
    ResourceType.TOPIC,
    None,  # type: ignore[arg-type]
    ResourcePatternType.LITERAL,
    None,  # type: ignore[arg-type]
    None,  # type: ignore[arg-type]
    AclOperation.ANY,
    AclPermissionType.ANY,
)


@dataclass(frozen=True)
class AclSync:
    """What one sync found: the destination's bindings it asked for, or why it could not."""

    bindings: frozenset[AclBinding]
    problem: str | None = None


def destination_binding(source: AclBinding, destination_topic: str) -> AclBinding | None:
    """The destination's copy of a source topic ACL (MirrorMaker 2's `targetAclBinding`), None for write access."""
    allow = source.permission_type == AclPermissionType.ALLOW
    if allow and source.operation == AclOperation.WRITE:
        return None
    operation = AclOperation.READ if allow and source.operation == AclOperation.ALL else source.operation
    return AclBinding(
        ResourceType.TOPIC,
        destination_topic,
        ResourcePatternType.LITERAL,
        source.principal,
        source.host,
        operation,
        source.permission_type,
    )


def wanted_bindings(source_acls: list[AclBinding], pairs: Mapping[str, str]) -> frozenset[AclBinding]:
    """The destination ACLs for the source's topic ACLs; `pairs`: destination topic -> its source topic."""
    destinations: dict[str, list[str]] = {}
    for destination, source in pairs.items():
        destinations.setdefault(source, []).append(destination)
    wanted = set()
    for acl in source_acls:
        if acl.resource_pattern_type != ResourcePatternType.LITERAL or acl.name == "*":
            continue
        for destination in destinations.get(acl.name, []):
            binding = destination_binding(acl, destination)
            if binding is not None:
                wanted.add(binding)
    return frozenset(wanted)


def sync_topic_acls(
    source_admin: AdminClient,
    destination_admin: AdminClient,
    pairs: Mapping[str, str],
    created: frozenset[AclBinding] = frozenset(),
) -> AclSync:
    """Create at the destination the ACLs that `pairs`' source topics have at the source. `created`: what the last
    sync created (asked again only if the source's ACLs changed: creating an existing ACL changes nothing)."""
    try:
        source_acls = source_admin.describe_acls(TOPIC_LITERALS, request_timeout=ADMIN_TIMEOUT_S).result()
    except KafkaException as exc:
        if exc.args[0].code() in NOTHING_TO_SYNC:
            return AclSync(frozenset())
        needs = missing_acl(exc, "Describe", "the Cluster there")
        return AclSync(created, f"{_cluster(source_admin, 'source')} refused DescribeAcls: {broker_reason(exc)}{needs}")
    wanted = wanted_bindings(source_acls, pairs)
    missing = sorted(wanted - created, key=str)
    if not missing:
        return AclSync(wanted)
    futures = destination_admin.create_acls(missing, request_timeout=ADMIN_TIMEOUT_S)
    refused: list[tuple[AclBinding, KafkaException]] = []
    for binding, future in futures.items():
        try:
            future.result()
        except KafkaException as exc:
            refused.append((binding, exc))
    if refused:
        first, error = refused[0]
        # confluent-kafka types `operation` as what its `__init__` accepts; the `__init__` made it an AclOperation.
        operation = first.operation.name  # type: ignore[union-attr]
        return AclSync(
            created,
            f"{_cluster(destination_admin, 'destination')} refused CreateAcls for {len(refused)} topic ACL(s), e.g. "
            f"{first.principal} {operation} on {first.name!r}: {broker_reason(error)}"
            f"{missing_acl(error, 'Alter', 'the Cluster there')}",
        )
    log.info("synced %d topic ACL(s) to the destination", len(missing))
    return AclSync(wanted)


def _cluster(admin: AdminClient, role: str) -> str:
    return f"{role} cluster ({admin.identity})" if isinstance(admin, ClusterAdmin) else f"{role} cluster"
