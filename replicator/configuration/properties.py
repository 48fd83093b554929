"""Every connector property, declared once (as MirrorMaker 2's `ConfigDef.define` does).

`PROPERTIES` is the one table: name, aliases, type, default, bounds, doc, secret or not, and what reads it. From
it come the bounds and descriptions of the `ConnectorConfig` model's simple fields (`replicator.configuration.model`
declares each, typed, so that type checkers and editors see them; tests/configuration/test_config_model.py holds the
declarations to the table), the list of known properties, the bounds in error messages, "did you mean" hints and
the reference page docs/CONNECTOR-PROPERTIES.md.

Adding a property is one row (and, for a row with a `field`, that field declared on the model with the row's type
and default). A row with a `field` is read, checked and set on the model by the generic reader; a row with a `part`
instead is read by that part's own code in `replicator.configuration.topic_rules` (selection, naming), which needs
several properties at once. `CLIENT_PREFIXES` declares the prefixes that carry librdkafka settings.

Regenerate the docs page after changing the table: `python -m replicator.configuration.properties >
docs/CONNECTOR-PROPERTIES.md` (a test fails while it is stale).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from replicator.configuration.masking import is_secret_property


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
    """One connector property.

    `field`: the `ConnectorConfig` attribute the generic reader sets from it (None for rows read by a `part`, or
    checked only). `client` / `setting`: the property is that librdkafka setting of that client. `choices` /
    `pattern` restrict a STRING, described to users by `expected`. `required`: an absent or empty value is an
    error. Which values are secret is the masking rule's to say (`replicator.configuration.masking`).
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


_S, _I, _B, _L = Kind.STRING, Kind.INT, Kind.BOOLEAN, Kind.LIST
_NAME_CHARS = "letters, digits, '.', '_' or '-'"

PROPERTIES: tuple[PropertySpec, ...] = (
    # -- the connector --
    PropertySpec("name", _S, "The connector's name.", field="name", required=True, pattern=r"[A-Za-z0-9._-]{1,200}",
                 expected=f"1-200 {_NAME_CHARS}"),
    PropertySpec("connector.class", _S, "Mirus's or MirrorMaker 2's source connector class (or its short name); "
                 "both mean the same here.", field="connector_class",
                 choices=frozenset({MIRUS_CONNECTOR_CLASS, MM2_CONNECTOR_CLASS, "MirusSourceConnector",
                                    "MirrorSourceConnector"}),
                 expected=f"{MIRUS_CONNECTOR_CLASS} or {MM2_CONNECTOR_CLASS} (or their short names)"),
    PropertySpec("tasks.max", _I, "How many tasks (one Dagster run each) share the connector's partitions. At "
                 f"most {MAX_TASKS}: each task is a process with its own clients and Postgres connections, and a "
                 "task holds thousands of partitions.", default=1, field="tasks_max", minimum=1, maximum=MAX_TASKS),
    PropertySpec("source.cluster.alias", _S, "The source cluster's name: the prefix of remote topic names under "
                 "MM2 naming, and the origin written in provenance headers.", default="source", field="source_alias"),
    PropertySpec("target.cluster.alias", _S, "The destination cluster's name: records that originated there are "
                 "never copied back (cycle guard).", default="target", field="target_alias"),
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
    # -- engine behaviour --
    PropertySpec("enable.partition.matching", _B, "true: each record goes to the destination partition with its "
                 "source partition's number, which must exist (Mirus). false: the producer's partitioner chooses. "
                 "Unset: the same number when the destination has it, else the partitioner.",
                 field="partition_matching"),
    PropertySpec("enable.destination.topic.checking", _B, "Replicate a partition only once its destination topic "
                 "exists.", default=True, field="destination_topic_checking"),
    PropertySpec("poll.timeout.ms", _I, "Longest wait of one source poll. A task never blocks longer than 1 s "
                 "whatever is set, so that stops and reassignments are noticed.", default=1000,
                 field="poll_timeout_ms", minimum=1, maximum=60000),
    PropertySpec("monitor.poll.wait.ms", _I, "How often the monitor runs its periodic duties for the connector "
                 "(topic config sync, checkpoints, heartbeats, a full re-plan). New topics and partitions are seen "
                 "sooner: the metadata watcher reads every cluster twice a second for all connectors together.",
                 default=2000, field="monitor_poll_wait_ms", minimum=100),
    PropertySpec("commit.failure.restart.ms", _I, "A task that replicates records but cannot commit offsets for "
                 "this long fails, and the supervisor restarts it.", default=300000,
                 field="commit_failure_restart_ms", minimum=1000),
    PropertySpec("offset.flush.interval.ms", _I, "How often a task commits replicated offsets to Postgres (and, "
                 "in exactly-once mode, its destination transaction first).",
                 default=1000, field="offset_commit_interval_ms", minimum=100),
    PropertySpec("resume.after.destination.copies", _B, "At least once: when a task starts (after a crash, a "
                 "kill, a takeover), read each partition's copies written at the destination since its last commit "
                 "and resume after the last one, so a crash re-sends nothing instead of the records read since the "
                 "last commit. A start reads those copies either way (one ListOffsets request per destination broker "
                 "first: a partition with nothing past its commit is not read); false counts them as re-sent "
                 "(mirus_records_resent_total) and writes them again. Needs provenance.headers.enabled and the "
                 "default producer ordering. Exactly-once always resumes so.", default=False,
                 field="resume_after_destination_copies"),
    PropertySpec("replication.throttle.bytes.per.second", _I, "The most the connector replicates a second, in "
                 "key + value bytes (as the metrics count them), shared evenly by its tasks; over it the tasks stop "
                 "reading until the budget allows (nothing is dropped: the backlog waits in the source). A change "
                 "applies within a second, without new clients. 0: no limit.", default=0,
                 field="throttle_bytes_per_second", minimum=0),
    PropertySpec("replication.throttle.records.per.second", _I, "The most records the connector replicates a "
                 "second, shared evenly by its tasks; as replication.throttle.bytes.per.second (both may be set). "
                 "0: no limit.", default=0, field="throttle_records_per_second", minimum=0),
    PropertySpec("provenance.headers.enabled", _B, "Add `mirus.origin` and `mirus.source` headers to every copy: "
                 "cycle prevention, exact resume and offset translation; required by exactly-once.", default=True,
                 field="provenance_headers"),
    PropertySpec("exactly.once.support", _S, "MirrorMaker 2's name. `required` or `requested`: exactly-once "
                 "(each task writes through a transactional producer, commits a destination transaction every "
                 "offset.flush.interval.ms, and resumes each partition after its last committed record at the "
                 "destination; consumers of the destination must read with isolation.level=read_committed). Both "
                 "mean the same here: MM2 distinguishes them only by a pre-flight check of the connector plug-in. A "
                 "destination without transactions fails the task with the broker's error. `disabled`: "
                 "at-least-once.", default="disabled", field="exactly_once_support",
                 choices=frozenset({"disabled", "requested", "required"}), expected="disabled, requested or required"),
    PropertySpec("task.heartbeat.interval.ms", _I, "How often a task proves it is alive: every offset commit "
                 "heartbeats its lease, and when commits are further apart (offset.flush.interval.ms) a heartbeat "
                 "alone is written this often.", default=2000,
                 field="heartbeat_interval_ms", minimum=100),
    PropertySpec("task.lease.timeout.ms", _I, "A task silent this long is replaced and its partitions may be "
                 "taken over; must be greater than 2 x task.heartbeat.interval.ms.", default=30000,
                 field="lease_timeout_ms", minimum=1),
    # -- topic management (replicator.discovery.topic_sync) --
    PropertySpec("topic.creation.enable", _B, "Create missing destination topics with the source's partition "
                 "count and topic configs, and add partitions when the source gains some (before their records are "
                 "written). While on, a source partition is only ever written to the destination partition with "
                 "its number.", default=True, field="topic_creation"),
    PropertySpec("replication.factor", _I, "MirrorMaker 2: replicas of created destination topics; -1 (or 0): "
                 "the source topic's, capped by the destination's broker count.", default=-1,
                 field="replication_factor", minimum=-1),
    PropertySpec("config.properties.exclude", _L, "MirrorMaker 2: Java regular expressions of topic configs "
                 "never copied to the destination (its DefaultConfigPropertyFilter list by default).",
                 default=", ".join(DEFAULT_CONFIG_PROPERTIES_EXCLUDE), field="config_properties_exclude"),
    PropertySpec("sync.topic.configs.enabled", _B, "MirrorMaker 2: copy changed topic configs to the destination "
                 "topics periodically.", default=True, field="sync_topic_configs"),
    PropertySpec("sync.topic.configs.interval.seconds", _I, "MirrorMaker 2: how often topic configs are "
                 "compared and copied.", default=60, field="sync_topic_configs_interval_s", minimum=1),
    PropertySpec("sync.topic.acls.enabled", _B, "MirrorMaker 2: create the source's topic ACLs on the destination "
                 "topics (ALLOW WRITE left out, ALLOW ALL as ALLOW READ, literal names only; never removed). "
                 "docs/SECURITY.md lists the ACLs this needs.", default=True, field="sync_topic_acls"),
    PropertySpec("sync.topic.acls.interval.seconds", _I, "MirrorMaker 2: how often topic ACLs are synced.",
                 default=600, field="sync_topic_acls_interval_s", minimum=1),
    # -- failover (replicator.discovery.offset_translation, replicator.discovery.heartbeats) --
    PropertySpec("groups", _L, "MirrorMaker 2: Java regular expressions of the source consumer groups whose "
                 "offsets are translated (checkpoints, offset sync).", default=".*", field="groups"),
    PropertySpec("groups.exclude", _L, "MirrorMaker 2: Java regular expressions of consumer groups never "
                 "translated.", default="console-consumer-.*, connect-.*, __.*", field="groups_exclude"),
    PropertySpec("emit.checkpoints.enabled", _B, "MirrorMaker 2: translate the selected groups' committed "
                 "offsets exactly and keep them as checkpoints in Postgres (for `mirus offsets translate` when "
                 "the source is lost).", default=True, field="emit_checkpoints"),
    PropertySpec("emit.checkpoints.interval.seconds", _I, "MirrorMaker 2: how often checkpoints are taken.",
                 default=60, field="emit_checkpoints_interval_s", minimum=1),
    PropertySpec("sync.group.offsets.enabled", _B, "MirrorMaker 2: also commit the translated offsets into the "
                 "destination groups of the same name, only while they have no active members and only forward.",
                 default=False, field="sync_group_offsets"),
    PropertySpec("sync.group.offsets.interval.seconds", _I, "MirrorMaker 2: how often group offsets are synced.",
                 default=60, field="sync_group_offsets_interval_s", minimum=1),
    PropertySpec("emit.heartbeats.enabled", _B, "MirrorMaker 2: write heartbeats into the source's `heartbeats` "
                 "topic, which the connector replicates; their age at the destination is the flow's liveness.",
                 default=True, field="emit_heartbeats"),
    PropertySpec("emit.heartbeats.interval.seconds", _I, "MirrorMaker 2: the least time between two heartbeats "
                 "(they are written by the monitor, at its pace).", default=1, field="emit_heartbeats_interval_s",
                 minimum=1),
    PropertySpec("task.standby.runs", _I, "Warm standby runs per task. A standby waits on the owner's lease and "
                 "takes the task over the moment the owner's process dies (well under a second, instead of a new "
                 "run's start); each costs one more run process and one Postgres connection. 0: a crashed task "
                 "waits for the supervisor to start a new run.", default=1, field="standby_runs", minimum=0,
                 maximum=3),
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

# The table's sections, as Kafka Connect's config groups: a row belongs to the last section starting at or before it.
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


def _sections() -> dict[str, str]:
    out, section = {}, ""
    for spec in PROPERTIES:
        section = _SECTION_STARTS.get(spec.name, section)
        out[spec.name] = section
    return out


GROUPS: dict[str, str] = _sections()  # property name -> its section
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


def _default(spec: PropertySpec) -> str:
    if spec.default is None:
        return "required" if spec.required else "unset"
    return f"`{str(spec.default).lower() if isinstance(spec.default, bool) else spec.default}`"


def _values(spec: PropertySpec) -> str:
    if spec.kind is Kind.INT:
        return spec.bounds()
    return spec.expected or ("true or false" if spec.kind is Kind.BOOLEAN else "")


def properties_markdown() -> str:
    """The reference page of every property, generated from the table (docs/CONNECTOR-PROPERTIES.md)."""
    lines = [
        "# Connector properties",
        "",
        "Generated from `replicator/configuration/properties.py` by `python -m replicator.configuration.properties > "
        "docs/CONNECTOR-PROPERTIES.md`; do not edit by hand.",
        "",
        "A connector is a flat JSON object of these properties, written as for Mirus or MirrorMaker 2. Values may "
        "be strings, numbers or booleans, and may contain `${env:NAME}` or `${file:/path:key}` references. Any "
        'other name is rejected (with a "did you mean" hint), except the ignored ones listed at the end.',
        "",
        "| property | type | default | values | secret | description |",
        "|---|---|---|---|---|---|",
    ]
    for spec in PROPERTIES:
        name = " / ".join(f"`{n}`" for n in spec.names)
        reader = spec.part or spec.client
        doc = spec.doc + (f" ({reader.value})" if reader else "")
        lines.append(
            f"| {name} | {spec.kind.value} | {_default(spec)} | {_values(spec)} | "
            f"{'yes' if is_secret_property(spec.name) else 'no'} | {doc} |"
        )
    lines += [
        "",
        "## Client settings",
        "",
        "librdkafka settings (https://github.com/confluentinc/librdkafka/blob/master/CONFIGURATION.md) after a "
        "prefix; they are checked by librdkafka when the connector is submitted. Values of settings whose name "
        "contains `password`, `secret`, `jaas.config`, `.pem`, `token` or `credentials`, or ends in `.key`, are "
        "secret: never shown, and refused in clear by the `put_connector` job (give a reference instead).",
        "",
        "`consumer.auto.offset.reset` (also `source.consumer.` / `source.cluster.` spellings) says where a partition "
        "without a stored offset starts, as in MirrorMaker 2: `earliest` (or `smallest`, `beginning`; the default) at "
        "its beginning, `latest` (or `largest`, `end`) at its end as its task starts it — the partitions of a new "
        "connector, and those of a topic matched later (a new topic, or a selection that grew): what they held "
        "before is not copied. Where a partition started is stored at the task's next commit, so a restart before "
        "its first record does not skip what was written meanwhile. A partition added to a topic the connector "
        "already replicates starts at its beginning whatever the policy: everything in it was written while the "
        "topic was being replicated, and at its end it would lose what was written between the partition's "
        "creation and the moment its task started it (MirrorMaker 2 starts it at its end; its users report exactly "
        "that loss). Such a partition is one that joined the connector's assignment after other partitions of its "
        "topic had (by the assignment generations kept); the task's events name it.",
        "",
        "Record sizes follow the topics: a task reads the `max.message.bytes` of the topics it serves (the broker's "
        "`message.max.bytes` where a topic sets none) with DescribeConfigs — one request per cluster, at its start, "
        "when its topics change, before a partition paused for a record's size is retried, and every minute — and "
        "makes its producer's `message.max.bytes` the largest destination limit and its `batch.size` at most the "
        "smallest (1 MiB by default), and its consumers' `max.partition.fetch.bytes`, `fetch.max.bytes` and "
        "`receive.message.max.bytes` large enough for a batch of the largest source limit (never below "
        "librdkafka's own). Records of any size both topics take are copied. A record larger than its destination "
        "topic takes pauses its partition alone, with a reason that names the limit, both sizes and what to change "
        '(`mirus_partitions_paused{cause="record_too_large"}`); raising the limit lets it through at the '
        "partition's next retry (within a minute), without a restart. The connector's own `producer.*` or "
        "`consumer.*` value of any of these settings wins, and its own `producer.message.max.bytes` turns the "
        "task's check of each record off: the destination broker then refuses what its topic does not take. "
        "Without DescribeConfigs on a topic (docs/SECURITY.md) its limit is unknown and librdkafka's defaults apply.",
        "",
        "The source consumer's fetches are answered within 3 ms by default (`fetch.wait.max.ms=3` with "
        "`fetch.min.bytes=1000000`): a record waits at most that long at any rate, and steady traffic costs at most "
        "~330 fetches a second per source broker and task instead of one per append. Partitions without a record "
        "for 5 s move to consumers that fetch as MirrorMaker's does (`fetch.wait.max.ms=500` with "
        "`fetch.min.bytes=1`: answered at the first byte, two fetches a second when idle), after a further minute "
        "to consumers waiting up to 5 s (one fetch every 5 s when idle, still answered at the first byte), so an "
        "idle task costs its source broker less than MirrorMaker 1.0's consumer does. A task starts its partitions "
        "in the quiet consumers; a partition moves to the eager ones once it has a backlog or its records come less "
        "than 5 s apart. Each consumer holds at most 2,000 partitions (librdkafka's cost per consumer grows faster "
        'than its partitions; benchmarks/README.md, "Holding thousands of partitions") and prefetches at most 16 MB '
        "unless `consumer.queued.max.messages.kbytes` says otherwise. `consumer.*` settings apply to all; the quiet "
        "ones keep their two. The producer queues at most 100,000 records by default "
        "(`producer.queue.buffering.max.messages`); the task reads no more while a batch (10,000) would not fit, so "
        "a destination slower than the source leaves the backlog in Kafka.",
        "",
        "| prefix | client | description |",
        "|---|---|---|",
        *(f"| `{p.prefix}*` | {p.client.value} | {p.doc} |" for p in CLIENT_PREFIXES),
        "",
        "## Accepted and ignored",
        "",
        "They change nothing here: " + ", ".join(f"`{n}`" for n in sorted(IGNORED_PROPERTIES)) + ", and every name "
        "starting with " + ", ".join(f"`{p}`" for p in IGNORED_PREFIXES) + ".",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(properties_markdown(), end="")
