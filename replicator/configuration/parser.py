"""Reads a connector's property mapping into a `ConnectorConfig`, collecting every problem instead of stopping early:
unknown names (with "did you mean" hints), wrong types, unresolvable references, and what the table's rows, the topic
rules and the client rules say; messages never show a secret or a resolved value.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from replicator.configuration.client_rules import ClientRules
from replicator.configuration.masking import is_secret_property, redact
from replicator.configuration.model import ConnectorConfig, ConnectorConfigError
from replicator.configuration.properties import (
    CLIENT_PREFIXES,
    FIELD_PROPERTIES,
    IGNORED_PREFIXES,
    IGNORED_PROPERTIES,
    KNOWN_PROPERTIES,
    PROPERTIES,
    SPECS,
    client_setting,
)
from replicator.configuration.reader import is_scalar
from replicator.configuration.secrets import SecretReferenceError, has_reference, substitute_references
from replicator.configuration.topic_rules import TopicRules

_CLIENT_PREFIX_NAMES = tuple(p.prefix for p in CLIENT_PREFIXES)
_MAX_VALUE_LENGTH = 100_000  # client settings and transforms (a CA bundle in ssl.ca.pem can be long)


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


class ConnectorParser(ClientRules, TopicRules):
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
            if fields.get("copy_mode") == "batches":
                self.fail(
                    "copy.mode",
                    "must be records with exactly.once.support: the batch path writes no transactions, the record "
                    "path copies exactly once",
                )
        if fields.get("start_after_destination_copies") and fields.get("provenance_headers_enabled") is False:
            self.fail(
                "provenance.headers.enabled",
                "must stay true with start.after.destination.copies=true: each partition resumes after its "
                "last copy at the destination, found by these headers",
            )
        fields["selector"] = self.selector()
        fields["namer"] = self.namer(
            fields.get("source_cluster_alias", "source"), fields.get("target_cluster_alias", "target")
        )
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
                if config.start_after_destination_copies and not config.ordered_acks:
                    self.fail(
                        "start.after.destination.copies",
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
                if not is_secret_property(name) and client_setting(name)[0] is None:
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
