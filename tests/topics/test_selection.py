"""Topic selection: Mirus whitelist/regex/regex.list and MM2 topics/topics.exclude, internal topics never."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from replicator.topics.selection import TopicSelector, compile_java_regex, is_internal_topic, regex_list_pattern


@pytest.mark.parametrize(
    "topic",
    [
        "__consumer_offsets",
        "__transaction_state",
        ".hidden",
        "connect-offsets.internal",
        "app-KSTREAM-AGGREGATE-STATE-STORE-0000000001-changelog-internal",
        "mm2-offset-syncs.B.internal",
        "A.checkpoints.internal",
        "orders.replica",
    ],
)
def test_internal_topics_are_recognised(topic: str) -> None:
    assert is_internal_topic(topic)


@pytest.mark.parametrize("topic", ["orders", "internal", "orders_internal", "replica-orders", "A.orders", "_single"])
def test_ordinary_topics_are_not_internal(topic: str) -> None:
    assert not is_internal_topic(topic)


def test_whitelist_is_exact() -> None:
    selector = TopicSelector(whitelist=frozenset({"orders"}))
    assert selector.matches("orders")
    assert not selector.matches("orders-eu")
    assert not selector.matches("order")
    assert not selector.matches("my-orders")


def test_regex_must_match_the_whole_name() -> None:
    selector = TopicSelector(regex="orders")
    assert selector.matches("orders")
    assert not selector.matches("orders-eu")
    assert not selector.matches("eu-orders")
    assert TopicSelector(regex="orders.*").matches("orders-eu")


def test_empty_regex_means_unset() -> None:
    selector = TopicSelector(regex="")
    assert selector.regex is None
    assert not selector.matches("anything")
    assert selector.selects_nothing


def test_regex_list_entry_without_caret_is_anchored_at_both_ends() -> None:
    selector = TopicSelector(regex_list=("abc_cde",))
    assert selector.matches("abc_cde")
    assert not selector.matches("xabc_cde")
    assert not selector.matches("abc_cdex")


def test_regex_list_entry_with_caret_is_used_as_written() -> None:
    # An entry starting with `^` is searched, so it selects by prefix (Mirus behaviour).
    selector = TopicSelector(regex_list=("^logs-",))
    assert selector.matches("logs-app")
    assert not selector.matches("app-logs-")


def test_regex_list_alternation_still_needs_a_full_match() -> None:
    selector = TopicSelector(regex_list=("a|b",))
    assert selector.matches("a")
    assert selector.matches("b")
    assert not selector.matches("ax")
    assert not selector.matches("xb")


def test_regex_list_matches_mirus_example() -> None:
    # From Mirus's own SourceConfig test: "abc_cde, abc\.([a-zA-Z0-9]+)\.log".
    selector = TopicSelector(regex_list=("abc_cde", r"abc\.([a-zA-Z0-9]+)\.log"))
    assert selector.matches("abc.123a.log")
    assert selector.matches("abc_cde")
    assert not selector.matches("abc.123a.logs")


def test_regex_list_keeps_leading_inline_flags() -> None:
    assert regex_list_pattern("(?i)orders").search("ORDERS")
    assert not regex_list_pattern("(?i)orders").search("ORDERS-eu")


def test_include_patterns_full_match_any_one() -> None:
    selector = TopicSelector(include=("orders", "payments-.*"))
    assert selector.matches("orders")
    assert selector.matches("payments-eu")
    assert not selector.matches("orders-eu")
    assert not selector.matches("refunds")


def test_excludes_beat_every_kind_of_include() -> None:
    selector = TopicSelector(
        whitelist=frozenset({"secret-a"}),
        regex="secret-b",
        regex_list=("secret-c",),
        include=("secret-.*", "public"),
        exclude=("secret-.*",),
    )
    for topic in ("secret-a", "secret-b", "secret-c", "secret-d"):
        assert not selector.matches(topic), topic
    assert selector.matches("public")


def test_exclude_must_match_the_whole_name() -> None:
    selector = TopicSelector(include=(".*",), exclude=("tmp",))
    assert not selector.matches("tmp")
    assert selector.matches("tmp-orders")


@pytest.mark.parametrize(
    "selector",
    [
        TopicSelector(include=(".*",)),
        TopicSelector(regex=".*"),
        TopicSelector(regex_list=("^.*",)),
        TopicSelector(whitelist=frozenset({"__consumer_offsets", "x.internal", ".hidden", "t.replica"})),
    ],
)
def test_internal_topics_are_never_selected(selector: TopicSelector) -> None:
    for topic in ("__consumer_offsets", "x.internal", "x-internal", ".hidden", "t.replica"):
        assert not selector.matches(topic)


def test_select_is_sorted_and_deduplicated() -> None:
    selector = TopicSelector(whitelist=frozenset({"b", "a"}), include=("c.*",))
    assert selector.select(["c2", "b", "zz", "a", "b", "c1", "__consumer_offsets"]) == ["a", "b", "c1", "c2"]


@pytest.mark.parametrize("field", ["regex", "regex_list", "include", "exclude"])
def test_invalid_regex_raises_value_error_naming_the_pattern(field: str) -> None:
    value = "orders-(" if field == "regex" else ("ok", "orders-(")
    with pytest.raises(ValueError, match=r"orders-\("):
        TopicSelector(**{field: value})


def test_java_regex_syntax_is_understood() -> None:
    assert TopicSelector(include=(r"(?<env>prod|dev)-\k<env>",)).matches("prod-prod")
    assert TopicSelector(include=(r"\Qa.b\E-.*",)).matches("a.b-x")
    assert not TopicSelector(include=(r"\Qa.b\E-.*",)).matches("aXb-x")
    assert TopicSelector(include=(r"orders\z",)).matches("orders")


def test_invalid_java_only_syntax_is_reported() -> None:
    with pytest.raises(ValueError, match="invalid regular expression"):
        compile_java_regex(r"\p{Alpha}+")


def test_selector_is_frozen_and_patterns_compiled_once() -> None:
    selector = TopicSelector(include=("orders.*",))
    with pytest.raises(ValidationError):
        selector.include = ("x",)  # type: ignore[misc]  # deliberate: assigning a frozen field must raise
    before = compile_java_regex.cache_info().misses
    for i in range(2000):
        selector.matches(f"orders-{i}")
    assert compile_java_regex.cache_info().misses == before
