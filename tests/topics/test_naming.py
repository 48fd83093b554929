"""Destination topic names and MM2's cycle rule (rules 1-7 of the MM2 theory notes)."""

from __future__ import annotations

import itertools

import pytest

from replicator.topics.naming import (
    DefaultReplicationPolicy,
    IdentityReplicationPolicy,
    MirusNamingPolicy,
    RegexRouter,
    ReplicationPolicy,
    TopicNamer,
)


def test_mirus_naming_keeps_names_by_default() -> None:
    policy = MirusNamingPolicy()
    assert policy.destination_topic("topic-1") == "topic-1"
    assert not policy.is_cycle("topic-1")


def test_mirus_prefix_and_suffix() -> None:
    policy = MirusNamingPolicy(prefix="dc1.", suffix=".mirror")
    assert policy.destination_topic("orders") == "dc1.orders.mirror"
    assert not policy.is_cycle("dc1.orders.mirror")


def test_unidirectional_flow_prefixes_the_source_alias() -> None:
    # Rules 1 and 5: topic-1 on A is replicated to A.topic-1 on B.
    flow = DefaultReplicationPolicy("A", "B")
    assert flow.destination_topic("topic-1") == "A.topic-1"
    assert not flow.is_cycle("topic-1")


def test_custom_separator() -> None:
    flow = DefaultReplicationPolicy("A", "B", separator="_")
    assert flow.destination_topic("topic-1") == "A_topic-1"
    assert flow.is_cycle("B_topic-1")
    assert not flow.is_cycle("B.topic-1")


def test_pipe_forwards_remote_topics() -> None:
    # Rule 6 (pipe A -> B -> C): A.topic-1 on B goes on to C, carrying both aliases.
    b_to_c = DefaultReplicationPolicy("B", "C")
    assert not b_to_c.is_cycle("A.topic-1")
    assert b_to_c.destination_topic("A.topic-1") == "B.A.topic-1"
    # A topic whose chain does not contain the target is never a cycle, however long the chain.
    assert not DefaultReplicationPolicy("A", "C").is_cycle("A.B.topic-1")


def test_bidirectional_flows_do_not_reflect() -> None:
    # Rule 7: A.topic-1 on B came from A, so B -> A must not copy it back; B's own topic-1 does go.
    b_to_a = DefaultReplicationPolicy("B", "A")
    assert b_to_a.is_cycle("A.topic-1")
    assert not b_to_a.is_cycle("topic-1")
    assert b_to_a.destination_topic("topic-1") == "B.topic-1"
    a_to_b = DefaultReplicationPolicy("A", "B")
    assert a_to_b.is_cycle("B.topic-1")
    assert a_to_b.is_cycle("C.B.topic-1")  # the target alias anywhere in the chain


def test_a_topic_named_after_its_own_source_is_not_a_cycle() -> None:
    assert not DefaultReplicationPolicy("A", "B").is_cycle("A.topic-1")


def test_no_alias_ever_appears_twice_in_any_topology() -> None:
    # Rule 7's corollary: with flows between every pair of A, B and C, replication reaches a fixed point and no
    # name such as A.B.A.topic-1 can be produced.
    clusters = ("A", "B", "C")
    topics = {c: {"topic-1"} for c in clusters}
    flows = [DefaultReplicationPolicy(s, t) for s, t in itertools.permutations(clusters, 2)]
    for _ in range(10):
        changed = False
        for flow in flows:
            for topic in list(topics[flow.source_alias]):
                if flow.is_cycle(topic):
                    continue
                remote = flow.destination_topic(topic)
                if remote not in topics[flow.target_alias]:
                    topics[flow.target_alias].add(remote)
                    changed = True
        if not changed:
            break
    else:
        pytest.fail("replication between three clusters never settled")
    every = set().union(*topics.values())
    assert "A.B.A.topic-1" not in every
    for topic in every:
        aliases = topic.split(".")[:-1]
        assert len(aliases) == len(set(aliases)), topic
    assert "B.A.topic-1" in topics["C"]  # pipe A -> B -> C
    assert "C.B.topic-1" in topics["A"]  # B's topic reaches A through C as well as directly
    assert "B.topic-1" in topics["A"]


@pytest.mark.parametrize(
    ("topic", "source", "upstream"),
    [
        ("t", None, None),
        ("A.t", "A", "t"),
        ("A.B.t", "A", "B.t"),
        ("A.", None, None),  # nothing after the separator: not a remote topic (MM2's topicSource)
        ("A..", None, None),
        ("A..t", "A", ".t"),
    ],
)
def test_topic_source_parsing(topic: str, source: str | None, upstream: str | None) -> None:
    policy = DefaultReplicationPolicy("X", "Y")
    assert policy.topic_source(topic) == source
    assert policy.upstream_topic(topic) == upstream


@pytest.mark.parametrize(
    ("source", "target", "separator"), [("A.1", "B", "."), ("A", "B.1", "."), ("", "B", "."), ("A", "B", "")]
)
def test_unparseable_aliases_are_rejected(source: str, target: str, separator: str) -> None:
    with pytest.raises(ValueError):
        DefaultReplicationPolicy(source, target, separator)


def test_identity_keeps_names_and_cannot_detect_cycles() -> None:
    policy = IdentityReplicationPolicy("A", "B")
    assert policy.destination_topic("topic-1") == "topic-1"
    assert not policy.is_cycle("topic-1")
    assert not policy.is_cycle("B.topic-1")
    assert "cycle" in (IdentityReplicationPolicy.__doc__ or "")


@pytest.mark.parametrize(
    "policy",
    [MirusNamingPolicy(), DefaultReplicationPolicy("A", "B"), IdentityReplicationPolicy("A", "B")],
)
def test_policies_satisfy_the_protocol(policy: ReplicationPolicy) -> None:
    assert isinstance(policy, ReplicationPolicy)


def test_regex_router_group_references() -> None:
    router = RegexRouter(r"(.*)-(.*)", "$2.$1")
    assert router.route("orders-eu") == "eu.orders"
    assert RegexRouter(r"(.*)-(.*)", "$2$1.x").route("ab-cd") == "cdab.x"


def test_regex_router_only_renames_on_a_full_match() -> None:
    router = RegexRouter("orders", "renamed")
    assert router.route("orders") == "renamed"
    assert router.route("orders-eu") == "orders-eu"
    assert router.route("eu-orders") == "eu-orders"


def test_regex_router_named_groups_and_escapes() -> None:
    router = RegexRouter(r"(?<name>[a-z]+)-(?<env>prod|dev)", r"${env}_${name}\$")
    assert router.route("orders-prod") == "prod_orders$"


def test_regex_router_multi_digit_reference_follows_java() -> None:
    # Java reads `$12` as group 1 followed by "2" when the pattern has fewer than 12 groups.
    assert RegexRouter("(a)", "$12").route("a") == "a2"
    assert RegexRouter("(a)", "$0!").route("a") == "a!"


def test_regex_router_unmatched_optional_group_is_empty() -> None:
    assert RegexRouter("(a)?(b)", "[$1$2]").route("b") == "[b]"


@pytest.mark.parametrize(
    ("regex", "replacement", "problem"),
    [
        ("(a)", "$2", "no group 2"),
        ("(a)", "${nope}", "no group named"),
        ("(a)", "x$", "group index is missing"),
        ("(a)", "x\\", "escaped is missing"),
        ("(a)", "${", "followed by a name"),
        ("(a", "$1", "invalid regular expression"),
    ],
)
def test_regex_router_rejects_invalid_config(regex: str, replacement: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        RegexRouter(regex, replacement)


def test_namer_applies_routers_after_the_policy_in_order() -> None:
    namer = TopicNamer(
        DefaultReplicationPolicy("A", "B"),
        (RegexRouter(r"A\.(.*)", "mirror-$1"), RegexRouter(r"mirror-(.*)", "$1-copy")),
    )
    assert namer.destination_topic("orders") == "orders-copy"
    # The router sees the policy's output: a router written against the source name does nothing.
    assert TopicNamer(DefaultReplicationPolicy("A", "B"), (RegexRouter("orders", "x"),)).destination_topic(
        "orders"
    ) == ("A.orders")


def test_namer_delegates_cycles_to_the_policy() -> None:
    namer = TopicNamer(DefaultReplicationPolicy("A", "B"), (RegexRouter("(.*)", "x-$1"),))
    assert namer.is_cycle("B.orders")
    assert not namer.is_cycle("orders")
    assert not TopicNamer().is_cycle("B.orders")
    assert TopicNamer().destination_topic("orders") == "orders"
