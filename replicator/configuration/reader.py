"""Reading connector properties one by one, with every problem collected as (property, reason).

`PropertyReader` holds the properties (references resolved), the problems found so far and the rules for what a
message may show: a secret or a value that came from a reference never appears. `read(spec)` reads one row of
`replicator.configuration.properties` with its type, bounds and choices; `replicator.configuration.parser`,
`replicator.configuration.topic_rules` and `replicator.configuration.client_rules` build on it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from replicator.configuration.masking import SECRET_MASK, is_secret_property
from replicator.configuration.properties import INT_MAX, Kind, PropertySpec


def is_scalar(value: object) -> bool:
    """Kafka Connect configs are flat: every value is a string, number or boolean."""
    return isinstance(value, str | int | float | bool)


class PropertyReader:
    def __init__(self, props: Mapping[str, object]) -> None:
        self.props = props  # with references resolved, once the parser has resolved them
        self.errors: list[tuple[str, str]] = []
        # Properties whose submitted value holds a reference (name -> submitted value); the resolved value is
        # never shown. Those that could not be resolved keep the submitted value and report nothing else.
        self.referenced: dict[str, object] = {}
        self.unresolved: set[str] = set()

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
        value = self.props.get(name)
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

    def read(self, spec: PropertySpec) -> object:
        """The value of a table row with its checks (None when absent or wrong; a problem is then reported)."""
        given = [n for n in spec.names if n in self.props]
        if len(given) > 1 and len({repr(self.props[n]) for n in given}) > 1:
            self.fail(given[1], f"conflicts with {given[0]}: both set {spec.name}; set only one")
        name = given[0] if given else spec.name
        raw = self.props.get(name)
        if not given or not is_scalar(raw):  # absent, or wrong JSON type (already reported)
            if spec.required and not given:
                self.fail(name, f"required: {spec.doc[0].lower()}{spec.doc[1:].rstrip('.')}")
            return None
        if spec.kind is Kind.INT:
            value: int | None = None
            # JSON numbers (not booleans, which Python counts as ints) and numeric strings, as Kafka Connect does.
            if isinstance(raw, int) and not isinstance(raw, bool):
                value = raw
            elif (isinstance(raw, float) and raw.is_integer()) or (
                isinstance(raw, str) and re.fullmatch(r"\s*[+-]?\d+\s*", raw)
            ):
                value = int(raw)
            low = spec.minimum if spec.minimum is not None else -INT_MAX - 1
            high = spec.maximum if spec.maximum is not None else INT_MAX
            if value is None or not low <= value <= high:
                self.fail(name, f"must be an integer {spec.bounds()}, got {self.shown(name, raw)}")
                return None
            return value
        if spec.kind is Kind.BOOLEAN:
            if isinstance(raw, bool):
                return raw
            if isinstance(raw, str) and raw.strip().lower() in ("true", "false"):
                return raw.strip().lower() == "true"
            self.fail(name, f"must be true or false, got {self.shown(name, raw)}")
            return None
        text = self.stripped(name) or ""
        if not text:
            self.fail(
                name,
                f"required: {spec.doc[0].lower()}{spec.doc[1:].rstrip('.')}" if spec.required else "must not be empty",
            )
            return None
        if (spec.choices and text not in spec.choices) or (spec.pattern and not re.fullmatch(spec.pattern, text)):
            self.fail(name, f"must be {spec.expected}, got {self.shown(name, text)}")
            return None
        return text
