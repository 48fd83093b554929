"""Hundreds of invalid connector configs, generated from the property table, each with the property it must name.

Every case is a valid base config with one thing wrong, so a refusal can only come from that one thing. The
cases cover every row of `replicator.configuration.properties.PROPERTIES` (wrong JSON types, out-of-range numbers,
values outside the choices, overlong text), client settings (hosts, offsets reset, unknown settings, credentials in a
URL), topic names past Kafka's 249 characters once named by the policy, references that the allowlist denies or
that would show a resolved value in a visible property, literal secrets and unknown properties.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from replicator.configuration.properties import PROPERTIES, Kind

HUGE = "x" * 100_000
# A value that must never come back in an error: a password typed in a URL, a file the caller may not read.
SECRET_IN_URL = "hunter2-in-url"


@dataclass(frozen=True)
class InvalidCase:
    label: str
    properties: dict[str, Any]
    names: str  # the property the refusal must name


def _with(base: Mapping[str, Any], label: str, names: str, **changes: Any) -> InvalidCase:
    props = dict(base)
    for key, value in changes.items():
        props[key.replace("__", ".")] = value
    return InvalidCase(label, props, names)


def invalid_cases(base: Mapping[str, Any]) -> Iterator[InvalidCase]:
    """Every invalid variation of `base` (a valid Mirus connector config with topics.whitelist set)."""
    for spec in PROPERTIES:
        if spec.part is not None or spec.client is not None:
            continue
        wrong: list[tuple[str, object]] = [("a list", [1]), ("an object", {"a": 1}), ("null", None)]
        if spec.kind is Kind.INT:
            wrong += [
                ("not a number", "twelve"),
                ("a fraction", "1.5"),
                ("a boolean", True),
                ("too big", 2**40),
                ("empty", ""),
            ]
            if spec.minimum is not None:
                wrong.append(("below its minimum", spec.minimum - 1))
            if spec.maximum is not None:
                wrong.append(("above its maximum", spec.maximum + 1))
        elif spec.kind is Kind.BOOLEAN:
            wrong += [("yes", "yes"), ("a number", 2), ("empty", "")]
        else:
            wrong += [("a number", 123), ("a boolean", True), ("100,000 characters", HUGE)]
            if spec.choices:
                wrong += [("outside its choices", "sideways"), ("empty", "")]
            if spec.pattern:
                wrong += [("not matching its pattern", "bad name!"), ("empty", "")]
        for what, value in wrong:
            yield InvalidCase(f"{spec.name}: {what}", {**base, spec.name: value}, spec.name)

    # Names of topics, before and after the naming policy.
    for prop in ("destination.topic.name.prefix", "destination.topic.name.suffix"):
        yield InvalidCase(f"{prop}: 100,000 characters", {**base, prop: HUGE}, prop)
        yield InvalidCase(f"{prop}: 249 characters", {**base, prop: "p" * 249}, prop)
        yield InvalidCase(f"{prop}: a slash", {**base, prop: "a/b"}, prop)
    long_topic = "t" * 240
    yield InvalidCase(
        "a whitelisted topic named past 249 characters by the suffix",
        {**base, "topics.whitelist": long_topic, "destination.topic.name.suffix": ".mirror-copy"},
        "destination.topic.name.suffix",
    )
    yield InvalidCase(
        "topics.whitelist: a name past 249 characters", {**base, "topics.whitelist": "t" * 250}, "topics.whitelist"
    )
    yield InvalidCase("topics.whitelist: an illegal name", {**base, "topics.whitelist": "a b"}, "topics.whitelist")
    mm2 = {k: v for k, v in base.items() if not k.startswith("destination.topic.name.")}
    yield InvalidCase(
        "source.cluster.alias naming remote topics past 249 characters",
        {**mm2, "source.cluster.alias": "a" * 245, "topics.whitelist": "orders"},
        "source.cluster.alias",
    )
    for prop in ("topics.regex", "topics"):
        yield InvalidCase(f"{prop}: 100,000 characters", {**base, prop: HUGE}, prop)
        yield InvalidCase(f"{prop}: unbalanced", {**base, prop: "orders(.*"}, prop)
    yield InvalidCase("topics.regex.list: 100,000 characters", {**base, "topics.regex.list": HUGE}, "topics.regex.list")

    # Client settings.
    for prefix in ("consumer.", "destination.consumer.", "source.cluster.", "target.cluster."):
        prop = f"{prefix}bootstrap.servers"
        for what, value in (
            ("not a host", "not a host::"),
            ("credentials in it", f"u:{SECRET_IN_URL}@127.0.0.1:9092"),
            ("a URL with credentials", f"PLAINTEXT://u:{SECRET_IN_URL}@127.0.0.1:9092"),
            ("no port", "127.0.0.1"),
            ("port 0", "127.0.0.1:0"),
            ("port 70000", "127.0.0.1:70000"),
            ("an empty entry", "127.0.0.1:9092,,"),
            ("100,000 characters", HUGE),
        ):
            props = {**base, prop: value}
            if prefix in ("source.cluster.", "target.cluster."):
                props.pop(
                    "consumer.bootstrap.servers"
                    if prefix == "source.cluster."
                    else "destination.consumer.bootstrap.servers",
                    None,
                )
            yield InvalidCase(f"{prop}: {what}", props, prop)
    for value in ("sideways", "", "EARLIEST!"):
        yield _with(
            base,
            f"consumer.auto.offset.reset: {value!r}",
            "consumer.auto.offset.reset",
            consumer__auto__offset__reset=value,
        )
    for prop, value in (
        ("consumer.no.such.setting", "1"),
        ("producer.linger.ms", "-5"),
        ("producer.acks", "seven"),
        ("consumer.fetch.max.bytes", "lots"),
        ("producer.compression.type", "zip"),
    ):
        yield InvalidCase(f"{prop}: {value}", {**base, prop: value}, prop)

    # References: the allowlist, and values that would be shown.
    for prop in (
        "consumer.client.id",
        "destination.topic.name.suffix",
        "consumer.bootstrap.servers",
        "name",
        "tasks.max",
        "consumer.sasl.password",
    ):
        for reference in ("${file:/etc/shadow:root}", "${env:HOME}", "${file:/etc/passwd}", "${env:PATH}"):
            yield InvalidCase(f"{prop}: {reference}", {**base, prop: reference}, prop)
    for reference in ("${vault:kafka/pw}", "${env:}", "${file::key}", "${env:MIRUS_SECRET_NOT_SET_ANYWHERE}"):
        yield InvalidCase(
            f"consumer.sasl.password: {reference}",
            {**base, "consumer.sasl.password": reference},
            "consumer.sasl.password",
        )

    # Literal secrets and unknown names.
    for prop in (
        "consumer.sasl.password",
        "producer.ssl.key.password",
        "destination.consumer.sasl.jaas.config",
        "producer.ssl.key.pem",
        "consumer.sasl.oauthbearer.client.secret",
    ):
        yield InvalidCase(f"{prop}: given in clear", {**base, prop: "typed-in-clear"}, prop)
    for prop in ("topic.whitelist", "tasks.maxx", "consumer", "foo", "destination.topic.name.sufix"):
        yield InvalidCase(f"unknown property {prop}", {**base, prop: "1"}, prop)
