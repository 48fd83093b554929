"""One validated connector model that accepts Mirus and MirrorMaker 2 properties as users write them.

Users paste the flat JSON they would `PUT` to Kafka Connect for Mirus (`consumer.*`, `topics.whitelist`, …) or
configure MM2 with (`source.cluster.alias`, `topics`, `replication.policy.class`, …). Every property is declared
once in `replicator.configuration.properties`; it is either understood, deliberately ignored, or rejected, and every
problem is reported at once, each as `<property>: <reason>`, so that a config can be fixed in one round trip.

Two ways in:

- `validate_submission(props)` where a config enters the platform (the `put_connector` job, the CLI, the API):
  unknown names with "did you mean" hints, literal secrets refused, and client settings judged by librdkafka
  itself (throw-away clients that never connect), so a bad setting fails when submitted, not when a task starts.
- `load(props)` for a stored config (monitor, supervisor, tasks): references resolved, model built; no client
  is created and nothing is re-judged.

Values may contain Kafka Connect config provider references (`${env:NAME}`, `${file:/path.properties:key}`,
see `replicator.configuration.secrets`), resolved in every process that builds the model. The typed fields and client
dicts hold resolved values; `raw` holds the properties exactly as submitted and is what gets stored. Secrets (see
`replicator.configuration.masking`) and values that came from references never appear in `repr()` or in error messages.

(Over 500 lines on purpose: the model, its validators and the parser that fills it from the property table are one
piece — a property is read, checked and named in errors in one place.)
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from replicator.configuration.librdkafka_check import (
    CREATE_PREFIX,
    SETTING_NAME,
    librdkafka_problems,
    librdkafka_reason,
)
from replicator.configuration.masking import is_secret_property, literal_secrets, mask_properties, mask_settings, redact
from replicator.configuration.properties import (
    CLIENT_PREFIXES,
    DEFAULT_CONFIG_PROPERTIES_EXCLUDE,
    FIELD_PROPERTIES,
    IGNORED_PREFIXES,
    IGNORED_PROPERTIES,
    KNOWN_PROPERTIES,
    PROPERTIES,
    SPECS,
    Client,
)
from replicator.configuration.reader import is_scalar
from replicator.configuration.secrets import SecretReferenceError, has_reference, substitute_references
from replicator.configuration.topic_rules import TopicRules
from replicator.topics.naming import (
    TopicNamer,
)
from replicator.topics.selection import TopicSelector, compile_java_regex


class ConnectorConfigError(ValueError):
    """A config was rejected; `errors` lists every problem as (property name, reason)."""

    def __init__(self, errors: list[tuple[str, str]]) -> None:
        self.errors = list(errors)
        super().__init__(str(self))

    def __str__(self) -> str:
        return "\n".join(f"{name}: {reason}" for name, reason in self.errors)


_CLIENT_PREFIX_NAMES = tuple(p.prefix for p in CLIENT_PREFIXES)

# Java client settings librdkafka does not know that are meaningless when records are copied as bytes.
_DROPPED_JAVA_SETTINGS = frozenset(
    {"key.deserializer", "value.deserializer", "key.serializer", "value.serializer", "interceptor.classes"}
)
# librdkafka settings that would load native code or run a command on the platform's hosts when a client (or a
# config check) is created; a connector config submitted over an API must not be able to do that.
_BLOCKED_SETTINGS = {
    "plugin.library.paths": "loads a native library",
    "ssl.engine.location": "loads a native OpenSSL engine",
    "sasl.kerberos.kinit.cmd": "runs a shell command",
}
# confluent-kafka's Python-level hooks: they take Python objects, never values from a config.
_PYTHON_HOOKS = frozenset(
    {"logger", "error_cb", "throttle_cb", "stats_cb", "oauth_cb", "on_delivery", "on_commit", "default.topic.config"}
)
CONNECTION_SETTINGS = frozenset(
    {
        "bootstrap.servers",
        "security.protocol",
        "client.dns.lookup",
        "broker.address.family",
        "client.rack",
        "socket.timeout.ms",
        "socket.keepalive.enable",
        "reconnect.backoff.ms",
        "reconnect.backoff.max.ms",
    }
)
LITERAL_SECRET_REASON = (
    "give secrets as a reference (${env:NAME} or ${file:/path/file.properties:key}) so that they never enter "
    "Dagster's run history; then rotate the value typed here"
)


def transactional_id(connector: str, task_id: int) -> str:
    """The task's transactional.id in exactly-once mode: one per task, so a new instance fences the last."""
    return f"mirus-{connector}-{task_id}"


def split_list(value: str) -> tuple[str, ...]:
    """Kafka's LIST type: comma-separated, whitespace around entries ignored, empty entries dropped."""
    return tuple(part.strip() for part in value.split(",") if part.strip())


def connection_settings(client: Mapping[str, str]) -> dict[str, str]:
    """What any client of a cluster needs (address, network, `ssl.*`, `sasl.*`), without role-specific settings
    that another kind of client would reject or warn about (a consumer's `fetch.*` in a producer, say)."""
    return {k: v for k, v in client.items() if k in CONNECTION_SETTINGS or k.startswith(("ssl.", "sasl."))}


# --- the model -----------------------------------------------------------------------------------------------


def _row(name: str) -> dict[str, Any]:
    """A declared field's bounds and description, from its property's row (`replicator.configuration.properties`)."""
    spec = SPECS[name]
    return {"ge": spec.minimum, "le": spec.maximum, "description": spec.doc}


class ConnectorConfig(BaseModel):
    """A connector's validated configuration; build it with `validate_submission` or `load`.

    One field per `replicator.configuration.properties` row that has a `field` (e.g. `tasks_max`, `poll_timeout_ms`),
    plus `source_client` / `destination_client` / `producer_client` (librdkafka settings without their prefixes;
    `auto.offset.reset` of the source is `auto_offset_reset`), `selector`, `namer` and `raw`. Clients are created
    from `consumer_settings()`, `producer_settings(task_id)` and `admin_settings(cluster)`.
    """

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    # -- what several properties build together --
    source_client: dict[str, str] = Field(repr=False)
    destination_client: dict[str, str] = Field(repr=False)
    producer_client: dict[str, str] = Field(default_factory=dict, repr=False)
    selector: TopicSelector
    namer: TopicNamer = Field(default_factory=TopicNamer)
    # Mirus semantics of consumer.auto.offset.reset: `latest` (or `largest`) starts new partitions at the end.
    auto_offset_reset: Literal["earliest", "latest"] = "earliest"
    raw: dict[str, object] = Field(default_factory=dict, repr=False)

    # -- one field per property-table row with a `field`, in the table's order (a validator reads earlier fields):
    # the type follows the row's kind (None allowed where the row has no default), the default is the row's, bounds
    # and description come from the row; tests/configuration/test_config_model.py holds them to the table.
    name: str = Field(**_row("name"))
    connector_class: str | None = Field(None, **_row("connector.class"))
    tasks_max: int = Field(1, **_row("tasks.max"))
    source_alias: str = Field("source", **_row("source.cluster.alias"))
    target_alias: str = Field("target", **_row("target.cluster.alias"))
    partition_matching: bool | None = Field(None, **_row("enable.partition.matching"))
    destination_topic_checking: bool = Field(True, **_row("enable.destination.topic.checking"))
    poll_timeout_ms: int = Field(1000, **_row("poll.timeout.ms"))
    monitor_poll_wait_ms: int = Field(2000, **_row("monitor.poll.wait.ms"))
    commit_failure_restart_ms: int = Field(300000, **_row("commit.failure.restart.ms"))
    offset_commit_interval_ms: int = Field(1000, **_row("offset.flush.interval.ms"))
    resume_after_destination_copies: bool = Field(False, **_row("resume.after.destination.copies"))
    throttle_bytes_per_second: int = Field(0, **_row("replication.throttle.bytes.per.second"))
    throttle_records_per_second: int = Field(0, **_row("replication.throttle.records.per.second"))
    provenance_headers: bool = Field(True, **_row("provenance.headers.enabled"))
    exactly_once_support: str = Field("disabled", **_row("exactly.once.support"))
    heartbeat_interval_ms: int = Field(2000, **_row("task.heartbeat.interval.ms"))
    lease_timeout_ms: int = Field(30000, **_row("task.lease.timeout.ms"))
    topic_creation: bool = Field(True, **_row("topic.creation.enable"))
    replication_factor: int = Field(-1, **_row("replication.factor"))
    config_properties_exclude: str = Field(
        ", ".join(DEFAULT_CONFIG_PROPERTIES_EXCLUDE), **_row("config.properties.exclude")
    )
    sync_topic_configs: bool = Field(True, **_row("sync.topic.configs.enabled"))
    sync_topic_configs_interval_s: int = Field(60, **_row("sync.topic.configs.interval.seconds"))
    sync_topic_acls: bool = Field(True, **_row("sync.topic.acls.enabled"))
    sync_topic_acls_interval_s: int = Field(600, **_row("sync.topic.acls.interval.seconds"))
    groups: str = Field(".*", **_row("groups"))
    groups_exclude: str = Field("console-consumer-.*, connect-.*, __.*", **_row("groups.exclude"))
    emit_checkpoints: bool = Field(True, **_row("emit.checkpoints.enabled"))
    emit_checkpoints_interval_s: int = Field(60, **_row("emit.checkpoints.interval.seconds"))
    sync_group_offsets: bool = Field(False, **_row("sync.group.offsets.enabled"))
    sync_group_offsets_interval_s: int = Field(60, **_row("sync.group.offsets.interval.seconds"))
    emit_heartbeats: bool = Field(True, **_row("emit.heartbeats.enabled"))
    emit_heartbeats_interval_s: int = Field(1, **_row("emit.heartbeats.interval.seconds"))
    standby_runs: int = Field(1, **_row("task.standby.runs"))

    @field_validator("lease_timeout_ms")
    @classmethod
    def _lease_outlives_heartbeats(cls, lease: int, info: ValidationInfo) -> int:
        # A lease that could expire between two heartbeats of a healthy task would fence it for nothing. (The
        # heartbeat interval is in `info.data` because its field is declared first; absent if it failed.)
        heartbeat = info.data.get("heartbeat_interval_ms")
        if heartbeat is not None and lease <= 2 * heartbeat:
            raise ValueError(f"must be greater than 2 x task.heartbeat.interval.ms ({2 * heartbeat}), got {lease}")
        return lease

    @field_validator("config_properties_exclude", "groups", "groups_exclude")
    @classmethod
    def _java_regex_list(cls, value: str) -> str:
        for pattern in split_list(value):
            compile_java_regex(pattern)  # ValueError names the pattern and what is wrong
        return value

    # -- topic management and failover --

    @property
    def requires_destination_partition(self) -> bool:
        """Whether a source partition is replicated only into the destination partition with its number.

        True with `enable.partition.matching=true`, and by default while topic creation is on: the platform then
        creates and grows destination topics itself, so a missing partition is waited for (and the reason shown),
        never replaced by the partitioner (which would break partition preservation).
        """
        return (
            self.exactly_once
            or self.partition_matching is True
            or (self.partition_matching is None and self.topic_creation)
        )

    @property
    def exactly_once(self) -> bool:
        """`exactly.once.support` asks for exactly-once (`replicator.engine.transactions`)."""
        return self.exactly_once_support != "disabled"

    @property
    def checkpoint_interval_s(self) -> int:
        """How often group offsets are translated: the shorter of the checkpoint and group-sync intervals in use."""
        intervals = [self.emit_checkpoints_interval_s] if self.emit_checkpoints else []
        intervals += [self.sync_group_offsets_interval_s] if self.sync_group_offsets else []
        return min(intervals, default=self.emit_checkpoints_interval_s)

    # -- client settings: built here, once, for every client the platform creates --

    def consumer_settings(self, sized: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The task's source consumer: `assign()` only, offsets in Postgres, never in Kafka.

        `sized`: fetch sizes that follow the source topics' `max.message.bytes` (`replicator.engine.record_limits`);
        the connector's own `consumer.*` values win over them."""
        return {
            "enable.partition.eof": False,
            # Keep the fetch queue full (librdkafka's default backoff, once the queue is full, is a whole second,
            # which starves a consumer that empties it quickly) and fetch again soon after it drained.
            "queued.min.messages": 200000,
            "fetch.queue.backoff.ms": 20,
            "socket.nagle.disable": True,  # small fetch and produce requests leave at once, not after an ACK
            # The broker answers a fetch after at most 3 ms, with whatever arrived by then: a record waits at most
            # that long, and a steady trickle of small appends no longer costs a fetch each (at 5,000 records/s that
            # halved the task's CPU and with it the tail latency). A newly assigned partition joins the next fetch.
            # Partitions that go quiet move to a consumer fetching as MirrorMaker's does (`source_reader.py`), so an
            # idle task does not ask each source broker ~330 times a second.
            "fetch.wait.max.ms": 3,
            "fetch.min.bytes": 1_000_000,
            **(sized or {}),
            **self.source_client,
            "group.id": f"mirus-{self.name}",  # names our client; confluent-kafka insists on one
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": self.auto_offset_reset,
            **({"isolation.level": "read_committed"} if self.exactly_once else {}),
        }

    def producer_settings(self, task_id: int, sized: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The task's destination producer: defaults, destination connection settings, then `producer.*`.

        `sized`: `message.max.bytes` and `batch.size` that follow the destination topics' `max.message.bytes`
        (`replicator.engine.record_limits`); the connector's own `producer.*` values win over them."""
        settings = {
            # Idempotence keeps each partition's order across retries; acks=all means acknowledged = durable.
            "enable.idempotence": True,
            "acks": "all",
            # A record given up while later ones of its partition are written is a gap, and its retry lands
            # after them: out of order. So, as Kafka Connect does, never give a record up for time (a network
            # cut or a broker restart only delays), and stop the producer at any error that could leave a gap
            # (the task then replaces it and every partition resumes from its first unacknowledged record).
            "message.timeout.ms": 0,
            "enable.gapless.guarantee": True,
            # Never let a produce re-create a deleted destination topic with the broker's default layout.
            "allow.auto.create.topics": False,
            # 5 ms: at low rates a record waits at most that long for companions; at high rates batches fill first.
            "linger.ms": 5,
            "batch.size": 1024 * 1024,
            "batch.num.messages": 10000,
            # Room for ten consume batches; the task reads no more while a batch would not fit (its intake limit),
            # so a slow destination leaves the backlog in Kafka: at 1,000,000 a task catching up over 10,000
            # partitions held 490 MiB, at 100,000 under 300 MiB, in the same time.
            "queue.buffering.max.messages": 100_000,
            "socket.nagle.disable": True,
            "client.id": f"mirus-{self.name}-{task_id}",
            **(sized or {}),
            **connection_settings(self.destination_client),
            **self.producer_client,
        }
        if self.exactly_once:
            # A record that times out fails its transaction, which is aborted and written again: no gap can
            # become visible, so librdkafka's default (message.timeout.ms = transaction.timeout.ms) is right.
            settings["transactional.id"] = transactional_id(self.name, task_id)
            for name in ("message.timeout.ms", "enable.gapless.guarantee"):
                if name not in self.producer_client:
                    del settings[name]
        return settings

    @property
    def ordered_acks(self) -> bool:
        """Whether an acknowledgement stands for every earlier record of its destination partition, so one callback
        per run of records suffices: the producer is idempotent (acknowledges in order) and either nothing before
        an acknowledged record can be missing (gapless ordering, no delivery timeout) or a transaction commits only
        whole (exactly-once)."""
        settings = self.producer_settings(0)
        if str(settings.get("enable.idempotence")).lower() != "true":
            return False
        if self.exactly_once:
            return True
        gapless = str(settings.get("enable.gapless.guarantee")).lower() == "true"
        return gapless and str(settings.get("message.timeout.ms")) == "0"

    def admin_settings(self, cluster: Literal["source", "destination"]) -> dict[str, str]:
        """Metadata and admin calls on one of the connector's clusters."""
        return connection_settings(self.source_client if cluster == "source" else self.destination_client)

    def masked_properties(self) -> dict[str, object]:
        """The submitted properties with literal secret values masked (references shown)."""
        return mask_properties(self.raw)

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        # The client dicts hold resolved values: shown masked, secrets and anything from a reference alike.
        yield from super().__repr_args__()
        referenced = {name for name, value in self.raw.items() if has_reference(value)}
        for field, client in (
            ("source_client", Client.SOURCE),
            ("destination_client", Client.DESTINATION),
            ("producer_client", Client.PRODUCER),
        ):
            keys = {_client_setting(name)[1] for name in referenced if _client_setting(name)[0] == client}
            if client is Client.DESTINATION:  # producer.bootstrap.servers may stand in for the destination's
                keys |= {"bootstrap.servers"} & {_client_setting(n)[1] for n in referenced if n.startswith("producer.")}
            yield field, mask_settings(getattr(self, field), keys)


def validate_submission(props: Mapping[str, object], *, allow_literal_secrets: bool = False) -> ConnectorConfig:
    """The checks of a config entering the platform; raises `ConnectorConfigError` listing every problem.

    Literal secrets are refused unless `allow_literal_secrets` (callers that never store or show the config).
    """
    literal = [] if allow_literal_secrets or not isinstance(props, Mapping) else literal_secrets(props)
    refused = [(name, LITERAL_SECRET_REASON) for name in literal]
    try:
        config = _Parser(props, submission=True).parse()
    except ConnectorConfigError as exc:
        raise ConnectorConfigError(refused + exc.errors) from None
    if refused:
        raise ConnectorConfigError(refused)
    return config


def load(props: Mapping[str, object], *, resolve_references: bool = True) -> ConnectorConfig:
    """The model of a stored (already submitted) config: references resolved, no client created.

    `resolve_references=False` leaves references as written, for views that never build a client (the REST API's
    status, metrics): such a process needs no secret and may not have access to them.
    """
    return _Parser(props, submission=False, resolve_references=resolve_references).parse()


# --- parsing -------------------------------------------------------------------------------------------------


_MAX_VALUE_LENGTH = 100_000  # client settings and transforms (a CA bundle in ssl.ca.pem can be long)
# `org.apache.kafka.common.security.scram.ScramLoginModule required username="u" password="p";`
_JAAS_OPTION_TEXT = r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"'  # name="value", with \" and \\ escapes
_JAAS_LOGIN = re.compile(
    r"org\.apache\.kafka\.common\.security\.(scram\.ScramLoginModule|plain\.PlainLoginModule)\s+required"
    rf"((?:\s+{_JAAS_OPTION_TEXT})*)\s*;"
)
_JAAS_OPTION = re.compile(_JAAS_OPTION_TEXT)
_OFFSET_RESETS = frozenset({"earliest", "smallest", "beginning", "latest", "largest", "end"})
_PORT = r"(?:[1-9]\d{0,3}|[1-5]\d{4}|6[0-4]\d{3}|65[0-4]\d{2}|655[0-2]\d|6553[0-5])"
_BOOTSTRAP_ENTRY = re.compile(
    rf"(?:[A-Za-z_]+://)?(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{{0,252}}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]):{_PORT}"
)


def _client_setting(name: str) -> tuple[Client | None, str]:
    """Which client a property configures, and the librdkafka setting it names (`(None, name)` if none)."""
    spec = SPECS.get(name)
    if spec is not None:
        return (spec.client, spec.setting) if spec.client else (None, name)
    for prefix in CLIENT_PREFIXES:
        if name.startswith(prefix.prefix):
            return prefix.client, name.removeprefix(prefix.prefix)
    return None, name


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        return "an object"
    return "a list" if isinstance(value, list | tuple) else type(value).__name__


def _suggest(name: str) -> str:
    """A "did you mean" hint for an unknown property, also when the typo is in a client prefix."""
    candidates = set(KNOWN_PROPERTIES) | IGNORED_PROPERTIES
    parts = name.split(".")
    for prefix in _CLIENT_PREFIX_NAMES:
        depth = prefix.count(".")
        if len(parts) > depth:
            candidates.add(prefix + ".".join(parts[depth:]))
    close = difflib.get_close_matches(name, sorted(candidates), n=1, cutoff=0.75)
    return f"; did you mean {close[0]!r}?" if close else ""


class _ClientSettings:
    """One client's librdkafka settings being assembled, remembering which property set each one."""

    def __init__(self, role: str) -> None:
        self.role = role
        self.settings: dict[str, str] = {}
        self.origin: dict[str, str] = {}


class _Parser(TopicRules):
    """Reads a property mapping into a `ConnectorConfig`, collecting every problem instead of stopping early."""

    def __init__(self, props: Mapping[str, object], *, submission: bool, resolve_references: bool = True) -> None:
        super().__init__(props)
        self.submitted = props
        self.submission = submission
        self.resolve_references = resolve_references
        self.substituted: set[str] = set()

    # -- the whole config --

    def parse(self) -> ConnectorConfig:
        if not isinstance(self.props, Mapping):
            raise ConnectorConfigError(
                [("config", f"must be a JSON object of properties, got {_json_type(self.props)}")]
            )
        self.check_names_and_types()
        self.props = self.resolve()
        fields: dict[str, Any] = {"raw": dict(self.submitted)}
        for spec in PROPERTIES:
            if spec.part is None and spec.client is None:
                value = self.read(spec)
                if value is not None and spec.field:
                    fields[spec.field] = value
        fields.update(self.clients())
        if fields.get("exactly_once_support", "disabled") != "disabled":
            self.check_exactly_once(fields)
        if fields.get("resume_after_destination_copies") and fields.get("provenance_headers") is False:
            self.fail(
                "provenance.headers.enabled",
                "must stay true with resume.after.destination.copies=true: each partition resumes after its "
                "last copy at the destination, found by these headers",
            )
        fields["selector"] = self.selector()
        fields["namer"] = self.namer(fields.get("source_alias", "source"), fields.get("target_alias", "target"))
        if fields["selector"] is not None and fields["namer"] is not None:
            self.check_destination_names(fields["selector"], fields["namer"])
        if not self.errors:
            try:
                config = ConnectorConfig(**fields)
            except ValidationError as err:  # a rule across properties (or one the readers missed)
                for problem in err.errors(include_input=False, include_url=False):
                    field = str(problem["loc"][0]) if problem["loc"] else "config"
                    self.fail(FIELD_PROPERTIES.get(field, field), str(problem["msg"]).removeprefix("Value error, "))
            else:
                if config.resume_after_destination_copies and not config.ordered_acks:
                    self.fail(
                        "resume.after.destination.copies",
                        "needs a producer whose acknowledgement stands for every earlier record (producer."
                        "enable.idempotence and producer.enable.gapless.guarantee true, no producer.message.timeout."
                        "ms: the defaults): otherwise a copy at the destination does not mean the records before it "
                        "are there",
                    )
                else:
                    return config
        raise ConnectorConfigError(self.sanitized_errors())

    def resolve(self) -> dict[str, object]:
        """The properties with references resolved; a reference that cannot be resolved is a problem."""
        resolved: dict[str, object] = {}
        for name, value in self.submitted.items():
            if isinstance(name, str) and isinstance(value, str) and has_reference(value):
                self.referenced[name] = value
                if not self.resolve_references:
                    self.unresolved.add(name)  # kept as written, and never complained about
                    resolved[name] = value
                    continue
                if not is_secret_property(name) and _client_setting(name)[0] is None:
                    # Not even resolved: the connector's own properties become topic names, counts and behaviour
                    # that the platform shows, so a reference would display whatever it points to. (Client
                    # settings may hold references: their resolved values are masked wherever shown.)
                    self.fail(
                        name,
                        "${...} references are only accepted in secret properties and client settings "
                        "(consumer.*, producer.*, ...): this property's value is shown",
                    )
                    self.unresolved.add(name)
                    resolved[name] = value
                    continue
                try:
                    value, substituted = substitute_references(value)
                except SecretReferenceError as err:
                    self.fail(name, str(err))
                    self.unresolved.add(name)
                else:
                    self.substituted.update(substituted)
            resolved[name] = value
        return resolved

    def sanitized_errors(self) -> list[tuple[str, str]]:
        """Errors with any secret or resolved value that slipped into a message (e.g. echoed by librdkafka) masked.

        A reference that could not be resolved is not masked: naming it is the point of its error.
        """
        hidden = {
            str(v)
            for k, v in self.props.items()
            if (is_secret_property(str(k)) or k in self.referenced) and k not in self.unresolved
        } | self.substituted
        return [(name, redact(reason, hidden)) for name, reason in self.errors]

    def check_names_and_types(self) -> None:
        for name, value in self.props.items():
            if not isinstance(name, str):
                self.fail(str(name), "property names must be strings")
                continue
            if not is_scalar(value):
                self.fail(name, f"must be a string, number or boolean, got {_json_type(value)}")
            spec = SPECS.get(name)
            if spec is not None and spec.is_text and is_scalar(value) and not isinstance(value, str):
                self.fail(name, f"must be a string, got {self.shown(name, value)}")
            if isinstance(value, str) and len(value) > (spec.max_length if spec else _MAX_VALUE_LENGTH):
                limit = spec.max_length if spec else _MAX_VALUE_LENGTH
                self.fail(name, f"must be at most {limit:,} characters, got {len(value):,}")
                self.unresolved.add(name)  # nothing else is said about a value this long
            if name in KNOWN_PROPERTIES or name in IGNORED_PROPERTIES or name.startswith(IGNORED_PREFIXES):
                continue
            if name.startswith((*_CLIENT_PREFIX_NAMES, "transforms.")):
                continue  # checked where the client settings and transforms are read
            self.fail(name, f"unknown property{_suggest(name)}" if self.submission else "unknown property")

    # -- clients --

    def clients(self) -> dict[str, Any]:
        clients = {client: _ClientSettings(client.name.lower()) for client in Client}
        source, destination, producer = clients[Client.SOURCE], clients[Client.DESTINATION], clients[Client.PRODUCER]
        offset_reset: tuple[str, str] | None = None
        for name in self.props:
            if not isinstance(name, str) or name in ("source.cluster.alias", "target.cluster.alias"):
                continue
            client, key = _client_setting(name)
            if client is None:
                continue
            if client is Client.SOURCE and key == "auto.offset.reset":
                # Interpreted by us (Mirus semantics), not handed to librdkafka.
                value = (self.stripped(name) or "").lower()
                if value not in _OFFSET_RESETS:
                    self.fail(
                        name,
                        f"must be earliest or latest (or smallest, beginning, largest, end), "
                        f"got {self.shown(name, self.stripped(name) or '')}",
                    )
                elif offset_reset is None or name.startswith("consumer."):
                    offset_reset = (name, value)
                continue
            self.add_setting(clients[client], name, key)

        if not source.settings.get("bootstrap.servers", "").strip():
            self.fail(
                source.origin.get("bootstrap.servers", "consumer.bootstrap.servers"),
                "required: the SOURCE cluster's bootstrap servers (Mirus consumer.bootstrap.servers or MM2 "
                "source.cluster.bootstrap.servers)",
            )
        if "bootstrap.servers" not in destination.settings and "bootstrap.servers" in producer.settings:
            destination.settings["bootstrap.servers"] = producer.settings["bootstrap.servers"]
            destination.origin["bootstrap.servers"] = producer.origin["bootstrap.servers"]
        if not destination.settings.get("bootstrap.servers", "").strip():
            self.fail(
                destination.origin.get("bootstrap.servers", "destination.consumer.bootstrap.servers"),
                "required: the DESTINATION cluster's bootstrap servers (Mirus destination.consumer.bootstrap.servers "
                "or MM2 target.cluster.bootstrap.servers)",
            )

        if self.submission:
            self.check_with_librdkafka("consumer", source, "consumer.")
            self.check_with_librdkafka("admin", destination, "destination.consumer.")
            # The producer the task builds: destination settings overlaid with producer.*. Problems that the
            # destination check already reported are not repeated under producer.* names.
            merged = _ClientSettings("producer")
            merged.settings = {**destination.settings, **producer.settings}
            merged.origin = {**destination.origin, **producer.origin}
            self.check_with_librdkafka("producer", merged, "producer.")

        out: dict[str, Any] = {
            "source_client": source.settings,
            "destination_client": destination.settings,
            "producer_client": producer.settings,
        }
        self.client_origins = {client: c.origin for client, c in clients.items()}
        if offset_reset is not None:
            out["auto_offset_reset"] = "latest" if offset_reset[1].lower() in ("latest", "largest") else "earliest"
        return out

    def check_exactly_once(self, fields: Mapping[str, Any]) -> None:
        """Refuse what would contradict exactly-once, naming the property that does."""
        mode = f"exactly.once.support={self.stripped('exactly.once.support')}"
        if fields.get("provenance_headers") is False:
            self.fail(
                "provenance.headers.enabled",
                f"must stay true with {mode}: each partition resumes after its "
                "last copy at the destination, found by these headers",
            )
        if fields.get("partition_matching") is False:
            self.fail(
                "enable.partition.matching",
                f"must not be false with {mode}: a partition's copies are found "
                "in the destination partition with its number",
            )
        # (client, setting, accepted values (empty: none), why)
        rules = (
            (Client.PRODUCER, "transactional.id", (), "is set by the platform (one per task, mirus-<connector>-"
             "<task>, so that a new instance fences older ones); remove it"),
            (Client.PRODUCER, "enable.idempotence", ("true",), "must be true: transactions need the idempotent "
             "producer"),
            (Client.PRODUCER, "acks", ("all", "-1"), "must be all (or -1): transactions need it"),
            (Client.SOURCE, "isolation.level", ("read_committed",), "must be read_committed: records of aborted "
             "source transactions must not be copied"),
        )  # fmt: skip
        for client, key, accepted, why in rules:
            name = self.client_origins[client].get(key)
            value = self.text(name) if name else None
            if name and value is not None and value.strip().lower() not in accepted:
                self.fail(name, f"{why} ({mode})")

    def add_setting(self, client: _ClientSettings, name: str, key: str) -> None:
        value = self.text(name)
        if value is None:
            return  # wrong JSON type, already reported
        if not key:
            self.fail(name, "a client setting name must follow the prefix")
            return
        if key == "sasl.jaas.config":
            self.add_jaas_login(client, name, value)
            return
        if key in _DROPPED_JAVA_SETTINGS or (
            key == "partition.assignment.strategy" and any("." in part for part in value.split(","))
        ):
            return  # Java-only and harmless for byte-for-byte copying
        if key in _BLOCKED_SETTINGS:
            self.fail(name, f"not accepted in connector configs: it {_BLOCKED_SETTINGS[key]} on the platform's hosts")
            return
        if key in _PYTHON_HOOKS:
            self.fail(name, f"{key!r} is a confluent-kafka Python hook, not a client setting")
            return
        if key == "bootstrap.servers" and not self.check_bootstrap_servers(name, value):
            return
        if key in client.settings and client.settings[key] != value:
            self.fail(
                name,
                f"conflicts with {client.origin[key]}: both set the {client.role} client's {key!r}; set only one",
            )
            return
        client.settings[key] = value
        client.origin.setdefault(key, name)

    def add_jaas_login(self, client: _ClientSettings, name: str, value: str) -> None:
        """A Java client's `sasl.jaas.config` (as MirrorMaker 2 users write it), which librdkafka does not read: the
        SCRAM or PLAIN login module's user name and password become `sasl.username` and `sasl.password`."""
        login = _JAAS_LOGIN.fullmatch(value.strip())
        options = dict(_JAAS_OPTION.findall(login.group(2))) if login else {}
        if not login or not {"username", "password"} <= options.keys():
            self.fail(
                name,
                "only a ScramLoginModule or PlainLoginModule with username and password is understood (librdkafka has "
                "no JAAS); give sasl.username and sasl.password instead",
            )
            return
        for setting in ("username", "password"):
            current = client.settings.get(f"sasl.{setting}")
            wanted = options[setting].replace('\\"', '"').replace("\\\\", "\\")
            if current is not None and current != wanted:
                self.fail(name, f"conflicts with {client.origin[f'sasl.{setting}']}: both set the {setting}")
                return
            client.settings[f"sasl.{setting}"] = wanted
            client.origin.setdefault(f"sasl.{setting}", name)

    def check_bootstrap_servers(self, name: str, value: str) -> bool:
        """`host:port` entries (an optional `PROTOCOL://` before each), as librdkafka and Kafka take them."""
        if not value.strip():
            return True  # reported as missing where the clients are checked
        if "@" in value:
            # user:password@host: credentials in a URL. The value is never repeated (it holds a password).
            self.fail(
                name,
                "must not contain credentials (user:password@host): give sasl.username and a "
                "sasl.password reference instead",
            )
            self.unresolved.add(name)
            return False
        bad = [entry for entry in value.split(",") if not _BOOTSTRAP_ENTRY.fullmatch(entry.strip())]
        if bad:
            self.fail(
                name, f"must be a comma-separated list of host:port (port 1-65535), got {self.shown(name, value)}"
            )
            return False
        return True

    def check_with_librdkafka(self, kind: str, client: _ClientSettings, prefix: str) -> None:
        """Let librdkafka judge every setting (names, values, combinations) and map its complaints to properties.

        `bootstrap.servers` is left out so that nothing tries to connect. A complaint about settings that are
        missing (e.g. "sasl.username and sasl.password must be set") is reported under `prefix` + the first
        setting it names.
        """
        reported = {reason for _, reason in self.errors}
        for key, message in librdkafka_problems(kind, client.settings):
            if key is not None:
                name = client.origin.get(key, prefix + key)
            else:
                mentioned = SETTING_NAME.search(CREATE_PREFIX.sub("", message))
                name = prefix + (mentioned.group(0) if mentioned else "*")
            value = client.settings.get(key, "") if key is not None else ""
            reason = librdkafka_reason(message, key, value, secret=self.hidden(name))
            if reason not in reported:
                self.fail(name, reason)
