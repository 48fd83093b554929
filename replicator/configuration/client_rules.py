"""The client settings of a connector config: the librdkafka settings of its source consumer, destination admin
client and producer, from every property that carries one (`consumer.*`, `source.cluster.*`, `producer.*`, …), checked
by librdkafka itself at submission, and the settings exactly-once delivery forbids. Several properties set one client
together, so they are read here rather than one by one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from replicator.configuration.librdkafka_check import (
    CREATE_PREFIX,
    SETTING_NAME,
    librdkafka_problems,
    librdkafka_reason,
)
from replicator.configuration.properties import Client, client_setting
from replicator.configuration.reader import PropertyReader

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


class ClientSettings:
    """One client's librdkafka settings being assembled, remembering which property set each one."""

    def __init__(self, role: str) -> None:
        self.role = role
        self.settings: dict[str, str] = {}
        self.origin: dict[str, str] = {}


class ClientRules(PropertyReader):
    """Reads and checks the client settings; `clients()` the model's three client dicts and Mirus's offset reset."""

    submission: bool  # a config entering the platform, whose clients librdkafka judges too

    def clients(self) -> dict[str, Any]:
        clients = {client: ClientSettings(client.name.lower()) for client in Client}
        source, destination, producer = clients[Client.SOURCE], clients[Client.DESTINATION], clients[Client.PRODUCER]
        offset_reset: tuple[str, str] | None = None
        for name in self.props:
            if not isinstance(name, str) or name in ("source.cluster.alias", "target.cluster.alias"):
                continue
            client, key = client_setting(name)
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
            merged = ClientSettings("producer")
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
        if fields.get("provenance_headers_enabled") is False:
            self.fail(
                "provenance.headers.enabled",
                f"must stay true with {mode}: each partition resumes after its "
                "last copy at the destination, found by these headers",
            )
        if fields.get("enable_partition_matching") is False:
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

    def add_setting(self, client: ClientSettings, name: str, key: str) -> None:
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

    def add_jaas_login(self, client: ClientSettings, name: str, value: str) -> None:
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

    def check_with_librdkafka(self, kind: str, client: ClientSettings, prefix: str) -> None:
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
