"""One validated connector model that accepts Mirus and MirrorMaker 2 properties as users write them.

Users paste the flat JSON they would `PUT` to Kafka Connect for Mirus (`consumer.*`, `topics.whitelist`, …) or
configure MM2 with (`source.cluster.alias`, `topics`, `replication.policy.class`, …), with values as strings or
JSON numbers/booleans. Kafka Connect and Mirus accept a lot silently (a typo is ignored, an empty whitelist
replicates nothing); here every property is either understood, deliberately ignored (settings that do not
matter to this platform, listed in `IGNORED_PROPERTIES` / `IGNORED_PREFIXES`), or rejected, and every problem is
reported at once, each as `<property>: <reason>`, so a config can be fixed in one round trip.

Client settings are validated by librdkafka itself (the client the engine runs) without contacting any broker,
so an unknown or malformed client setting fails when the config is submitted, not when a task starts.

Values may contain Kafka Connect config provider references, `${env:NAME}`, `${file:/path.properties:key}` or
`${file:/path}` (see `replicator.secrets`), so that secrets need not be stored with the config: they are resolved
before validation, in every process that parses the config, and a reference that cannot be resolved is reported
like any other problem. The typed fields and the client dicts hold resolved values; `raw` holds the properties
exactly as submitted, references unresolved, and is what gets stored.

Secrets (see `is_secret_property`) and every value that came from a reference never appear in `repr()` or in
error messages; `masked_properties()` masks literal secrets but shows references as written (they hold no
secret). `literal_secrets` lists secrets given in clear, for layers that want to refuse them. `raw` (literal
secrets) and the client dicts (resolved secrets) hold secrets in clear because the engine needs them.
"""

from __future__ import annotations

import difflib
import logging
import re
from collections.abc import Iterator, Mapping
from typing import Any, Literal

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from replicator.naming import (
    DefaultReplicationPolicy,
    IdentityReplicationPolicy,
    MirusNamingPolicy,
    RegexRouter,
    ReplicationPolicy,
    TopicNamer,
)
from replicator.secrets import SecretReferenceError, has_reference, substitute_references
from replicator.selection import TopicSelector, compile_java_regex, regex_list_pattern

SECRET_MASK = "********"

_SECRET_PARTS = ("password", "secret", "jaas.config", ".pem", "token", "credentials")


def is_secret_property(name: str) -> bool:
    """Whether a property's value must never be shown (API responses, UI, logs, error messages).

    Decided by name alone so that any layer can mask a config without parsing it: names containing `password`,
    `secret`, `jaas.config`, `.pem`, `token` or `credentials`, or ending in `.key` (case-insensitive). This
    over-masks a few harmless settings (e.g. `sasl.oauthbearer.token.endpoint.url`) rather than risk a leak.
    """
    lowered = name.lower()
    return any(part in lowered for part in _SECRET_PARTS) or lowered.endswith(".key")


def mask_properties(props: Mapping[str, object]) -> dict[str, object]:
    """`props` with every literal secret value replaced by `SECRET_MASK`: safe to return from an API or log.

    A secret value that contains a `${provider:...}` reference is shown as written: the secret is wherever the
    reference points. Any text around the reference is shown too (e.g. a JAAS config's login module and user
    name), so a secret must be entirely inside the referenced value. Only for submitted properties: resolved
    values (the client dicts) must be masked by name alone.
    """
    return {
        name: SECRET_MASK if is_secret_property(str(name)) and not has_reference(value) else value
        for name, value in props.items()
    }


def literal_secrets(props: Mapping[str, object]) -> list[str]:
    """Names of the secret properties (see `is_secret_property`) whose value is given in clear.

    That is every secret property with a non-empty value containing no `${provider:...}` reference (values that
    are not even strings count as literals); in `props` order. A layer that stores configs where they are shown
    (e.g. Dagster's run history) uses this to insist on references.
    """
    return [
        str(name)
        for name, value in props.items()
        if is_secret_property(str(name)) and value is not None and value != "" and not has_reference(value)
    ]


def _mask_resolved(settings: Mapping[str, str], hidden: frozenset[str]) -> dict[str, str]:
    """Resolved client settings with secrets and values that came from references masked (by name only)."""
    return {key: SECRET_MASK if is_secret_property(key) or key in hidden else value for key, value in settings.items()}


class ConnectorConfigError(ValueError):
    """A submitted config was rejected; `errors` lists every problem as (property name, reason)."""

    def __init__(self, errors: list[tuple[str, str]]) -> None:
        self.errors = list(errors)
        super().__init__(self._text())

    def _text(self) -> str:
        return "\n".join(f"{name}: {reason}" for name, reason in self.errors)

    def __str__(self) -> str:
        return self._text()


# --- property vocabulary -------------------------------------------------------------------------------------

MIRUS_CONNECTOR_CLASS = "com.salesforce.mirus.MirusSourceConnector"
MM2_CONNECTOR_CLASS = "org.apache.kafka.connect.mirror.MirrorSourceConnector"
_CONNECTOR_CLASSES = frozenset(
    {MIRUS_CONNECTOR_CLASS, MM2_CONNECTOR_CLASS, "MirusSourceConnector", "MirrorSourceConnector"}
)

_MM2_POLICY_PACKAGE = "org.apache.kafka.connect.mirror."
_REGEX_ROUTER_TYPES = frozenset({"org.apache.kafka.connect.transforms.RegexRouter", "RegexRouter"})
_BYTE_ARRAY_CONVERTERS = frozenset(
    {
        "org.apache.kafka.connect.converters.ByteArrayConverter",
        "com.salesforce.mirus.ByteArrayConverter",
        "ByteArrayConverter",
    }
)

_SELECTION_PROPERTIES = ("topics.whitelist", "topics.regex", "topics.regex.list", "topics")

# Top-level properties this model understands (client prefixes and `transforms.*` are handled separately).
KNOWN_PROPERTIES = frozenset(
    {
        "name",
        "connector.class",
        "tasks.max",
        "source.cluster.alias",
        "target.cluster.alias",
        "topics.whitelist",
        "topics.regex",
        "topics.regex.list",
        "topics",
        "topics.exclude",
        "replication.policy.class",
        "replication.policy.separator",
        "destination.topic.name.prefix",
        "destination.topic.name.suffix",
        "destination.bootstrap.servers",
        "transforms",
        "enable.partition.matching",
        "enable.destination.topic.checking",
        "poll.timeout.ms",
        "monitor.poll.wait.ms",
        "commit.failure.restart.ms",
        "offset.flush.interval.ms",
        "provenance.headers.enabled",
        "task.heartbeat.interval.ms",
        "task.lease.timeout.ms",
        # Mirus's source converters: accepted only as the byte-for-byte ByteArrayConverter.
        "source.key.converter",
        "source.value.converter",
        "source.header.converter",
    }
)

# Settings Kafka Connect / MM2 users commonly carry that change nothing here: accepted and ignored.
IGNORED_PROPERTIES = frozenset(
    {
        "config.action.reload",
        "replay.policy",
        "replay.window.records",
        "groups",
        "groups.exclude",
        "replication.factor",
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
    "emit.heartbeats.",
    "emit.checkpoints.",
    "sync.topic.configs.",
    "sync.topic.acls.",
    "refresh.topics.",
    "refresh.groups.",
    "offset-syncs.",
)

_SOURCE_CLUSTER_PREFIX = "source.cluster."
_TARGET_CLUSTER_PREFIX = "target.cluster."
_CONSUMER_PREFIX = "consumer."
_DESTINATION_CONSUMER_PREFIX = "destination.consumer."
_PRODUCER_PREFIX = "producer."
_CLIENT_PREFIXES = (
    _CONSUMER_PREFIX,
    _DESTINATION_CONSUMER_PREFIX,
    _PRODUCER_PREFIX,
    _SOURCE_CLUSTER_PREFIX,
    _TARGET_CLUSTER_PREFIX,
)

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

_TOPIC_CHARS = re.compile(r"[A-Za-z0-9._-]*")
_NAME = re.compile(r"[A-Za-z0-9._-]{1,200}")
_INT_MAX = 2**31 - 1

_DEFAULT_POLICY_NAMES = frozenset({_MM2_POLICY_PACKAGE + "DefaultReplicationPolicy", "DefaultReplicationPolicy"})
_IDENTITY_POLICY_NAMES = frozenset({_MM2_POLICY_PACKAGE + "IdentityReplicationPolicy", "IdentityReplicationPolicy"})

TASK_MAX_POLL_BLOCK_MS = 1000


# --- the model -----------------------------------------------------------------------------------------------


CONNECTION_SETTINGS = frozenset({
    "bootstrap.servers", "security.protocol", "client.dns.lookup", "broker.address.family", "client.rack",
    "socket.timeout.ms", "socket.keepalive.enable", "reconnect.backoff.ms", "reconnect.backoff.max.ms",
})  # fmt: skip


def connection_settings(client: Mapping[str, str]) -> dict[str, str]:
    """What any client of a cluster needs (address, network, `ssl.*`, `sasl.*`), without role-specific settings
    that another kind of client would reject or warn about (a consumer's `fetch.*` in a producer, say)."""
    return {k: v for k, v in client.items() if k in CONNECTION_SETTINGS or k.startswith(("ssl.", "sasl."))}


class ConnectorConfig(BaseModel):
    """A connector's validated configuration; build it with `from_properties`.

    `source_client` / `destination_client` / `producer_client` are librdkafka settings with their prefixes
    removed. The destination client is for metadata and admin calls and is the base of the producer: the task
    builds its producer from `producer_settings()` (destination settings overlaid with `producer.*`). None of the
    client dicts contain `auto.offset.reset` for the source (see `auto_offset_reset`) or a `group.id` unless the
    user gave one: tasks use `assign()`, and confluent-kafka insists on some `group.id`, so the task supplies one.
    """

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    name: str = Field(pattern=r"^[A-Za-z0-9._-]+$", min_length=1, max_length=200)
    connector_class: str | None = None
    tasks_max: int = Field(default=1, ge=1)
    source_alias: str = Field(default="source", min_length=1)
    target_alias: str = Field(default="target", min_length=1)

    source_client: dict[str, str] = Field(repr=False)
    destination_client: dict[str, str] = Field(repr=False)
    producer_client: dict[str, str] = Field(default_factory=dict, repr=False)

    selector: TopicSelector
    namer: TopicNamer = Field(default_factory=TopicNamer)

    # None: use the source partition number when the destination topic has it, else the producer's partitioner
    # (keeps partitions aligned whenever possible without dropping data). True: the destination partition must
    # exist (Mirus's partition matching). False: always the partitioner.
    partition_matching: bool | None = None
    destination_topic_checking: bool = True
    # Mirus semantics: `latest` (or `largest`) starts new partitions at the end; any other value at the start.
    auto_offset_reset: Literal["earliest", "latest"] = "earliest"

    # The task never blocks longer than TASK_MAX_POLL_BLOCK_MS in one poll, whatever this says, so that a stop,
    # a lost lease or a new assignment is noticed within a second; see `task_poll_timeout_ms`.
    poll_timeout_ms: int = Field(default=1000, ge=1, le=60000)
    # 2 s rather than Mirus's 60 s (and MM2's 10 min): new topics and partitions start replicating within
    # seconds, and a metadata request every few seconds costs a cluster nothing.
    monitor_poll_wait_ms: int = Field(default=2000, ge=100)
    commit_failure_restart_ms: int = Field(default=300000, ge=1000)
    offset_commit_interval_ms: int = Field(default=1000, ge=100)
    provenance_headers: bool = True
    heartbeat_interval_ms: int = Field(default=2000, ge=100)
    lease_timeout_ms: int = Field(default=30000, ge=1)

    raw: dict[str, object] = Field(default_factory=dict, repr=False)

    @model_validator(mode="after")
    def _lease_outlives_heartbeats(self) -> ConnectorConfig:
        # A lease that could expire between two heartbeats of a healthy task would fence it for nothing.
        if self.lease_timeout_ms <= 2 * self.heartbeat_interval_ms:
            raise ValueError("lease_timeout_ms must be greater than 2 x heartbeat_interval_ms")
        return self

    @classmethod
    def from_properties(cls, props: Mapping[str, object]) -> ConnectorConfig:
        """Parse and validate user-supplied properties; raises `ConnectorConfigError` listing every problem."""
        return _Parser(props).parse()

    @property
    def task_poll_timeout_ms(self) -> int:
        """The poll timeout a task actually uses: `poll_timeout_ms`, capped so a task stays responsive."""
        return min(self.poll_timeout_ms, TASK_MAX_POLL_BLOCK_MS)

    def producer_settings(self) -> dict[str, str]:
        """librdkafka settings for the destination producer: destination connection settings + `producer.*`."""
        return {**connection_settings(self.destination_client), **self.producer_client}

    def admin_settings(self, cluster: Literal["source", "destination"]) -> dict[str, str]:
        """librdkafka settings for metadata and admin calls on one of the connector's clusters."""
        return connection_settings(self.source_client if cluster == "source" else self.destination_client)

    def masked_properties(self) -> dict[str, object]:
        """The submitted properties with literal secret values replaced by `SECRET_MASK` (references shown)."""
        return mask_properties(self.raw)

    def _referenced_client_keys(self, *prefixes: str) -> frozenset[str]:
        """Settings of the client configured by `prefixes` whose value was resolved from a reference."""
        keys: set[str] = set()
        for name, value in self.raw.items():
            if isinstance(name, str) and has_reference(value):
                keys.update(name.removeprefix(prefix) for prefix in prefixes if name.startswith(prefix))
        return frozenset(keys)

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        # The client dicts are excluded from pydantic's repr (repr=False) and shown here masked instead. They hold
        # resolved values, so secrets and anything that came from a reference are masked by name.
        yield from super().__repr_args__()
        source = self._referenced_client_keys(_SOURCE_CLUSTER_PREFIX, _CONSUMER_PREFIX)
        producer = self._referenced_client_keys(_PRODUCER_PREFIX)
        # `destination.bootstrap.servers` is Mirus's old spelling, and producer.bootstrap.servers may stand in.
        destination = self._referenced_client_keys(_TARGET_CLUSTER_PREFIX, _DESTINATION_CONSUMER_PREFIX, "destination.")
        destination |= producer & {"bootstrap.servers"}
        yield "source_client", _mask_resolved(self.source_client, source)
        yield "destination_client", _mask_resolved(self.destination_client, destination)
        yield "producer_client", _mask_resolved(self.producer_client, producer)


# --- parsing -------------------------------------------------------------------------------------------------

_FIELD_PROPERTIES = {
    "name": "name",
    "connector_class": "connector.class",
    "tasks_max": "tasks.max",
    "source_alias": "source.cluster.alias",
    "target_alias": "target.cluster.alias",
    "source_client": "consumer.bootstrap.servers",
    "destination_client": "destination.consumer.bootstrap.servers",
    "producer_client": "producer.*",
    "selector": "topics.whitelist",
    "namer": "replication.policy.class",
    "partition_matching": "enable.partition.matching",
    "destination_topic_checking": "enable.destination.topic.checking",
    "auto_offset_reset": "consumer.auto.offset.reset",
    "poll_timeout_ms": "poll.timeout.ms",
    "monitor_poll_wait_ms": "monitor.poll.wait.ms",
    "commit_failure_restart_ms": "commit.failure.restart.ms",
    "offset_commit_interval_ms": "offset.flush.interval.ms",
    "provenance_headers": "provenance.headers.enabled",
    "heartbeat_interval_ms": "task.heartbeat.interval.ms",
    "lease_timeout_ms": "task.lease.timeout.ms",
}

# librdkafka's warnings about the throw-away check clients (e.g. "no bootstrap.servers") are noise.
_SILENT_LOGGER = logging.getLogger(f"{__name__}.librdkafka-check")
_SILENT_LOGGER.addHandler(logging.NullHandler())
_SILENT_LOGGER.propagate = False
_SILENT_LOGGER.setLevel(logging.CRITICAL + 1)


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list | tuple):
        return "a list"
    return type(value).__name__


def _is_scalar(value: object) -> bool:
    """Kafka Connect configs are flat: every value is a string, number or boolean."""
    return isinstance(value, str | int | float | bool)


def _suggest(name: str) -> str:
    """A "did you mean" hint for an unknown property, also when the typo is in a client prefix."""
    candidates = set(KNOWN_PROPERTIES) | IGNORED_PROPERTIES
    parts = name.split(".")
    for prefix in _CLIENT_PREFIXES:
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


class _Parser:
    """Reads a property mapping into a `ConnectorConfig`, collecting every problem instead of stopping early."""

    def __init__(self, props: Mapping[str, object]) -> None:
        self.submitted = props
        self.props = props  # the same with references resolved, once `resolve` has run
        self.errors: list[tuple[str, str]] = []
        # Properties whose submitted value holds a reference (name -> submitted value); the resolved value is
        # never shown. Those that could not be resolved keep the submitted value and report nothing else.
        self.referenced: dict[str, object] = {}
        self.unresolved: set[str] = set()
        self.substituted: set[str] = set()

    # -- reporting helpers --

    def fail(self, name: str, reason: str) -> None:
        if name in self.unresolved:
            return  # its value is still the reference text: any further complaint would be noise
        if (name, reason) not in self.errors:
            self.errors.append((name, reason))

    def hidden(self, name: str) -> bool:
        """Whether a property's value must not appear in messages: a secret, or resolved from a reference."""
        return is_secret_property(name) or name in self.referenced

    def shown(self, name: str, value: object) -> str:
        """A value as it may appear in an error message: secret values and resolved values never do."""
        if is_secret_property(name):
            return repr(SECRET_MASK)
        if name in self.referenced:
            return f"{self.referenced[name]!r} (resolved value not shown)"
        return repr(value)

    def redact(self, name: str, message: str, value: object) -> str:
        """`message` (which may quote `value` of property `name`) with the value shown as `shown` does."""
        return message.replace(repr(value), self.shown(name, value)) if self.hidden(name) else message

    # -- typed readers (values were checked to be str/int/float/bool up front) --

    def text(self, name: str, default: str | None = None) -> str | None:
        if name not in self.props:
            return default
        value = self.props[name]
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, float) and value.is_integer():
            return str(int(value))
        if isinstance(value, int | float):
            return str(value)
        return value if isinstance(value, str) else default

    def stripped(self, name: str, default: str | None = None) -> str | None:
        value = self.text(name)
        return default if value is None else value.strip()

    def comma_list(self, name: str) -> list[str]:
        """Kafka's LIST type: comma-separated, whitespace around entries ignored, empty entries dropped."""
        value = self.text(name)
        return [] if value is None else [part.strip() for part in value.split(",") if part.strip()]

    def integer(self, name: str, default: int, minimum: int, maximum: int = _INT_MAX) -> int:
        if name not in self.props:
            return default
        raw = self.props[name]
        if not _is_scalar(raw):
            return default  # wrong JSON type, already reported
        # JSON numbers (not booleans, which Python counts as ints) and numeric strings, as Kafka Connect accepts.
        value: int | None = None
        if isinstance(raw, int) and not isinstance(raw, bool):
            value = raw
        elif (isinstance(raw, float) and raw.is_integer()) or (
            isinstance(raw, str) and re.fullmatch(r"\s*[+-]?\d+\s*", raw)
        ):
            value = int(raw)
        if value is None or not minimum <= value <= maximum:
            bounds = f">= {minimum}" if maximum == _INT_MAX else f"between {minimum} and {maximum}"
            self.fail(name, f"must be an integer {bounds}, got {self.shown(name, raw)}")
            return default
        return value

    def boolean(self, name: str) -> bool | None:
        if name not in self.props:
            return None
        raw = self.props[name]
        if not _is_scalar(raw):
            return None  # wrong JSON type, already reported
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.strip().lower() in ("true", "false"):
            return raw.strip().lower() == "true"
        self.fail(name, f"must be true or false, got {self.shown(name, raw)}")
        return None

    # -- the whole config --

    def parse(self) -> ConnectorConfig:
        if not isinstance(self.props, Mapping):
            raise ConnectorConfigError(
                [("config", f"must be a JSON object of properties, got {_json_type(self.props)}")]
            )
        self.check_names_and_types()
        self.props = self.resolve()
        fields: dict[str, Any] = {"raw": dict(self.submitted)}
        fields.update(self.basics())
        fields.update(self.clients())
        fields["selector"] = self.selector()
        fields["namer"] = self.namer(fields.get("source_alias", "source"), fields.get("target_alias", "target"))
        fields.update(self.behaviour())
        if not self.errors:
            try:
                return ConnectorConfig(**fields)
            except ValidationError as err:  # a rule the readers above missed; still name the property
                for problem in err.errors(include_input=False, include_url=False):
                    field = str(problem["loc"][0]) if problem["loc"] else "config"
                    self.fail(_FIELD_PROPERTIES.get(field, field), str(problem["msg"]).removeprefix("Value error, "))
        raise ConnectorConfigError(self.sanitized_errors())

    def resolve(self) -> dict[object, object]:
        """The properties with references resolved; a reference that cannot be resolved is a problem."""
        resolved: dict[object, object] = {}
        for name, value in self.submitted.items():
            if isinstance(name, str) and isinstance(value, str) and has_reference(value):
                self.referenced[name] = value
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

        Values shorter than 4 characters are left alone: masking them would garble messages and such a
        secret protects nothing anyway. A reference that could not be resolved is not masked: naming it is the
        point of its error.
        """
        hidden = {
            str(v)
            for k, v in self.props.items()
            if (is_secret_property(str(k)) or k in self.referenced) and k not in self.unresolved
        } | self.substituted
        secrets: set[str] = set()
        for value in hidden:
            secrets.update({value, repr(value)[1:-1]})  # as is, and as quoted by repr() (escaped)
        ordered = sorted((s for s in secrets if len(s) >= 4), key=len, reverse=True)
        cleaned = []
        for name, reason in self.errors:
            for secret in ordered:
                reason = reason.replace(secret, SECRET_MASK)
            cleaned.append((name, reason))
        return cleaned

    def check_names_and_types(self) -> None:
        for name, value in self.props.items():
            if not isinstance(name, str):
                self.fail(str(name), "property names must be strings")
                continue
            if not _is_scalar(value):
                self.fail(name, f"must be a string, number or boolean, got {_json_type(value)}")
            if name in KNOWN_PROPERTIES or name in IGNORED_PROPERTIES or name.startswith(IGNORED_PREFIXES):
                continue
            if name.startswith((*_CLIENT_PREFIXES, "transforms.")):
                continue  # checked where the client settings and transforms are read
            self.fail(name, f"unknown property{_suggest(name)}")

    def basics(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        name = self.stripped("name")
        if not name:
            self.fail("name", "required: the connector's name")
        elif not _NAME.fullmatch(name):
            self.fail("name", f"must be 1-200 letters, digits, '.', '_' or '-', got {self.shown('name', name)}")
        else:
            out["name"] = name
        connector_class = self.stripped("connector.class")
        if connector_class is not None:
            if connector_class in _CONNECTOR_CLASSES:
                out["connector_class"] = connector_class
            else:
                self.fail(
                    "connector.class",
                    f"must be {MIRUS_CONNECTOR_CLASS} or {MM2_CONNECTOR_CLASS} (or their short names), "
                    f"got {self.shown('connector.class', connector_class)}",
                )
        out["tasks_max"] = self.integer("tasks.max", 1, 1)
        for field, prop, default in (
            ("source_alias", "source.cluster.alias", "source"),
            ("target_alias", "target.cluster.alias", "target"),
        ):
            alias = self.stripped(prop, default)
            if not alias:
                self.fail(prop, "must not be empty")
            else:
                out[field] = alias
        for prop in ("source.key.converter", "source.value.converter", "source.header.converter"):
            converter = self.stripped(prop)
            if converter is not None and converter not in _BYTE_ARRAY_CONVERTERS:
                self.fail(
                    prop,
                    f"only org.apache.kafka.connect.converters.ByteArrayConverter is supported (records are "
                    f"copied byte for byte), got {self.shown(prop, converter)}",
                )
        return out

    # -- clients --

    def clients(self) -> dict[str, Any]:
        source = _ClientSettings("source")
        destination = _ClientSettings("destination")
        producer = _ClientSettings("producer")
        offset_reset: tuple[str, str] | None = None
        for name in self.props:
            if not isinstance(name, str):
                continue
            if name.startswith(_SOURCE_CLUSTER_PREFIX) and name != "source.cluster.alias":
                key = name.removeprefix(_SOURCE_CLUSTER_PREFIX)
                target = source
            elif name.startswith(_CONSUMER_PREFIX):
                key = name.removeprefix(_CONSUMER_PREFIX)
                target = source
            elif name.startswith(_TARGET_CLUSTER_PREFIX) and name != "target.cluster.alias":
                key = name.removeprefix(_TARGET_CLUSTER_PREFIX)
                target = destination
            elif name.startswith(_DESTINATION_CONSUMER_PREFIX):
                key = name.removeprefix(_DESTINATION_CONSUMER_PREFIX)
                target = destination
            elif name == "destination.bootstrap.servers":  # Mirus's deprecated spelling
                key = "bootstrap.servers"
                target = destination
            elif name.startswith(_PRODUCER_PREFIX):
                key = name.removeprefix(_PRODUCER_PREFIX)
                target = producer
            else:
                continue
            if target is source and key == "auto.offset.reset":
                # Interpreted by us (Mirus semantics), not handed to librdkafka, which would reject `none`/`foo`.
                if offset_reset is None or name.startswith(_CONSUMER_PREFIX):
                    offset_reset = (name, self.stripped(name) or "")
                continue
            self.add_setting(target, name, key)

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

        self.check_with_librdkafka("consumer", source, _CONSUMER_PREFIX)
        self.check_with_librdkafka("admin", destination, _DESTINATION_CONSUMER_PREFIX)
        # The producer the task builds: destination settings overlaid with producer.*. Problems that the
        # destination check already reported are not repeated under producer.* names.
        merged = _ClientSettings("producer")
        merged.settings = {**destination.settings, **producer.settings}
        merged.origin = {**destination.origin, **producer.origin}
        self.check_with_librdkafka("producer", merged, _PRODUCER_PREFIX)

        out: dict[str, Any] = {
            "source_client": source.settings,
            "destination_client": destination.settings,
            "producer_client": producer.settings,
        }
        if offset_reset is not None:
            out["auto_offset_reset"] = "latest" if offset_reset[1].lower() in ("latest", "largest") else "earliest"
        return out

    def add_setting(self, client: _ClientSettings, name: str, key: str) -> None:
        value = self.text(name)
        if value is None:
            return  # wrong JSON type, already reported
        if not key:
            self.fail(name, "a client setting name must follow the prefix")
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
        if key in client.settings and client.settings[key] != value:
            self.fail(
                name,
                f"conflicts with {client.origin[key]}: both set the {client.role} client's {key!r}; set only one",
            )
            return
        client.settings[key] = value
        client.origin.setdefault(key, name)

    def check_with_librdkafka(self, kind: str, client: _ClientSettings, prefix: str) -> None:
        """Let librdkafka judge every setting (names, values, combinations) and map its complaints to properties.

        `bootstrap.servers` is left out so that nothing tries to connect; a client without brokers is created
        and destroyed in a few milliseconds. A complaint about settings that are missing (e.g. "sasl.username
        and sasl.password must be set") is reported under `prefix` + the first setting it names.
        """
        reported = {reason for _, reason in self.errors}
        for key, message in _librdkafka_problems(kind, client.settings):
            if key is not None:
                name = client.origin.get(key, prefix + key)
            else:
                mentioned = _SETTING_NAME.search(_CREATE_PREFIX.sub("", message))
                name = prefix + (mentioned.group(0) if mentioned else "*")
            value = client.settings.get(key, "") if key is not None else ""
            reason = _librdkafka_reason(message, key, value, secret=self.hidden(name))
            if reason not in reported:
                self.fail(name, reason)

    # -- selection and naming --

    def selector(self) -> TopicSelector | None:
        whitelist = self.comma_list("topics.whitelist")
        regex = self.stripped("topics.regex") or None
        regex_list = self.comma_list("topics.regex.list")
        include = self.comma_list("topics")
        exclude = self.comma_list("topics.exclude")
        ok = True
        if regex is not None:
            ok &= self.check_regex("topics.regex", regex, compile_java_regex)
        for pattern in regex_list:
            ok &= self.check_regex("topics.regex.list", pattern, regex_list_pattern)
        for prop, patterns in (("topics", include), ("topics.exclude", exclude)):
            for pattern in patterns:
                ok &= self.check_regex(prop, pattern, compile_java_regex)
        if not (whitelist or regex or regex_list or include):
            # Mirus accepts this and replicates nothing, silently; say so instead.
            given = [p for p in _SELECTION_PROPERTIES if p in self.props]
            detail = f" ({', '.join(given)} {'is' if len(given) == 1 else 'are'} empty)" if given else ""
            self.fail(
                "topics.whitelist",
                "no topics selected; set topics.whitelist, topics.regex, topics.regex.list or topics" + detail,
            )
            return None
        if not ok:
            return None
        return TopicSelector(
            whitelist=frozenset(whitelist),
            regex=regex,
            regex_list=tuple(regex_list),
            include=tuple(include),
            exclude=tuple(exclude),
        )

    def check_regex(self, prop: str, pattern: str, compile_one: Any) -> bool:
        try:
            compile_one(pattern)
        except ValueError as err:
            self.fail(prop, self.redact(prop, str(err), pattern))
            return False
        return True

    def namer(self, source_alias: str, target_alias: str) -> TopicNamer | None:
        policy = self.policy(source_alias, target_alias)
        routers = self.routers()
        if policy is None or routers is None:
            return None
        return TopicNamer(policy, routers)

    def policy(self, source_alias: str, target_alias: str) -> ReplicationPolicy | None:
        policy_class = self.stripped("replication.policy.class")
        separator = self.text("replication.policy.separator")
        prefix = self.stripped("destination.topic.name.prefix", "")
        suffix = self.stripped("destination.topic.name.suffix", "")
        mirus_props = [
            p for p, v in (("destination.topic.name.prefix", prefix), ("destination.topic.name.suffix", suffix)) if v
        ]

        if policy_class is None and (mirus_props or "source.cluster.alias" not in self.props):
            if separator is not None:
                self.fail(
                    "replication.policy.separator",
                    "only applies with replication.policy.class DefaultReplicationPolicy (or source.cluster.alias "
                    "without destination.topic.name.prefix/suffix)",
                )
            ok = True
            for prop, value in (("destination.topic.name.prefix", prefix), ("destination.topic.name.suffix", suffix)):
                if value and not _TOPIC_CHARS.fullmatch(value):
                    self.fail(
                        prop, f"may only contain letters, digits, '.', '_' and '-', got {self.shown(prop, value)}"
                    )
                    ok = False
            return MirusNamingPolicy(prefix or "", suffix or "") if ok else None

        for prop in mirus_props:  # only reachable with an explicit replication.policy.class
            self.fail(
                prop,
                "cannot be combined with replication.policy.class: destination names would be ambiguous; "
                "use either MM2 naming or Mirus prefix/suffix naming",
            )
        if policy_class is None or policy_class in _DEFAULT_POLICY_NAMES:
            separator = "." if separator is None else separator
            ok = True
            if not separator or not _TOPIC_CHARS.fullmatch(separator):
                self.fail(
                    "replication.policy.separator",
                    "must be non-empty and only contain letters, digits, '.', '_' and '-', "
                    f"got {self.shown('replication.policy.separator', separator)}",
                )
                return None
            for prop, alias in (("source.cluster.alias", source_alias), ("target.cluster.alias", target_alias)):
                if separator in alias:
                    shown_separator = self.shown("replication.policy.separator", separator)
                    self.fail(
                        prop,
                        f"must not contain the replication separator {shown_separator}, got {self.shown(prop, alias)}",
                    )
                    ok = False
                elif not _TOPIC_CHARS.fullmatch(alias):
                    self.fail(
                        prop, f"may only contain letters, digits, '.', '_' and '-', got {self.shown(prop, alias)}"
                    )
                    ok = False
            if not ok or mirus_props:
                return None
            return DefaultReplicationPolicy(source_alias, target_alias, separator)
        if policy_class in _IDENTITY_POLICY_NAMES:
            return None if mirus_props else IdentityReplicationPolicy(source_alias, target_alias)
        self.fail(
            "replication.policy.class",
            f"only {_MM2_POLICY_PACKAGE}DefaultReplicationPolicy or {_MM2_POLICY_PACKAGE}IdentityReplicationPolicy "
            f"(or their short names) are supported, got {self.shown('replication.policy.class', policy_class)}",
        )
        return None

    def routers(self) -> tuple[RegexRouter, ...] | None:
        names = self.comma_list("transforms")
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            self.fail("transforms", f"duplicate transform names: {', '.join(duplicates)}")
            return None
        listed = set(names)
        for prop in self.props:
            if not isinstance(prop, str) or not prop.startswith("transforms."):
                continue
            alias, _, setting = prop.removeprefix("transforms.").rpartition(".")
            if alias not in listed:
                continue  # as in Kafka Connect, settings of transforms not listed in `transforms` are ignored
            if setting in ("predicate", "negate"):
                self.fail(prop, "conditional transforms (predicates) are not supported")
            elif setting not in ("type", "regex", "replacement"):
                self.fail(prop, "unknown RegexRouter setting; expected type, regex and replacement")

        routers: list[RegexRouter] = []
        ok = True
        for alias in names:
            prefix = f"transforms.{alias}."
            kind = self.stripped(prefix + "type")
            regex = self.text(prefix + "regex")
            replacement = self.text(prefix + "replacement")
            if kind is None:
                self.fail(prefix + "type", "required: the transform's class (only RegexRouter is supported)")
                ok = False
            elif kind not in _REGEX_ROUTER_TYPES:
                self.fail(
                    prefix + "type",
                    "only RegexRouter (org.apache.kafka.connect.transforms.RegexRouter) is supported, "
                    f"got {self.shown(prefix + 'type', kind)}",
                )
                ok = False
                continue
            if regex is None:
                self.fail(prefix + "regex", "required for RegexRouter")
            if replacement is None:
                self.fail(prefix + "replacement", "required for RegexRouter")
            if regex is None or replacement is None:
                ok = False
                continue
            if not self.check_regex(prefix + "regex", regex, compile_java_regex):
                ok = False
                continue
            try:
                routers.append(RegexRouter(regex, replacement))
            except ValueError as err:
                message = self.redact(prefix + "regex", str(err), regex)
                self.fail(prefix + "replacement", self.redact(prefix + "replacement", message, replacement))
                ok = False
        return tuple(routers) if ok else None

    # -- engine behaviour --

    def behaviour(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "partition_matching": self.boolean("enable.partition.matching"),
            "poll_timeout_ms": self.integer("poll.timeout.ms", 1000, 1, 60000),
            "monitor_poll_wait_ms": self.integer("monitor.poll.wait.ms", 2000, 100),
            "commit_failure_restart_ms": self.integer("commit.failure.restart.ms", 300000, 1000),
            "offset_commit_interval_ms": self.integer("offset.flush.interval.ms", 1000, 100),
        }
        for field, prop in (
            ("destination_topic_checking", "enable.destination.topic.checking"),
            ("provenance_headers", "provenance.headers.enabled"),
        ):
            value = self.boolean(prop)
            if value is not None:
                out[field] = value
        heartbeat = self.integer("task.heartbeat.interval.ms", 2000, 100)
        lease = self.integer("task.lease.timeout.ms", 30000, 1)
        if lease <= 2 * heartbeat:
            self.fail(
                "task.lease.timeout.ms",
                f"must be greater than 2 x task.heartbeat.interval.ms ({2 * heartbeat}), got {lease}",
            )
        out["heartbeat_interval_ms"] = heartbeat
        out["lease_timeout_ms"] = lease
        return out


# --- librdkafka checks ---------------------------------------------------------------------------------------

_QUOTED = re.compile(r'"([^"]+)"')
_SETTING_NAME = re.compile(r"\b[a-z][a-z0-9_]*(?:\.[a-z0-9_]+)+\b")
_CREATE_PREFIX = re.compile(r"^Failed to create (?:consumer|producer|admin client): ")


def _try_client(kind: str, conf: Mapping[str, str]) -> str | None:
    """Create and destroy a client of `kind` with `conf`; librdkafka's complaint, or None if it accepted it."""
    settings: dict[str, Any] = {**conf, "logger": _SILENT_LOGGER}
    try:
        if kind == "consumer":
            settings.setdefault("group.id", "mirus-config-check")
            Consumer(settings).close()
        elif kind == "producer":
            producer = Producer(settings)
            close = getattr(producer, "close", None)  # confluent-kafka >= 2.12
            if close is not None:
                close()
        else:
            AdminClient(settings)
    except KafkaException as err:
        first = err.args[0] if err.args else err
        return first.str() if isinstance(first, KafkaError) else str(first)
    except (ValueError, TypeError) as err:
        return str(err)
    return None


def _culprit(message: str, conf: Mapping[str, str]) -> str | None:
    """The setting a librdkafka message is about, when the message says so."""
    for quoted in _QUOTED.findall(message):
        if quoted in conf:
            return quoted
    for key in sorted(conf, key=len, reverse=True):
        if re.search(rf"(?<![\w.]){re.escape(key)}(?![\w.])", message):
            return key
    for key in sorted(conf, key=len, reverse=True):  # prose such as "SASL mechanism GSSAPI"
        if re.search(rf"(?<![\w.]){re.escape(key.replace('.', ' '))}s?(?![\w.])", message, re.IGNORECASE):
            return key
    if "JAAS" in message and "sasl.jaas.config" in conf:
        return "sasl.jaas.config"
    if "TrustStore" in message:
        return next((k for k in conf if k.startswith("ssl.truststore.")), None)
    return None


def _librdkafka_problems(kind: str, settings: Mapping[str, str]) -> list[tuple[str | None, str]]:
    """Every (setting, message) librdkafka rejects; setting is None when no single setting is to blame.

    librdkafka stops at the first problem, so the offending setting is removed and the check repeated until
    the rest is accepted. A message that names no setting is pinned on the setting that
    draws the same message when set alone.
    """
    conf = {k: v for k, v in settings.items() if k != "bootstrap.servers"}
    problems: list[tuple[str | None, str]] = []
    for _ in range(len(conf) + 1):
        message = _try_client(kind, conf)
        if message is None:
            break
        key = _culprit(message, conf)
        if key is None:
            # e.g. an alias (`linger.ms` is reported as "queue.buffering.max.ms"): find the setting that, alone,
            # draws the same complaint.
            expected = _CREATE_PREFIX.sub("", message)
            key = next(
                (k for k in conf if _CREATE_PREFIX.sub("", _try_client(kind, {k: conf[k]}) or "") == expected), None
            )
        problems.append((key, message))
        if key is None:
            break
        del conf[key]
    return problems


def _librdkafka_reason(message: str, key: str | None, value: str, *, secret: bool) -> str:
    text = _CREATE_PREFIX.sub("", message.strip())
    if text.startswith("No such configuration property"):
        return (
            f"unknown client setting {key!r}: librdkafka (the Kafka client used here) has no such configuration "
            "property; Java-only client settings are not supported "
            "(see https://github.com/confluentinc/librdkafka/blob/master/CONFIGURATION.md)"
        )
    if secret and value:
        text = text.replace(value, SECRET_MASK)
    return f"rejected by librdkafka: {text}"
