"""Connector configs as users paste them (Mirus and MM2 dialects): parsing, every error at once, secret masking.

Pure unit tests: librdkafka validates client settings without any broker.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import certifi
import pytest

from replicator.configuration.connector import ConnectorConfig, ConnectorConfigError, validate_submission
from replicator.configuration.masking import SECRET_MASK, is_secret_property, literal_secrets, mask_properties
from replicator.configuration.secrets import ENV_ALLOWED_PATHS
from replicator.topics.naming import DefaultReplicationPolicy, IdentityReplicationPolicy, MirusNamingPolicy

# The body of the Mirus quickstart's `PUT /connectors/mirus-quickstart-source/config`.
MIRUS_QUICKSTART: dict[str, object] = {
    "name": "mirus-quickstart-source",
    "connector.class": "com.salesforce.mirus.MirusSourceConnector",
    "tasks.max": "5",
    "topics.whitelist": "test",
    "destination.topic.name.suffix": ".mirror",
    "destination.consumer.bootstrap.servers": "localhost:9092",
    "consumer.bootstrap.servers": "localhost:9092",
    "consumer.client.id": "mirus-quickstart",
    "consumer.key.deserializer": "org.apache.kafka.common.serialization.ByteArrayDeserializer",
    "consumer.value.deserializer": "org.apache.kafka.common.serialization.ByteArrayDeserializer",
}

MM2_STYLE: dict[str, object] = {
    "name": "a-to-b",
    "connector.class": "org.apache.kafka.connect.mirror.MirrorSourceConnector",
    "source.cluster.alias": "A",
    "target.cluster.alias": "B",
    "source.cluster.bootstrap.servers": "a1:9092,a2:9092",
    "target.cluster.bootstrap.servers": "b1:9092",
    "topics": "x, orders-.*",
    "topics.exclude": "orders-tmp",
    "replication.policy.class": "org.apache.kafka.connect.mirror.DefaultReplicationPolicy",
    "replication.policy.separator": ".",
    "tasks.max": 4,
}

BASE: dict[str, object] = {
    "name": "c",
    "consumer.bootstrap.servers": "src:9092",
    "destination.consumer.bootstrap.servers": "dst:9092",
    "topics.whitelist": "t",
}


def submit(props: Any) -> ConnectorConfig:
    """The submission checks, literal secrets allowed (they are refused by default: see the last tests)."""
    return validate_submission(props, allow_literal_secrets=True)


def parse(**overrides: object) -> ConnectorConfig:
    return submit({**BASE, **overrides})


def errors_of(props: dict[str, object]) -> ConnectorConfigError:
    with pytest.raises(ConnectorConfigError) as caught:
        submit(props)
    return caught.value


def error_for(prop: str, **overrides: object) -> str:
    """The reason reported for `prop` when BASE is changed by `overrides` (None removes a property)."""
    props: dict[str, Any] = {**BASE, **overrides}
    props = {k: v for k, v in props.items() if v is not None}
    err = errors_of(props)
    reasons = [reason for name, reason in err.errors if name == prop]
    assert reasons, f"no error for {prop}: {err.errors}"
    return reasons[0]


# --- accepted configs ------------------------------------------------------------------------------------------


def test_mirus_quickstart_parses() -> None:
    config = submit(MIRUS_QUICKSTART)
    assert config.name == "mirus-quickstart-source"
    assert config.connector_class == "com.salesforce.mirus.MirusSourceConnector"
    assert config.tasks_max == 5
    assert config.source_client == {"bootstrap.servers": "localhost:9092", "client.id": "mirus-quickstart"}
    assert config.destination_client == {"bootstrap.servers": "localhost:9092"}
    assert config.producer_client == {}
    assert config.selector.select(["test", "test.mirror", "other"]) == ["test"]
    assert config.namer.destination_topic("test") == "test.mirror"
    assert isinstance(config.namer.policy, MirusNamingPolicy)
    assert config.raw == MIRUS_QUICKSTART
    # Defaults that differ from, or clarify, Mirus's.
    assert config.auto_offset_reset == "earliest"
    assert config.enable_partition_matching is None
    assert config.enable_destination_topic_checking is True
    assert config.monitor_poll_wait_ms == 2000
    assert config.poll_timeout_ms == 1000
    assert config.provenance_headers_enabled is True


def test_mm2_style_config_parses_and_prefixes_the_source_alias() -> None:
    config = submit(MM2_STYLE)
    assert (config.source_cluster_alias, config.target_cluster_alias) == ("A", "B")
    assert config.source_client == {"bootstrap.servers": "a1:9092,a2:9092"}
    assert config.destination_client == {"bootstrap.servers": "b1:9092"}
    assert config.namer.destination_topic("x") == "A.x"
    assert config.namer.is_cycle("B.x")
    assert config.selector.select(["x", "orders-eu", "orders-tmp", "y"]) == ["orders-eu", "x"]
    assert config.tasks_max == 4


def test_mm2_short_policy_names_and_identity() -> None:
    config = submit({**MM2_STYLE, "replication.policy.class": "IdentityReplicationPolicy"})
    assert isinstance(config.namer.policy, IdentityReplicationPolicy)
    assert config.namer.destination_topic("x") == "x"
    config = submit(
        {**MM2_STYLE, "replication.policy.class": "DefaultReplicationPolicy", "replication.policy.separator": "_"}
    )
    assert config.namer.destination_topic("x") == "A_x"


def test_source_alias_without_policy_class_means_mm2_default_policy() -> None:
    config = parse(**{"source.cluster.alias": "A", "target.cluster.alias": "B"})
    assert isinstance(config.namer.policy, DefaultReplicationPolicy)
    assert config.namer.destination_topic("t") == "A.t"


def test_source_alias_with_mirus_prefix_keeps_mirus_naming() -> None:
    config = parse(**{"source.cluster.alias": "A", "destination.topic.name.prefix": "dc1-"})
    assert config.namer.policy == MirusNamingPolicy(prefix="dc1-")
    assert config.source_cluster_alias == "A"


def test_json_numbers_and_booleans_are_accepted() -> None:
    config = parse(
        **{
            "tasks.max": 3,
            "enable.destination.topic.checking": False,
            "enable.partition.matching": "TRUE",
            "provenance.headers.enabled": "False",
            "poll.timeout.ms": 250.0,
            "consumer.fetch.min.bytes": 1,
            "consumer.check.crcs": True,
        }
    )
    assert config.tasks_max == 3
    assert config.enable_destination_topic_checking is False
    assert config.enable_partition_matching is True
    assert config.provenance_headers_enabled is False
    assert config.poll_timeout_ms == 250
    assert config.source_client["fetch.min.bytes"] == "1"
    assert config.source_client["check.crcs"] == "true"


def test_partition_matching_unset_true_false() -> None:
    assert parse().enable_partition_matching is None
    assert parse(**{"enable.partition.matching": "true"}).enable_partition_matching is True
    assert parse(**{"enable.partition.matching": "false"}).enable_partition_matching is False


def test_java_only_client_settings_are_dropped() -> None:
    config = parse(
        **{
            "consumer.key.deserializer": "org.apache.kafka.common.serialization.ByteArrayDeserializer",
            "consumer.value.deserializer": "org.apache.kafka.common.serialization.ByteArrayDeserializer",
            "consumer.interceptor.classes": "com.example.Interceptor",
            "consumer.partition.assignment.strategy": "org.apache.kafka.clients.consumer.RangeAssignor",
            "producer.key.serializer": "org.apache.kafka.common.serialization.ByteArraySerializer",
            "producer.value.serializer": "org.apache.kafka.common.serialization.ByteArraySerializer",
            "destination.consumer.key.deserializer": "org.apache.kafka.common.serialization.ByteArrayDeserializer",
        }
    )
    assert config.source_client == {"bootstrap.servers": "src:9092"}
    assert config.producer_client == {}
    assert config.destination_client == {"bootstrap.servers": "dst:9092"}
    # A librdkafka assignment strategy is a real setting and is kept.
    assert parse(**{"consumer.partition.assignment.strategy": "range"}).source_client[
        "partition.assignment.strategy"
    ] == ("range")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("latest", "latest"),
        ("LATEST", "latest"),
        ("largest", "latest"),
        ("earliest", "earliest"),
        ("smallest", "earliest"),
    ],
)
def test_auto_offset_reset_follows_mirus(value: str, expected: str) -> None:
    config = parse(**{"consumer.auto.offset.reset": value})
    assert config.auto_offset_reset == expected
    assert "auto.offset.reset" not in config.source_client


@pytest.mark.parametrize("value", ["none", "whatever", "sideways", ""])
def test_an_auto_offset_reset_that_is_neither_earliest_nor_latest_is_refused(value: str) -> None:
    # It used to run silently as earliest; Kafka's `none` (fail without a committed offset) is not supported.
    assert "must be earliest or latest" in error_for(
        "consumer.auto.offset.reset", **{"consumer.auto.offset.reset": value}
    )


def test_producer_bootstrap_serves_as_destination_bootstrap() -> None:
    config = submit(
        {k: v for k, v in BASE.items() if k != "destination.consumer.bootstrap.servers"}
        | {"producer.bootstrap.servers": "dst:9093", "producer.linger.ms": "5"}
    )
    assert config.destination_client == {"bootstrap.servers": "dst:9093"}
    assert config.producer_client == {"bootstrap.servers": "dst:9093", "linger.ms": "5"}
    producer = config.producer_settings(0)
    assert (producer["bootstrap.servers"], producer["linger.ms"], producer["client.id"]) == (
        "dst:9093",
        "5",
        "mirus-c-0",
    )


def test_deprecated_destination_bootstrap_spelling() -> None:
    props = {k: v for k, v in BASE.items() if k != "destination.consumer.bootstrap.servers"}
    config = submit({**props, "destination.bootstrap.servers": "dst:9092"})
    assert config.destination_client == {"bootstrap.servers": "dst:9092"}


def test_security_settings_reach_each_client() -> None:
    config = parse(
        **{
            "consumer.security.protocol": "SASL_SSL",
            "consumer.sasl.mechanism": "PLAIN",
            "consumer.sasl.username": "u",
            "consumer.sasl.password": "p4ssw0rd!",
            "destination.consumer.security.protocol": "SASL_PLAINTEXT",
            "destination.consumer.sasl.mechanism": "SCRAM-SHA-512",
            "destination.consumer.sasl.username": "bob",
            "destination.consumer.sasl.password": "s3cret",
            "producer.compression.type": "zstd",
        }
    )
    assert config.source_client["sasl.password"] == "p4ssw0rd!"
    assert config.destination_client["sasl.mechanism"] == "SCRAM-SHA-512"
    assert config.producer_settings(0)["security.protocol"] == "SASL_PLAINTEXT"
    assert config.producer_settings(0)["compression.type"] == "zstd"


def test_commonly_carried_connect_and_mm2_properties_are_ignored() -> None:
    config = parse(
        **{
            "key.converter": "org.apache.kafka.connect.converters.ByteArrayConverter",
            "value.converter.schemas.enable": "false",
            "header.converter": "org.apache.kafka.connect.converters.ByteArrayConverter",
            "errors.tolerance": "none",
            "config.action.reload": "restart",
            "predicates": "p",
            "replay.policy": "FILTER",
            "replay.window.records": "50000",
            "emit.heartbeats.enabled": "true",
            "emit.checkpoints.interval.seconds": "60",
            "sync.topic.configs.enabled": "true",
            "sync.topic.acls.enabled": "false",
            "refresh.topics.interval.seconds": "600",
            "refresh.groups.enabled": "false",
            "groups": ".*",
            "groups.exclude": "console-consumer-.*",
            "offset-syncs.topic.location": "target",
            "replication.factor": "3",
            "checkpoints.topic.replication.factor": "3",
            "heartbeats.topic.replication.factor": "3",
            "offset-syncs.topic.replication.factor": "3",
            "source.value.converter": "org.apache.kafka.connect.converters.ByteArrayConverter",
        }
    )
    assert config.name == "c"


def test_regex_router_transforms_follow_the_policy() -> None:
    config = parse(
        **{
            "destination.topic.name.prefix": "dc1.",
            "transforms": "strip, rename",
            "transforms.strip.type": "org.apache.kafka.connect.transforms.RegexRouter",
            "transforms.strip.regex": r"dc1\.(.*)",
            "transforms.strip.replacement": "copy-$1",
            "transforms.rename.type": "RegexRouter",
            "transforms.rename.regex": "copy-(?<t>.*)",
            "transforms.rename.replacement": "${t}.x",
        }
    )
    assert [r.regex for r in config.namer.routers] == [r"dc1\.(.*)", "copy-(?<t>.*)"]
    assert config.namer.destination_topic("orders") == "orders.x"


def test_selection_properties_are_comma_lists_with_whitespace_trimmed() -> None:
    config = parse(
        **{
            "topics.whitelist": " a , b,,c ",
            "topics.regex": "  r-.*  ",
            "topics.regex.list": "l1, ^l2-",
        }
    )
    assert config.selector.whitelist == frozenset({"a", "b", "c"})
    assert config.selector.regex == "r-.*"
    assert config.selector.regex_list == ("l1", "^l2-")


# --- rejected configs ------------------------------------------------------------------------------------------


def test_bad_tasks_max_names_the_property_and_value() -> None:
    err = errors_of({**BASE, "tasks.max": "x"})
    assert "tasks.max: must be an integer between 1 and 256, got 'x'" in str(err).splitlines()
    assert error_for("tasks.max", **{"tasks.max": 0}) == "must be an integer between 1 and 256, got 0"
    assert error_for("tasks.max", **{"tasks.max": True}) == "must be an integer between 1 and 256, got True"
    assert error_for("tasks.max", **{"tasks.max": 1.5}) == "must be an integer between 1 and 256, got 1.5"


def test_missing_source_bootstrap() -> None:
    reason = error_for("consumer.bootstrap.servers", **{"consumer.bootstrap.servers": None})
    assert "SOURCE" in reason and "required" in reason


def test_missing_destination_bootstrap() -> None:
    reason = error_for("destination.consumer.bootstrap.servers", **{"destination.consumer.bootstrap.servers": None})
    assert "DESTINATION" in reason and "required" in reason


def test_empty_bootstrap_names_the_spelling_used() -> None:
    reason = error_for(
        "source.cluster.bootstrap.servers",
        **{"consumer.bootstrap.servers": None, "source.cluster.bootstrap.servers": " "},
    )
    assert "required" in reason


def test_missing_name() -> None:
    assert error_for("name", name=None).startswith("required")
    assert "got 'my connector'" in error_for("name", name="my connector")
    assert error_for("name", name="x" * 201)


@pytest.mark.parametrize(
    ("typo", "suggestion"),
    [
        ("topics.whitelst", "topics.whitelist"),
        ("tasks.mx", "tasks.max"),
        ("consumr.bootstrap.servers", "consumer.bootstrap.servers"),
        ("destination.topic.name.sufix", "destination.topic.name.suffix"),
    ],
)
def test_unknown_property_suggests_the_closest_name(typo: str, suggestion: str) -> None:
    reason = error_for(typo, **{typo: "x"})
    assert reason == f"unknown property; did you mean {suggestion!r}?"


def test_unknown_property_without_a_close_match() -> None:
    assert error_for("completely.different", **{"completely.different": "x"}) == "unknown property"


@pytest.mark.parametrize("prop", ["topics.regex", "topics.regex.list", "topics", "topics.exclude"])
def test_bad_regex_names_the_property_and_pattern(prop: str) -> None:
    reason = error_for(prop, **{prop: "orders-("})
    assert "invalid regular expression 'orders-('" in reason


def test_unknown_transform_type() -> None:
    reason = error_for(
        "transforms.ts.type",
        **{"transforms": "ts", "transforms.ts.type": "org.apache.kafka.connect.transforms.TimestampRouter"},
    )
    assert "only RegexRouter" in reason and "TimestampRouter" in reason


def test_transform_problems() -> None:
    err = errors_of(
        {
            **BASE,
            "transforms": "a,b,c",
            "transforms.a.type": "RegexRouter",
            "transforms.a.regex": "(x)",
            "transforms.a.replacement": "$2",
            "transforms.b.regex": "y",
            "transforms.c.type": "RegexRouter",
            "transforms.c.regex": "(",
            "transforms.c.replacement": "z",
            "transforms.c.predicate": "isFoo",
            "transforms.unlisted.type": "Whatever",  # ignored, as Kafka Connect does
        }
    )
    reasons = dict(err.errors)
    assert set(reasons) == {
        "transforms.a.replacement",
        "transforms.b.type",
        "transforms.b.replacement",
        "transforms.c.regex",
        "transforms.c.predicate",
    }
    assert "no group 2" in reasons["transforms.a.replacement"]
    assert "predicates" in reasons["transforms.c.predicate"]


def test_unknown_librdkafka_setting() -> None:
    reason = error_for("consumer.fetch.bogus", **{"consumer.fetch.bogus": "1"})
    assert reason.startswith("unknown client setting 'fetch.bogus'")
    reason = error_for("destination.consumer.fetch.bogus", **{"destination.consumer.fetch.bogus": "1"})
    assert reason.startswith("unknown client setting 'fetch.bogus'")
    reason = error_for("producer.lingerms", **{"producer.lingerms": "1"})
    assert reason.startswith("unknown client setting 'lingerms'")


def test_invalid_librdkafka_values_name_the_users_property() -> None:
    assert "security.protocol" in error_for("consumer.security.protocol", **{"consumer.security.protocol": "bogus"})
    assert "bool" in error_for("consumer.enable.auto.commit", **{"consumer.enable.auto.commit": "maybe"})
    # librdkafka reports `linger.ms` under its alias queue.buffering.max.ms; the user's spelling is still named.
    assert "rejected by librdkafka" in error_for("producer.linger.ms", **{"producer.linger.ms": "soon"})
    assert "JAAS" in error_for("consumer.sasl.jaas.config", **{"consumer.sasl.jaas.config": "x required;"})


def test_incomplete_security_settings_name_what_is_missing() -> None:
    reason = error_for(
        "destination.consumer.sasl.username",
        **{"destination.consumer.security.protocol": "SASL_SSL", "destination.consumer.sasl.mechanism": "PLAIN"},
    )
    assert "sasl.username and sasl.password must be set" in reason
    err = errors_of(
        {**BASE, "destination.consumer.security.protocol": "SASL_SSL", "destination.consumer.sasl.mechanism": "PLAIN"}
    )
    assert len(err.errors) == 1  # not repeated for the producer built on the same settings


def test_code_loading_client_settings_are_refused() -> None:
    assert "not accepted" in error_for(
        "consumer.plugin.library.paths", **{"consumer.plugin.library.paths": "/tmp/evil.so"}
    )
    assert "not accepted" in error_for(
        "producer.sasl.kerberos.kinit.cmd", **{"producer.sasl.kerberos.kinit.cmd": "touch /tmp/x"}
    )


def test_two_spellings_of_one_client_setting_must_agree() -> None:
    reason = error_for("source.cluster.bootstrap.servers", **{"source.cluster.bootstrap.servers": "other:9092"})
    assert "conflicts with consumer.bootstrap.servers" in reason
    assert parse(**{"source.cluster.bootstrap.servers": "src:9092"}).source_client["bootstrap.servers"] == "src:9092"


def test_prefix_with_mm2_policy_is_ambiguous() -> None:
    reason = error_for(
        "destination.topic.name.prefix",
        **{"replication.policy.class": "DefaultReplicationPolicy", "destination.topic.name.prefix": "dc1."},
    )
    assert "replication.policy.class" in reason


def test_unsupported_policy_class() -> None:
    reason = error_for("replication.policy.class", **{"replication.policy.class": "com.example.MyPolicy"})
    assert "com.example.MyPolicy" in reason


def test_alias_containing_the_separator() -> None:
    reason = error_for("source.cluster.alias", **{"source.cluster.alias": "dc.1", "target.cluster.alias": "B"})
    assert "separator" in reason


def test_no_selection_is_rejected() -> None:
    err = errors_of({k: v for k, v in BASE.items() if k != "topics.whitelist"})
    assert (
        "topics.whitelist: no topics selected; set topics.whitelist, topics.regex, topics.regex.list or topics"
        in str(err).splitlines()
    )
    # Mirus's default "" is just as empty; an exclude alone selects nothing either.
    assert "no topics selected" in error_for("topics.whitelist", **{"topics.whitelist": ""})
    assert "no topics selected" in error_for("topics.whitelist", **{"topics.whitelist": None, "topics.exclude": "x"})


def test_bad_connector_class() -> None:
    assert "got 'com.example.Sink'" in error_for("connector.class", **{"connector.class": "com.example.Sink"})
    assert parse(**{"connector.class": "MirrorSourceConnector"}).connector_class == "MirrorSourceConnector"


@pytest.mark.parametrize(
    ("prop", "value", "expected"),
    [
        ("enable.partition.matching", "yes", "must be true or false, got 'yes'"),
        ("enable.destination.topic.checking", 1, "must be true or false, got 1"),
        ("poll.timeout.ms", "0", "must be an integer between 1 and 60000, got '0'"),
        ("poll.timeout.ms", 60001, "must be an integer between 1 and 60000, got 60001"),
        ("monitor.poll.wait.ms", "99", "must be an integer >= 100, got '99'"),
        ("commit.failure.restart.ms", "999", "must be an integer >= 1000, got '999'"),
        ("offset.flush.interval.ms", "-1", "must be an integer >= 100, got '-1'"),
        ("task.heartbeat.interval.ms", "fast", "must be an integer >= 100, got 'fast'"),
        ("task.lease.timeout.ms", "4000", "must be greater than 2 x task.heartbeat.interval.ms (4000), got 4000"),
        ("source.value.converter", "JsonConverter", "got 'JsonConverter'"),
    ],
)
def test_value_errors(prop: str, value: object, expected: str) -> None:
    assert expected in error_for(prop, **{prop: value})


@pytest.mark.parametrize(("value", "kind"), [(None, "null"), (["a"], "a list"), ({"a": 1}, "an object")])
def test_values_must_be_flat(value: object, kind: str) -> None:
    # Reported once, not again by the typed reader.
    err = errors_of({**BASE, "tasks.max": value})
    assert [e for e in err.errors if e[0] == "tasks.max"] == [
        ("tasks.max", f"must be a string, number or boolean, got {kind}")
    ]


def test_not_a_mapping() -> None:
    with pytest.raises(ConnectorConfigError, match="must be a JSON object"):
        submit(["name"])  # a list on purpose: `submit` takes Any


def test_all_problems_are_reported_together() -> None:
    err = errors_of(
        {
            "tasks.max": "many",
            "topics.whitelst": "t",
            "consumer.fetch.bogus": "1",
            "topics.regex": "(",
            "enable.partition.matching": "maybe",
            "destination.topic.name.prefix": "p.",
            "replication.policy.class": "Nope",
        }
    )
    names = [name for name, _ in err.errors]
    for expected in (
        "name",
        "tasks.max",
        "topics.whitelst",
        "consumer.fetch.bogus",
        "consumer.bootstrap.servers",
        "destination.consumer.bootstrap.servers",
        "topics.regex",
        "enable.partition.matching",
        "destination.topic.name.prefix",
        "replication.policy.class",
    ):
        assert expected in names, expected
    lines = str(err).splitlines()
    assert len(lines) == len(err.errors)
    assert all(line == f"{name}: {reason}" for line, (name, reason) in zip(lines, err.errors, strict=True))
    assert isinstance(err, ValueError)


# --- secrets ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "consumer.sasl.password",
        "producer.ssl.key.password",
        "destination.consumer.sasl.jaas.config",
        "consumer.ssl.key.pem",
        "consumer.ssl.certificate.pem",
        "consumer.sasl.oauthbearer.client.secret",
        "target.cluster.SASL.PASSWORD",
        "consumer.ssl.key",
        "some.credentials.file",
        "consumer.sasl.oauthbearer.token.endpoint.url",
    ],
)
def test_secret_property_names(name: str) -> None:
    assert is_secret_property(name)


@pytest.mark.parametrize(
    "name", ["consumer.sasl.username", "consumer.ssl.key.location", "key.converter", "tasks.max", "name"]
)
def test_non_secret_property_names(name: str) -> None:
    assert not is_secret_property(name)


SECRETS: dict[str, object] = {
    "consumer.security.protocol": "SASL_SSL",
    "consumer.sasl.mechanism": "PLAIN",
    "consumer.sasl.username": "alice",
    "consumer.sasl.password": "hunter2-source",
    "producer.ssl.key.password": "hunter2-producer",
    "destination.consumer.sasl.username": "bob",
    "destination.consumer.sasl.password": "hunter2-destination",
}


def test_masked_properties_hide_secret_values() -> None:
    config = parse(**SECRETS)
    masked = config.masked_properties()
    assert masked["consumer.sasl.password"] == SECRET_MASK
    assert masked["producer.ssl.key.password"] == SECRET_MASK
    assert masked["destination.consumer.sasl.password"] == SECRET_MASK
    assert masked["consumer.sasl.username"] == "alice"
    assert config.raw["consumer.sasl.password"] == "hunter2-source"  # the engine still needs it
    assert mask_properties(config.raw) == masked


def test_repr_and_str_hide_secret_values() -> None:
    config = parse(**SECRETS)
    for text in (repr(config), str(config)):
        assert "hunter2" not in text
        assert SECRET_MASK in text  # the client settings are shown, masked
        assert "alice" in text


def test_error_messages_never_show_secret_values() -> None:
    err = errors_of(
        {
            **BASE,
            **SECRETS,
            "consumer.sasl.jaas.config": 'PlainLoginModule required username="a" password="hunter2-jaas";',
            "destination.consumer.sasl.password": ["hunter2-in-a-list"],
            "tasks.max": "hunter2-source",  # a secret pasted into the wrong field is masked too
            "producer.ssl.key.password": "hunter2-producer",
            "producer.ssl.key.pem": "hunter2-not-a-pem",
            "producer.security.protocol": "SSL",
        }
    )
    text = str(err)
    assert "consumer.sasl.jaas.config" in text
    assert "tasks.max: must be an integer between 1 and 256, got '********'" in text.splitlines()
    assert "hunter2" not in text
    assert "hunter2" not in repr(err.errors)


def test_unknown_secret_client_setting_is_named_without_its_value() -> None:
    reason = error_for("consumer.sasl.passwrd.secret", **{"consumer.sasl.passwrd.secret": "hunter2-typo"})
    assert reason.startswith("unknown client setting 'sasl.passwrd.secret'")
    assert "hunter2" not in reason


# --- secret references -----------------------------------------------------------------------------------------

REFERENCED: dict[str, object] = {
    "consumer.security.protocol": "SASL_SSL",
    "consumer.sasl.mechanism": "PLAIN",
    "consumer.sasl.username": "alice",
    "consumer.sasl.password": "${env:MIRUS_TEST_SOURCE_PW}",
    "destination.consumer.security.protocol": "SASL_PLAINTEXT",
    "destination.consumer.sasl.mechanism": "SCRAM-SHA-512",
    "destination.consumer.sasl.username": "${env:MIRUS_TEST_DEST_USER}",
    "destination.consumer.sasl.password": "dest-${env:MIRUS_TEST_DEST_USER}-${env:MIRUS_TEST_DEST_PW}",
}


@pytest.fixture
def secret_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MIRUS_TEST_SOURCE_PW", "hunter2-source")
    monkeypatch.setenv("MIRUS_TEST_DEST_USER", "bob")
    monkeypatch.setenv("MIRUS_TEST_DEST_PW", "hunter2-destination")
    monkeypatch.delenv("MIRUS_TEST_MISSING", raising=False)


@pytest.mark.usefixtures("secret_env")
def test_references_are_resolved_for_the_clients_but_raw_keeps_them() -> None:
    config = parse(**REFERENCED)
    assert config.source_client["sasl.password"] == "hunter2-source"
    assert config.destination_client["sasl.username"] == "bob"
    assert config.destination_client["sasl.password"] == "dest-bob-hunter2-destination"
    assert config.producer_settings(0)["sasl.password"] == "dest-bob-hunter2-destination"
    assert config.raw == {**BASE, **REFERENCED}  # exactly as submitted: this is what gets stored


def test_file_references_reach_the_clients(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_ALLOWED_PATHS, str(tmp_path))
    secrets = tmp_path / "kafka.properties"
    secrets.write_text("# source cluster\nsasl.password = hunter2-file\n", encoding="utf-8")
    pem = tmp_path / "client.key.pem"
    pem.write_text("-----BEGIN PRIVATE KEY-----\nabc\n-----END PRIVATE KEY-----\n", encoding="utf-8")
    props = {
        "consumer.sasl.password": f"${{file:{secrets}:sasl.password}}",
        "producer.ssl.key.pem": f"${{file:{pem}}}",
        "producer.ssl.key.password": f"${{file:{secrets}:sasl.password}}",
    }
    config = parse(**props)
    assert config.source_client["sasl.password"] == "hunter2-file"
    assert config.producer_client["ssl.key.pem"] == "-----BEGIN PRIVATE KEY-----\nabc\n-----END PRIVATE KEY-----"
    assert config.raw == {**BASE, **props}


def test_references_are_accepted_in_client_settings_and_refused_in_shown_properties(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MIRUS_TEST_TASKS", "3")
    monkeypatch.setenv("MIRUS_TEST_BOOTSTRAP", "kafka-a:9092")
    config = parse(**{"consumer.bootstrap.servers": "${env:MIRUS_TEST_BOOTSTRAP}"})
    assert config.source_client["bootstrap.servers"] == "kafka-a:9092"
    assert config.raw["consumer.bootstrap.servers"] == "${env:MIRUS_TEST_BOOTSTRAP}"
    # The connector's own properties become names and numbers the platform shows: a reference is refused.
    for prop in ("tasks.max", "destination.topic.name.suffix", "name", "source.cluster.alias"):
        assert "only accepted in secret properties" in error_for(prop, **{prop: "${env:MIRUS_TEST_TASKS}"})


def test_a_regex_router_group_reference_is_not_a_secret_reference() -> None:
    config = parse(
        **{
            "transforms": "r",
            "transforms.r.type": "RegexRouter",
            "transforms.r.regex": "(?<t>.*)",
            "transforms.r.replacement": "${t}.x",
        }
    )
    assert config.namer.destination_topic("orders") == "orders.x"


@pytest.mark.usefixtures("secret_env")
def test_unresolvable_references_are_reported_per_property_all_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_ALLOWED_PATHS, str(tmp_path))
    secrets = tmp_path / "s.properties"
    secrets.write_text("other=hunter2-other\n", encoding="utf-8")
    missing_file = tmp_path / "missing"
    err = errors_of(
        {
            **BASE,
            "consumer.sasl.password": "${env:MIRUS_TEST_MISSING}",
            "producer.sasl.password": f"${{file:{secrets}:password}}",
            "destination.consumer.ssl.key.pem": f"${{file:{missing_file}}}",
            "consumer.sasl.jaas.config": 'PlainLoginModule required password="${vault:kafka/pw}";',
            "tasks.max": "x",
        }
    )
    reasons = dict(err.errors)
    assert reasons["consumer.sasl.password"] == (
        "cannot resolve ${env:MIRUS_TEST_MISSING}: environment variable MIRUS_TEST_MISSING is not set"
    )
    assert reasons["producer.sasl.password"] == (
        f"cannot resolve ${{file:{secrets}:password}}: {secrets} has no key 'password'"
    )
    assert reasons["destination.consumer.ssl.key.pem"] == (
        f"cannot resolve ${{file:{missing_file}}}: cannot read {missing_file}: No such file or directory"
    )
    assert reasons["consumer.sasl.jaas.config"].startswith(
        "cannot resolve ${vault:kafka/pw}: unknown config provider 'vault'"
    )
    assert reasons["tasks.max"] == "must be an integer between 1 and 256, got 'x'"
    # Each unresolved property is reported once: its reference text is not also judged as a value.
    assert [name for name, _ in err.errors].count("consumer.sasl.jaas.config") == 1
    assert f"consumer.sasl.password: {reasons['consumer.sasl.password']}" in str(err).splitlines()
    assert "hunter2" not in str(err)


@pytest.mark.usefixtures("secret_env")
def test_librdkafka_judges_resolved_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MIRUS_TEST_PROTOCOL", "bogus-protocol")
    reason = error_for("consumer.security.protocol", **{"consumer.security.protocol": "${env:MIRUS_TEST_PROTOCOL}"})
    assert reason.startswith("rejected by librdkafka")
    assert "bogus-protocol" not in reason  # a resolved value is never shown, secret or not
    monkeypatch.setenv("MIRUS_TEST_PROTOCOL", "SASL_SSL")
    # A resolved protocol needing credentials that are missing: librdkafka saw the resolved value.
    assert "sasl.username and sasl.password must be set" in error_for(
        "consumer.sasl.username",
        **{"consumer.security.protocol": "${env:MIRUS_TEST_PROTOCOL}", "consumer.sasl.mechanism": "PLAIN"},
    )


def test_resolved_values_never_appear_in_error_messages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MIRUS_TEST_LEAK", "hunter2-leak")
    monkeypatch.setenv("MIRUS_TEST_REGEX", "hunter2-(")
    err = errors_of(
        {
            **BASE,
            "tasks.max": "${env:MIRUS_TEST_LEAK}",
            "name": "${env:MIRUS_TEST_LEAK} x",
            "connector.class": "${env:MIRUS_TEST_LEAK}",
            "enable.partition.matching": "${env:MIRUS_TEST_LEAK}",
            "topics.regex": "${env:MIRUS_TEST_REGEX}",
            "destination.topic.name.prefix": "${env:MIRUS_TEST_LEAK}/",
            "consumer.sasl.jaas.config": 'x required password="${env:MIRUS_TEST_LEAK}";',
            "consumer.security.protocol": "${env:MIRUS_TEST_LEAK}",
        }
    )
    reasons = dict(err.errors)
    assert set(reasons) >= {
        "tasks.max",
        "name",
        "connector.class",
        "enable.partition.matching",
        "topics.regex",
        "destination.topic.name.prefix",
        "consumer.sasl.jaas.config",
        "consumer.security.protocol",
    }
    assert "only accepted in secret properties" in reasons["tasks.max"]
    assert "only accepted in secret properties" in reasons["topics.regex"]
    assert "hunter2" not in str(err)
    assert "hunter2" not in repr(err.errors)


@pytest.mark.usefixtures("secret_env")
def test_masked_properties_show_references_and_mask_literals() -> None:
    config = parse(**REFERENCED, **{"producer.ssl.key.password": "hunter2-literal"})
    masked = config.masked_properties()
    assert masked["consumer.sasl.password"] == "${env:MIRUS_TEST_SOURCE_PW}"
    assert masked["destination.consumer.sasl.password"] == REFERENCED["destination.consumer.sasl.password"]
    assert masked["producer.ssl.key.password"] == SECRET_MASK
    assert masked["consumer.sasl.username"] == "alice"
    assert "hunter2" not in repr(masked)
    assert mask_properties(config.raw) == masked


def test_mask_properties_masks_secrets_that_only_look_like_references() -> None:
    masked = mask_properties(
        {"a.password": "${env:X}", "b.password": "${unclosed", "c.password": "${group}", "d.password": 12345}
    )
    assert masked == {
        "a.password": "${env:X}",
        "b.password": SECRET_MASK,
        "c.password": SECRET_MASK,
        "d.password": SECRET_MASK,
    }


@pytest.mark.usefixtures("secret_env")
def test_repr_hides_resolved_secrets_and_resolved_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MIRUS_TEST_CLIENT_ID", "client-from-env")
    # A resolved secret that itself looks like a reference is still masked.
    monkeypatch.setenv("MIRUS_TEST_SOURCE_PW", "hunter2-${env:X}")
    config = parse(**REFERENCED, **{"consumer.client.id": "${env:MIRUS_TEST_CLIENT_ID}"})
    assert config.source_client["sasl.password"] == "hunter2-${env:X}"
    assert config.source_client["client.id"] == "client-from-env"
    for text in (repr(config), str(config)):
        assert "hunter2" not in text
        assert "client-from-env" not in text
        assert "bob" not in text  # the destination's user name came from a reference
        assert "'sasl.username': 'alice'" in text  # the source's did not


def test_literal_secrets() -> None:
    props: dict[str, object] = {
        **BASE,
        "consumer.sasl.username": "alice",
        "consumer.sasl.password": "hunter2",
        "destination.consumer.sasl.password": "${env:DEST_PW}",
        "destination.consumer.sasl.jaas.config": 'ScramLoginModule required username="u" password="${env:PW}";',
        "producer.ssl.key.password": "",
        "producer.ssl.key.pem": "${file:/run/secrets/client.key}",
        "consumer.ssl.key.password": "${unclosed",
        "consumer.sasl.oauthbearer.client.secret": 12345,
        "target.cluster.SASL.PASSWORD": "p",
    }
    assert literal_secrets(props) == [
        "consumer.sasl.password",
        "consumer.ssl.key.password",
        "consumer.sasl.oauthbearer.client.secret",
        "target.cluster.SASL.PASSWORD",
    ]
    assert literal_secrets(BASE) == []
    assert literal_secrets({**BASE, **REFERENCED}) == []


# --- exactly-once ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["required", "requested"])
def test_exactly_once_gives_each_task_a_transactional_producer(value: str) -> None:
    config = parse(**{"exactly.once.support": value})
    assert config.exactly_once and config.requires_destination_partition
    settings = config.producer_settings(3)
    assert settings["transactional.id"] == f"mirus-{config.name}-3"
    # A timed-out record fails its transaction (aborted, written again): librdkafka's transactional defaults apply.
    assert "message.timeout.ms" not in settings and "enable.gapless.guarantee" not in settings
    assert config.consumer_settings()["isolation.level"] == "read_committed"
    assert not parse().exactly_once and "transactional.id" not in parse().producer_settings(0)


@pytest.mark.parametrize(
    ("prop", "value", "reason"),
    [
        ("provenance.headers.enabled", "false", "must stay true"),
        ("enable.partition.matching", "false", "must not be false"),
        ("producer.transactional.id", "mine", "is set by the platform"),
        ("producer.enable.idempotence", "false", "must be true"),
        ("producer.acks", "1", "must be all"),
        ("consumer.isolation.level", "read_uncommitted", "must be read_committed"),
    ],
)
def test_settings_that_contradict_exactly_once_are_refused(prop: str, value: str, reason: str) -> None:
    assert reason in error_for(prop, **{"exactly.once.support": "required", prop: value})
    submit({**BASE, prop: value} if prop != "producer.transactional.id" else BASE)  # fine in at-least-once mode


@pytest.mark.parametrize(
    ("prop", "value", "reason"),
    [
        ("provenance.headers.enabled", "false", "must stay true with start.after.destination.copies=true"),
        ("producer.enable.gapless.guarantee", "false", "needs a producer whose acknowledgement stands"),
        ("producer.message.timeout.ms", "30000", "needs a producer whose acknowledgement stands"),
    ],
)
def test_starting_after_destination_copies_is_refused_where_a_copy_does_not_prove_the_records_before_it(
    prop: str, value: str, reason: str
) -> None:
    assert parse(**{"start.after.destination.copies": "true"}).start_after_destination_copies
    refused = prop if prop == "provenance.headers.enabled" else "start.after.destination.copies"
    assert reason in error_for(refused, **{"start.after.destination.copies": "true", prop: value})


def test_start_after_destination_copies_is_still_read_by_its_former_name() -> None:
    # `resume` is Kafka's word for a paused partition or connector going on; stored connectors keep the old name.
    assert parse(**{"resume.after.destination.copies": "true"}).start_after_destination_copies
    both = {"start.after.destination.copies": "true", "resume.after.destination.copies": "false"}
    assert "set only one" in error_for("resume.after.destination.copies", **both)


def test_an_unknown_exactly_once_value_is_refused() -> None:
    assert "disabled, requested or required" in error_for("exactly.once.support", **{"exactly.once.support": "on"})


@pytest.mark.parametrize(
    ("overrides", "ordered"),
    [
        ({}, True),  # idempotent, gapless, never gives a record up: one acknowledgement stands for a run
        ({"exactly.once.support": "required"}, True),  # a transaction commits only whole
        ({"producer.enable.gapless.guarantee": "false"}, False),  # a gap may hide before an acknowledged record
        ({"producer.message.timeout.ms": "30000"}, False),  # an expired record is not covered by gapless
        ({"producer.enable.idempotence": "false"}, False),  # acknowledgements in any order
    ],
)
def test_one_acknowledgement_stands_for_a_run_only_where_nothing_earlier_can_be_missing(
    overrides: dict[str, str], ordered: bool
) -> None:
    assert parse(**overrides).ordered_acks is ordered


SECURITY = {
    "security.protocol": "SASL_SSL",
    "sasl.mechanism": "SCRAM-SHA-512",
    "sasl.username": "replicator",
    "sasl.password": "${env:MIRUS_SECRET_CONFIG_TEST}",
    "ssl.ca.location": certifi.where(),  # librdkafka reads it when the config is checked
}


@pytest.mark.parametrize(
    ("source_prefix", "destination_prefix"),
    [
        ("consumer.", "destination.consumer."),
        ("source.cluster.", "target.cluster."),
        ("source.consumer.", "target.admin."),
        ("source.admin.", "target.consumer."),
    ],
)
def test_every_client_of_a_cluster_gets_its_security_settings_whichever_name_gives_them(
    source_prefix: str, destination_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MIRUS_SECRET_CONFIG_TEST", "pw")
    resolved = {**SECURITY, "sasl.password": "pw"}
    config = submit(
        {
            "name": "secured",
            "connector.class": "org.apache.kafka.connect.mirror.MirrorSourceConnector",
            "topics": "x",
            f"{source_prefix}bootstrap.servers": "a:9093",
            f"{destination_prefix}bootstrap.servers": "b:9093",
            **{source_prefix + k: v for k, v in SECURITY.items()},
            **{destination_prefix + k: v for k, v in {**SECURITY, "sasl.mechanism": "SCRAM-SHA-256"}.items()},
        }
    )
    for client in (config.consumer_settings(), config.admin_settings("source")):
        assert resolved.items() <= client.items()
    for client in (config.producer_settings(0), config.admin_settings("destination")):
        assert {**resolved, "sasl.mechanism": "SCRAM-SHA-256"}.items() <= client.items()
    assert "pw" not in repr(config)


def test_a_cluster_setting_given_twice_differently_is_refused() -> None:
    error = error_for(
        "source.admin.sasl.username", **{"source.cluster.sasl.username": "a", "source.admin.sasl.username": "b"}
    )
    assert "conflicts with source.cluster.sasl.username" in error


def test_a_java_jaas_login_becomes_librdkafkas_user_name_and_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MIRUS_SECRET_JAAS_TEST", "pw-1")
    module = "org.apache.kafka.common.security.scram.ScramLoginModule"
    jaas = f'{module} required username="b\\"ob" password="${{env:MIRUS_SECRET_JAAS_TEST}}";'
    config = submit(
        {
            **MM2_STYLE,
            "source.cluster.security.protocol": "SASL_SSL",
            "source.cluster.sasl.mechanism": "SCRAM-SHA-256",
            "source.cluster.sasl.jaas.config": jaas,
        }
    )
    assert {"sasl.username": 'b"ob', "sasl.password": "pw-1"}.items() <= config.admin_settings("source").items()
    assert "pw-1" not in repr(config)
    kerberos = "com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true;"
    assert "only a ScramLoginModule or PlainLoginModule" in error_for(
        "source.cluster.sasl.jaas.config", **{"source.cluster.sasl.jaas.config": kerberos}
    )
