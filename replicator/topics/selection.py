"""Which source topics a connector replicates.

Users arrive with Mirus selections (`topics.whitelist`, `topics.regex`, `topics.regex.list`) or MirrorMaker 2
selections (`topics`, `topics.exclude`), both written as Java regular expressions. One selector understands all
of them so a connector behaves the same whichever dialect its config was written in. Cluster-internal topics are
refused here, not left to the user's excludes: replicating `__consumer_offsets` or a Connect/Streams internal
topic is never what anyone wants, and MM2's defaults that guard against it vanish as soon as a user sets
`topics.exclude` themselves.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from pydantic import BaseModel, ConfigDict, PrivateAttr, field_validator

_INTERNAL_PREFIXES = ("__", ".")
_INTERNAL_SUFFIXES = (".internal", "-internal", ".replica")


def is_internal_topic(topic: str) -> bool:
    """True for topics owned by Kafka, Connect, Streams or MM2 itself, which are never replicated.

    `__*` (broker internals such as `__consumer_offsets`), names starting with `.`, `*.internal` and `*-internal`
    (Connect, Streams and MM2 bookkeeping) and `*.replica` (MM2's default exclude). Copying them would corrupt the
    destination's own bookkeeping, so no selection can override this.
    """
    return topic.startswith(_INTERNAL_PREFIXES) or topic.endswith(_INTERNAL_SUFFIXES)


def _translate_java_regex(pattern: str) -> str:
    """Rewrite the Java-only syntax users copy from Mirus/MM2 configs into Python `re` syntax.

    Covers what differs in practice between the two dialects for topic names: named groups `(?<name>…)`,
    back-references `\\k<name>`, literal quoting `\\Q…\\E` and the absolute end anchor `\\z`. Anything else Java
    accepts but Python does not (e.g. `\\p{Alpha}`) is left alone so that compiling reports it.
    """
    out: list[str] = []
    i, n = 0, len(pattern)
    in_class = False
    while i < n:
        c = pattern[i]
        if c == "\\" and i + 1 < n:
            nxt = pattern[i + 1]
            if nxt == "Q":
                end = pattern.find("\\E", i + 2)
                literal = pattern[i + 2 :] if end < 0 else pattern[i + 2 : end]
                out.append(re.escape(literal))
                i = n if end < 0 else end + 2
                continue
            if nxt == "z" and not in_class:
                out.append("\\Z")
                i += 2
                continue
            if nxt == "k" and not in_class and pattern.startswith("<", i + 2):
                close = pattern.find(">", i + 3)
                if close > 0:
                    out.append(f"(?P={pattern[i + 3 : close]})")
                    i = close + 1
                    continue
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            if c == "]":
                in_class = False
        elif c == "[":
            in_class = True
            out.append(c)
            i += 1
            # A `]` right after `[` or `[^` is a literal member, not the end of the class.
            if pattern.startswith("^", i):
                out.append("^")
                i += 1
            if pattern.startswith("]", i):
                out.append("]")
                i += 1
            continue
        elif pattern.startswith("(?<", i) and i + 3 < n and pattern[i + 3] not in "=!":
            out.append("(?P<")
            i += 3
            continue
        out.append(c)
        i += 1
    return "".join(out)


@lru_cache(maxsize=4096)
def compile_java_regex(pattern: str) -> re.Pattern[str]:
    """Compile a regex written for Java (as Kafka configs are), raising `ValueError` that names the pattern.

    Cached because the same handful of patterns is compiled by every config parse and every selector.
    """
    try:
        return re.compile(_translate_java_regex(pattern))
    except re.error as err:
        raise ValueError(f"invalid regular expression {pattern!r}: {err}") from None


_LEADING_GLOBAL_FLAGS = re.compile(r"(?:\(\?[aiLmsux]+\))+")


@lru_cache(maxsize=4096)
def regex_list_pattern(entry: str) -> re.Pattern[str]:
    """How Mirus reads one `topics.regex.list` entry: one not starting with `^` must match the whole name.

    Mirus wraps such an entry as `^entry$` and searches with it; we wrap it as `^(?:entry)$` so that an
    alternation like `a|b` still has to match the whole name (Mirus's literal wrapping would let `a|b` match any
    topic starting with `a` or ending with `b`). An entry that starts with `^` is used as written and searched,
    so `^logs-` selects every topic starting with `logs-`. Leading inline flags such as `(?i)` stay in front.
    """
    if entry.startswith("^"):
        return compile_java_regex(entry)
    flags = _LEADING_GLOBAL_FLAGS.match(entry)
    head = flags.group(0) if flags else ""
    try:
        return compile_java_regex(f"{head}^(?:{entry[len(head) :]})$")
    except ValueError:
        # Report the error against what the user wrote, not against our wrapping.
        compile_java_regex(entry)
        raise


class TopicSelector(BaseModel):
    """The topics one connector replicates, from Mirus and/or MM2 style selections.

    A topic is selected when it is not internal, matches no `exclude` pattern, and is in `whitelist`, fully
    matches `regex`, matches an entry of `regex_list` (see `regex_list_pattern`) or fully matches an `include`
    pattern. Excludes win over every kind of include, as in MM2. Patterns are compiled once per selector because
    the monitor asks about every topic of the source cluster on every poll.
    """

    model_config = ConfigDict(frozen=True)

    whitelist: frozenset[str] = frozenset()
    regex: str | None = None
    regex_list: tuple[str, ...] = ()
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    _regex: re.Pattern[str] | None = PrivateAttr(default=None)
    _regex_list: tuple[re.Pattern[str], ...] = PrivateAttr(default=())
    _include: tuple[re.Pattern[str], ...] = PrivateAttr(default=())
    _exclude: tuple[re.Pattern[str], ...] = PrivateAttr(default=())

    @field_validator("regex")
    @classmethod
    def _empty_regex_is_unset(cls, value: str | None) -> str | None:
        # Mirus's default `topics.regex` is "" and means "no regex"; an empty Python pattern would match nothing
        # under fullmatch anyway, but keeping one spelling of "unset" makes configs compare equal.
        if value is None or value == "":
            return None
        compile_java_regex(value)
        return value

    @field_validator("regex_list")
    @classmethod
    def _valid_regex_list(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in value:
            regex_list_pattern(pattern)
        return value

    @field_validator("include", "exclude")
    @classmethod
    def _valid_patterns(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in value:
            compile_java_regex(pattern)
        return value

    def model_post_init(self, context: Any, /) -> None:
        self._regex = compile_java_regex(self.regex) if self.regex else None
        self._regex_list = tuple(regex_list_pattern(p) for p in self.regex_list)
        self._include = tuple(compile_java_regex(p) for p in self.include)
        self._exclude = tuple(compile_java_regex(p) for p in self.exclude)

    @property
    def selects_nothing(self) -> bool:
        """True when no include of any kind is set: such a selector can never select a topic."""
        return not (self.whitelist or self.regex or self.regex_list or self.include)

    def matches(self, topic: str) -> bool:
        """Whether `topic` is replicated by this selector."""
        return bool(self.select([topic]))

    def select(self, topics: Iterable[str]) -> list[str]:
        """The selected topics among `topics`, sorted and without duplicates (a stable order for assignment)."""
        # Private attributes read once: each read goes through pydantic's __getattr__, which cost the metadata
        # watcher most of its round when a hundred connectors each matched every topic of a cluster.
        whitelist, regex, regex_list, include, exclude = (
            self.whitelist,
            self._regex,
            self._regex_list,
            self._include,
            self._exclude,
        )

        def matches(topic: str) -> bool:
            if is_internal_topic(topic) or any(p.fullmatch(topic) for p in exclude):
                return False
            return (
                topic in whitelist
                or (regex is not None and regex.fullmatch(topic) is not None)
                or any(p.search(topic) for p in regex_list)
                or any(p.fullmatch(topic) for p in include)
            )

        return sorted({t for t in topics if matches(t)})
