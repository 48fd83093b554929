"""Every connector property, declared once (as MirrorMaker 2's `ConfigDef.define` does).

A property the model reads on its own is a field of `PropertyFields` (the base of `ConnectorConfig`), declared with
`Property`: its name is the field's with underscores as dots (`offset_flush_interval_ms` is offset.flush.interval.ms),
its type the field's, its default, bounds, description and the rest written once there. A property read together
with others (topic selection, naming), a client setting's other spelling or a value only checked is a row of
`_PROPERTIES_WITHOUT_FIELD`. `PROPERTIES`, the one table, is both, in the reference page's order: from it come the
reader's checks, the list of known properties, the bounds in error messages, "did you mean" hints, the REST API's
config definitions and the reference page docs/CONNECTOR-PROPERTIES.md.

Adding a property is one declaration: a field with `Property`, or a row. A field is read, checked and set on the
model by the generic reader; a row with a `part` is read by that part's own code in `topic_rules` (selection,
naming), which needs several properties at once. `CLIENT_PREFIXES` declares the prefixes of librdkafka settings.
Regenerate the reference page after changing a property (a test fails while it is stale):
`python -m replicator.configuration.properties_page > docs/CONNECTOR-PROPERTIES.md`.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, get_args

import annotated_types
from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationInfo, field_validator
from pydantic.fields import FieldInfo

from replicator.topics.selection import compile_java_regex


class Kind(StrEnum):
    """A property's type, as Kafka's ConfigDef names them. Values may be JSON strings, numbers or booleans."""

    STRING = "string"
    INT = "int"
    BOOLEAN = "boolean"
    LIST = "list"  # comma-separated, whitespace around entries ignored, empty entries dropped
    CLASS = "class"


class Client(StrEnum):
    """Which librdkafka client a setting configures."""

    SOURCE = "source consumer"
    DESTINATION = "destination admin (base of the producer)"
    PRODUCER = "destination producer"


class Part(StrEnum):
    """Properties read together by one part of the parser rather than one by one."""

    SELECTION = "topic selection"
    NAMING = "destination naming"


INT_MAX = 2**31 - 1
# MirrorMaker 2's DefaultConfigPropertyFilter: topic configs never copied to the destination.
DEFAULT_CONFIG_PROPERTIES_EXCLUDE = (
    r"follower\.replication\.throttled\.replicas",
    r"leader\.replication\.throttled\.replicas",
    r"message\.timestamp\.difference\.max\.ms",
    r"message\.timestamp\.type",
    r"unclean\.leader\.election\.enable",
    r"min\.insync\.replicas",
)
# A bound on tasks.max, so that one request cannot ask the platform for thousands of run processes.
MAX_TASKS = 256
MAX_TOPIC_NAME = 249  # Kafka's limit on topic names (`Topic.MAX_NAME_LENGTH`)
MIRUS_CONNECTOR_CLASS = "com.salesforce.mirus.MirusSourceConnector"
MM2_CONNECTOR_CLASS = "org.apache.kafka.connect.mirror.MirrorSourceConnector"
_BYTE_ARRAY_CONVERTER = "org.apache.kafka.connect.converters.ByteArrayConverter"
_BYTE_ARRAY_CONVERTERS = frozenset(
    {_BYTE_ARRAY_CONVERTER, "com.salesforce.mirus.ByteArrayConverter", "ByteArrayConverter"}
)


@dataclass(frozen=True)
class PropertySpec:
    """One connector property: a row of the table.

    `field`: the `PropertyFields` field it is declared as, which the generic reader sets from it (None for rows read
    by a `part`, or checked only). `client` / `setting`: the property is that librdkafka setting of that client.
    `choices` / `pattern` restrict a STRING, described to users by `expected`. `required`: an absent or empty value
    is an error. Which values are secret is the masking rule's to say (`replicator.configuration.masking`).
    """

    name: str
    kind: Kind
    doc: str
    default: object = None
    field: str | None = None
    minimum: int | None = None
    maximum: int | None = None
    choices: frozenset[str] = frozenset()
    pattern: str | None = None
    expected: str = ""
    required: bool = False
    aliases: tuple[str, ...] = ()
    part: Part | None = None
    client: Client | None = None
    setting: str = ""
    max_length: int = 10_000  # text kinds: longer values are refused before any other check reads them

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)

    @property
    def is_text(self) -> bool:
        """A string-valued kind: a JSON number or boolean given for it is a mistake, not a value."""
        return self.kind in (Kind.STRING, Kind.LIST, Kind.CLASS)

    def bounds(self) -> str:
        """How an INT's bounds read in messages and docs."""
        low = self.minimum if self.minimum is not None else -INT_MAX - 1
        return f">= {low}" if self.maximum is None else f"between {low} and {self.maximum}"


@dataclass(frozen=True)
class ClientPrefix:
    """Properties `<prefix><librdkafka setting>` configure `client`."""

    prefix: str
    client: Client
    doc: str


def split_list(value: str) -> tuple[str, ...]:
    """Kafka's LIST type: comma-separated, whitespace around entries ignored, empty entries dropped."""
    return tuple(part.strip() for part in value.split(",") if part.strip())


def Property(
    default: Any,
    doc: str,
    *,
    kind: Kind | None = None,
    minimum: int | None = None,
    maximum: int | None = None,
    choices: frozenset[str] = frozenset(),
    pattern: str | None = None,
    expected: str = "",
    aliases: tuple[str, ...] = (),
) -> Any:
    """A property declared as a field of `PropertyFields` (named as pydantic's `Field`, which it returns): `default`
    (`...`: required), `doc`, and what `PropertySpec` says of the rest. The kind is the field's type's (a `str` is a
    STRING unless `kind` says LIST); `minimum` and `maximum` become the field's bounds."""
    extra: dict[str, JsonValue] = {}
    if kind is not None:
        extra["kind"] = kind.value
    if choices:
        extra["choices"] = list[JsonValue](sorted(choices))
    if pattern is not None:
        extra["pattern"] = pattern
    if expected:
        extra["expected"] = expected
    if aliases:
        extra["aliases"] = list[JsonValue](aliases)
    return Field(default, description=doc, ge=minimum, le=maximum, json_schema_extra=extra or None)


_NAME_CHARS = "letters, digits, '.', '_' or '-'"


class PropertyFields(BaseModel):
    """The properties that are fields of the model, each declared once (`Property`). `ConnectorConfig` extends it
    with what several properties build together; the generic reader sets these from the properties, in this order
    (a validator reads earlier fields)."""

    model_config = ConfigDict(frozen=True)

    # fmt: off
    # -- the connector --
    name: str = Property(..., "The connector's name.", pattern=r"[A-Za-z0-9._-]{1,200}",
                         expected=f"1-200 {_NAME_CHARS}")
    connector_class: str | None = Property(
        None, "Mirus's or MirrorMaker 2's source connector class (or its short name); both mean the same here.",
        choices=frozenset(
            {MIRUS_CONNECTOR_CLASS, MM2_CONNECTOR_CLASS, "MirusSourceConnector", "MirrorSourceConnector"}),
        expected=f"{MIRUS_CONNECTOR_CLASS} or {MM2_CONNECTOR_CLASS} (or their short names)")
    tasks_max: int = Property(
        1, "How many tasks (one Dagster run each) share the connector's partitions. At most "
        f"{MAX_TASKS}: each task is a process with its own clients and Postgres connections, and a task holds "
        "thousands of partitions.", minimum=1, maximum=MAX_TASKS)
    source_cluster_alias: str = Property(
        "source", "The source cluster's name: the prefix of remote topic names under MM2 naming, and the origin "
        "written in provenance headers.")
    target_cluster_alias: str = Property(
        "target", "The destination cluster's name: records that originated there are never copied back (cycle "
        "guard).")
    # -- engine behaviour --
    enable_partition_matching: bool | None = Property(
        None, "true: each record goes to the destination partition with its source partition's number, which must "
        "exist (Mirus). false: the producer's partitioner chooses. Unset: the same number when the destination has "
        "it, else the partitioner.")
    enable_destination_topic_checking: bool = Property(
        True, "Replicate a partition only once its destination topic exists.")
    poll_timeout_ms: int = Property(
        1000, "Longest wait of one source poll. A task never blocks longer than 1 s whatever is set, so that stops "
        "and reassignments are noticed.", minimum=1, maximum=60000)
    monitor_poll_wait_ms: int = Property(
        2000, "How often the monitor runs its periodic duties for the connector (topic config sync, checkpoints, "
        "heartbeats, a full re-plan). New topics and partitions are seen sooner: the metadata watcher reads every "
        "cluster twice a second for all connectors together.", minimum=100)
    commit_failure_restart_ms: int = Property(
        300000, "A task that replicates records but cannot commit offsets for this long fails, and the supervisor "
        "restarts it.", minimum=1000)
    offset_flush_interval_ms: int = Property(
        1000, "How often a task commits replicated offsets to Postgres (and, in exactly-once mode, its destination "
        "transaction first).", minimum=100)
    start_after_destination_copies: bool = Property(
        False, "At least once: when a task starts (after a crash, a kill, a takeover), read each partition's copies "
        "written at the destination since its last commit and start after the last one, so a crash re-sends "
        "nothing instead of the records read since the last commit. A start reads those copies either way (one "
        "ListOffsets request per destination broker first: a partition with nothing past its commit is not read); "
        "false counts them as re-sent (mirus_records_resent_total) and writes them again. Needs "
        "provenance.headers.enabled (copies made as batches, copy.mode=batches, carry none and are found by their "
        "bytes: a batch of this platform's producer holding the next source batch's records) and the default "
        "producer ordering. Exactly-once always starts so. Formerly resume.after.destination.copies (still "
        "read: `resume` is Kafka's word for a paused partition or connector going on).",
        aliases=("resume.after.destination.copies",))
    replication_throttle_bytes_per_second: int = Property(
        0, "The most the connector replicates a second, in key + value bytes (as the metrics count them), shared "
        "evenly by its tasks; over it the tasks stop reading until the budget allows (nothing is dropped: the "
        "backlog waits in the source). A change applies within a second, without new clients. 0: no limit.",
        minimum=0)
    replication_throttle_records_per_second: int = Property(
        0, "The most records the connector replicates a second, shared evenly by its tasks; as "
        "replication.throttle.bytes.per.second (both may be set). 0: no limit.", minimum=0)
    provenance_headers_enabled: bool = Property(
        True, "Add the `mirus.source` (source cluster id, topic, partition, offset) and `mirus.origin` (the cluster "
        "where the record was first produced) headers to every copy: cycle prevention, exact resume and offset "
        "translation; required by exactly-once.")
    provenance_headers_compact: bool = Property(
        False, "true: `mirus.origin` only on a copy of a copy, so a first hop carries one header (3 to 15 % less CPU "
        "per 100-byte record). Only once every replicator reading these copies (a flow back, in any installation) runs "
        "a release that reads this layout: an earlier one copies such a copy back once. false: both headers.")
    exactly_once_support: str = Property(
        "disabled", "MirrorMaker 2's name. `required` or `requested`: exactly-once (each task writes through a "
        "transactional producer, commits a destination transaction every offset.flush.interval.ms, and resumes "
        "each partition after its last committed record at the destination; consumers of the destination must "
        "read with isolation.level=read_committed). Both mean the same here: MM2 distinguishes them only by a "
        "pre-flight check of the connector plug-in. A destination without transactions fails the task with the "
        "broker's error. `disabled`: at-least-once.",
        choices=frozenset({"disabled", "requested", "required"}), expected="disabled, requested or required")
    copy_mode: str = Property(
        "records", "`batches`: a partition's record batches are copied as bytes wherever they can pass (the partition "
        "kept, offsets without gaps, magic 2, within the destination topic's max.message.bytes, a source topic that "
        "keeps create times: one that keeps append times is copied by records, whose copies carry the append time a "
        "source consumer reads): their records, "
        "compression, timestamps and headers untouched, no provenance headers added; the record path copies what "
        "cannot pass, in order, and every partition until it moves to batches (nothing in flight, its destination "
        "partition and size limit known). Copies made as batches carry no provenance headers: where they went is "
        "stored in Postgres (offset translation and `mirus verify --connector` use it), and a flow back copying "
        "batches skips them by their producer id; a flow back on `records` cannot tell them (keep both directions "
        "on `batches`). `records`: every record through the record path, with provenance headers. At least once "
        "only. What went each way, and why partitions went back to the record path: docs/MONITORING.md, \"The "
        "batch path\". The default stays `records` while a flow back on records cannot tell batch copies: a "
        "connector's default must not depend on how the connector opposite it copies.",
        choices=frozenset({"records", "batches"}), expected="records or batches")
    task_heartbeat_interval_ms: int = Property(
        2000, "How often a task proves it is alive: every offset commit heartbeats its lease, and when commits are "
        "further apart (offset.flush.interval.ms) a heartbeat alone is written this often.", minimum=100)
    task_lease_timeout_ms: int = Property(
        30000, "A task silent this long is replaced and its partitions may be taken over; must be greater than 2 x "
        "task.heartbeat.interval.ms.", minimum=1)
    # -- topic management (replicator.discovery.topic_sync) --
    topic_creation_enable: bool = Property(
        True, "Create missing destination topics with the source's partition count and topic configs, and add "
        "partitions when the source gains some (before their records are written). While on, a source partition is "
        "only ever written to the destination partition with its number.")
    replication_factor: int = Property(
        -1, "MirrorMaker 2: replicas of created destination topics; -1 (or 0): the source topic's, capped by the "
        "destination's broker count.", minimum=-1)
    config_properties_exclude: str = Property(
        ", ".join(DEFAULT_CONFIG_PROPERTIES_EXCLUDE), "MirrorMaker 2: Java regular expressions of topic configs "
        "never copied to the destination (its DefaultConfigPropertyFilter list by default).", kind=Kind.LIST)
    sync_topic_configs_enabled: bool = Property(
        True, "MirrorMaker 2: copy changed topic configs to the destination topics periodically.")
    sync_topic_configs_interval_seconds: int = Property(
        60, "MirrorMaker 2: how often topic configs are compared and copied.", minimum=1)
    sync_topic_acls_enabled: bool = Property(
        True, "MirrorMaker 2: create the source's topic ACLs on the destination topics (ALLOW WRITE left out, ALLOW "
        "ALL as ALLOW READ, literal names only; never removed). docs/SECURITY.md lists the ACLs this needs.")
    sync_topic_acls_interval_seconds: int = Property(
        600, "MirrorMaker 2: how often topic ACLs are synced.", minimum=1)
    # -- failover (replicator.discovery.offset_translation, replicator.discovery.heartbeats) --
    groups: str = Property(
        ".*", "MirrorMaker 2: Java regular expressions of the source consumer groups whose offsets are translated "
        "(checkpoints, offset sync).", kind=Kind.LIST)
    groups_exclude: str = Property(
        "console-consumer-.*, connect-.*, __.*", "MirrorMaker 2: Java regular expressions of consumer groups never "
        "translated.", kind=Kind.LIST)
    emit_checkpoints_enabled: bool = Property(
        True, "MirrorMaker 2: translate the selected groups' committed offsets exactly and keep them as checkpoints "
        "in Postgres (for `mirus offsets translate` when the source is lost).")
    emit_checkpoints_interval_seconds: int = Property(
        60, "MirrorMaker 2: how often checkpoints are taken.", minimum=1)
    sync_group_offsets_enabled: bool = Property(
        False, "MirrorMaker 2: also commit the translated offsets into the destination groups of the same name, "
        "only while they have no active members and only forward.")
    sync_group_offsets_interval_seconds: int = Property(
        60, "MirrorMaker 2: how often group offsets are synced.", minimum=1)
    emit_heartbeats_enabled: bool = Property(
        True, "MirrorMaker 2: write heartbeats into the source's `heartbeats` topic, which the connector replicates; "
        "their age at the destination is the flow's liveness.")
    emit_heartbeats_interval_seconds: int = Property(
        1, "MirrorMaker 2: the least time between two heartbeats (they are written by the monitor, at its pace).",
        minimum=1)
    task_standby_runs: int = Property(
        1, "Warm standby runs per task. A standby waits on the owner's lease and takes the task over the moment the "
        "owner's process dies (well under a second, instead of a new run's start); each costs one more run process "
        "and one Postgres connection. 0: a crashed task waits for the supervisor to start a new run.", minimum=0,
        maximum=3)
    # fmt: on

    @field_validator("task_lease_timeout_ms")
    @classmethod
    def _lease_outlives_heartbeats(cls, lease: int, info: ValidationInfo) -> int:
        # A lease that could expire between two heartbeats of a healthy task would fence it for nothing. (The
        # heartbeat interval is in `info.data` because its field is declared first; absent if it failed.)
        heartbeat = info.data.get("task_heartbeat_interval_ms")
        if heartbeat is not None and lease <= 2 * heartbeat:
            raise ValueError(f"must be greater than 2 x task.heartbeat.interval.ms ({2 * heartbeat}), got {lease}")
        return lease

    @field_validator("config_properties_exclude", "groups", "groups_exclude")
    @classmethod
    def _java_regex_list(cls, value: str) -> str:
        for pattern in split_list(value):
            compile_java_regex(pattern)  # ValueError names the pattern and what is wrong
        return value


_S, _L = Kind.STRING, Kind.LIST
_KINDS: dict[object, Kind] = {int: Kind.INT, bool: Kind.BOOLEAN, str: Kind.STRING}


def _bound(info: FieldInfo, kind: type[annotated_types.Ge] | type[annotated_types.Le]) -> int | None:
    """A field's `ge` or `le` bound (None if it has none)."""
    for metadata in info.metadata:
        if isinstance(metadata, kind):
            bound = metadata.ge if isinstance(metadata, annotated_types.Ge) else metadata.le
            return bound if isinstance(bound, int) else None
    return None


def _listed(extra: dict[str, JsonValue], key: str) -> tuple[str, ...]:
    values = extra.get(key)
    return tuple(str(value) for value in values) if isinstance(values, list) else ()


def _field_spec(field: str, info: FieldInfo) -> PropertySpec:
    """The table's row of a property declared as a field of `PropertyFields`."""
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    (python_type,) = [t for t in get_args(info.annotation) or (info.annotation,) if t is not types.NoneType]
    kind = Kind(str(extra["kind"])) if "kind" in extra else _KINDS[python_type]
    return PropertySpec(
        name=field.replace("_", "."),
        kind=kind,
        doc=info.description or "",
        default=None if info.is_required() else info.default,
        field=field,
        minimum=_bound(info, annotated_types.Ge),
        maximum=_bound(info, annotated_types.Le),
        choices=frozenset(_listed(extra, "choices")),
        pattern=str(extra["pattern"]) if "pattern" in extra else None,
        expected=str(extra.get("expected", "")),
        required=info.is_required(),
        aliases=_listed(extra, "aliases"),
    )


_FIELD_ROWS = tuple(_field_spec(field, info) for field, info in PropertyFields.model_fields.items())
# Properties that are no field of their own: read together by a part, another spelling of a client setting, or
# only checked.
_PROPERTIES_WITHOUT_FIELD: tuple[PropertySpec, ...] = (
    # -- which topics --
    PropertySpec("topics.whitelist", _L, "Mirus: topic names to replicate.", part=Part.SELECTION),
    PropertySpec("topics.regex", _S, "Mirus: a Java regular expression; topics whose whole name matches are "
                 "replicated.", part=Part.SELECTION),
    PropertySpec("topics.regex.list", _L, "Mirus: Java regular expressions; an entry without a leading `^` must "
                 "match the whole name, one with it is searched.", part=Part.SELECTION),
    PropertySpec("topics", _L, "MirrorMaker 2: Java regular expressions of topics to replicate.",
                 part=Part.SELECTION),
    PropertySpec("topics.exclude", _L, "MirrorMaker 2: Java regular expressions of topics never replicated, "
                 "whichever selection names them.", part=Part.SELECTION),
    # -- destination names --
    PropertySpec("replication.policy.class", Kind.CLASS, "MirrorMaker 2: DefaultReplicationPolicy (remote topics "
                 "are `<source alias><separator><topic>`) or IdentityReplicationPolicy (same names). Unset: Mirus "
                 "prefix/suffix naming, or DefaultReplicationPolicy when source.cluster.alias is set.",
                 part=Part.NAMING),
    PropertySpec("replication.policy.separator", _S, "MirrorMaker 2: DefaultReplicationPolicy's separator.",
                 default=".", part=Part.NAMING),
    PropertySpec("destination.topic.name.prefix", _S, "Mirus: prefix of destination topic names.", default="",
                 part=Part.NAMING),
    PropertySpec("destination.topic.name.suffix", _S, "Mirus: suffix of destination topic names.", default="",
                 part=Part.NAMING),
    PropertySpec("transforms", _L, "Kafka Connect transforms of destination topic names; only RegexRouter "
                 "(`transforms.<name>.type`, `.regex`, `.replacement`).", part=Part.NAMING),
    # -- clients --
    PropertySpec("destination.bootstrap.servers", _S, "Mirus's deprecated spelling of "
                 "destination.consumer.bootstrap.servers.", client=Client.DESTINATION, setting="bootstrap.servers"),
    # -- Mirus's converters: records are copied byte for byte --
    *(
        PropertySpec(f"source.{part}.converter", _S, "Accepted only as ByteArrayConverter: records are copied "
                     "byte for byte.", choices=_BYTE_ARRAY_CONVERTERS,
                     expected=f"{_BYTE_ARRAY_CONVERTER} (records are copied byte for byte)")
        for part in ("key", "value", "header")
    ),
)  # fmt: skip

CLIENT_PREFIXES: tuple[ClientPrefix, ...] = (
    ClientPrefix("consumer.", Client.SOURCE, "Mirus: the source cluster's client settings."),
    ClientPrefix("source.cluster.", Client.SOURCE, "MirrorMaker 2: the source cluster's client settings."),
    ClientPrefix("destination.consumer.", Client.DESTINATION, "Mirus: the destination cluster's client settings, "
                 "for metadata and as the base of the producer."),
    ClientPrefix("target.cluster.", Client.DESTINATION, "MirrorMaker 2: the destination cluster's client settings."),
    ClientPrefix("producer.", Client.PRODUCER, "Producer settings, overlaid on the destination's."),
    # MirrorMaker 2's per-client spellings. This platform uses one set of settings per cluster (its security settings
    # must reach every client of that cluster), so each is that cluster's: a value set twice differently is refused.
    ClientPrefix("source.consumer.", Client.SOURCE, "MirrorMaker 2: the source consumer's settings (the source's)."),
    ClientPrefix("source.admin.", Client.SOURCE, "MirrorMaker 2: the source admin client's settings (the source's)."),
    ClientPrefix("target.consumer.", Client.DESTINATION, "MirrorMaker 2: the destination consumer's settings (the "
                 "destination's)."),
    ClientPrefix("target.admin.", Client.DESTINATION, "MirrorMaker 2: the destination admin client's settings (the "
                 "destination's)."),
    ClientPrefix("target.producer.", Client.PRODUCER, "MirrorMaker 2: the producer's settings, as `producer.*`."),
)  # fmt: skip

# Settings Kafka Connect / MM2 users commonly carry that change nothing here: accepted and ignored.
IGNORED_PROPERTIES = frozenset(
    {
        "config.action.reload",
        "replay.policy",
        "replay.window.records",
        "checkpoints.topic.replication.factor",
        "heartbeats.topic.replication.factor",
        "offset-syncs.topic.replication.factor",
    }
)
IGNORED_PREFIXES = (
    "key.converter",
    "value.converter",
    "header.converter",
    "errors.",
    "predicates",
    "refresh.topics.",
    "refresh.groups.",
    "offset-syncs.",
)

# The table's sections, as Kafka Connect's config groups: a field or row belongs to the last section starting at or
# before it among the fields or among the rows; the table lists the sections in this order.
_SECTION_STARTS = {
    "name": "Connector",
    "topics.whitelist": "Topic selection",
    "replication.policy.class": "Destination naming",
    "destination.bootstrap.servers": "Clients",
    "enable.partition.matching": "Replication",
    "topic.creation.enable": "Topic management",
    "groups": "Failover",
    "source.key.converter": "Converters",
}
# Kafka's ConfigDef importance: what every connector must decide. Every other property is MEDIUM.
HIGH_IMPORTANCE = frozenset(
    {"name", "connector.class", "tasks.max", "source.cluster.alias", "topics.whitelist", "topics.regex",
     "topics.regex.list", "topics", "topics.exclude", "destination.bootstrap.servers"}
)  # fmt: skip


def _sectioned(specs: tuple[PropertySpec, ...]) -> list[tuple[str, PropertySpec]]:
    out, section = [], ""
    for spec in specs:
        section = _SECTION_STARTS.get(spec.name, section)
        out.append((section, spec))
    return out


_SECTIONS = list(_SECTION_STARTS.values())
_TABLE = sorted(
    _sectioned(_FIELD_ROWS) + _sectioned(_PROPERTIES_WITHOUT_FIELD), key=lambda row: _SECTIONS.index(row[0])
)
PROPERTIES: tuple[PropertySpec, ...] = tuple(spec for _, spec in _TABLE)  # the one table: every property, once
GROUPS: dict[str, str] = {spec.name: section for section, spec in _TABLE}  # property name -> its section
SPECS: dict[str, PropertySpec] = {name: spec for spec in PROPERTIES for name in spec.names}
KNOWN_PROPERTIES = frozenset(SPECS)
FIELD_PROPERTIES: dict[str, str] = {spec.field: spec.name for spec in PROPERTIES if spec.field}


def client_setting(name: str) -> tuple[Client | None, str]:
    """Which client a property configures, and the librdkafka setting it names (`(None, name)` if none)."""
    spec = SPECS.get(name)
    if spec is not None:
        return (spec.client, spec.setting) if spec.client else (None, name)
    for prefix in CLIENT_PREFIXES:
        if name.startswith(prefix.prefix):
            return prefix.client, name.removeprefix(prefix.prefix)
    return None, name
