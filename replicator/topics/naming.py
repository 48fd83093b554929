"""Destination topic names, and which source topics must never be replicated back (cycles).

Two naming traditions meet here. Mirus keeps names (optionally adding a prefix/suffix) and leaves loops to the
operator; MirrorMaker 2 prefixes the source cluster's alias (`A.topic`) so that a topic's name records the
clusters it passed through, which is what lets MM2 refuse to copy a topic back to a cluster it came from
(MM2 rule 7). Both are offered; with names that do not record the path, cycles are stopped per record by the
provenance headers (`replicator.topics.provenance`) instead. Kafka Connect's RegexRouter renames are applied after the
policy, exactly as an SMT would see the policy's output.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Protocol, runtime_checkable

from replicator.topics.selection import compile_java_regex


@runtime_checkable
class ReplicationPolicy(Protocol):
    """How a source topic is named on the destination, and whether it must not be replicated at all."""

    def destination_topic(self, source_topic: str) -> str:
        """The destination topic that records of `source_topic` are written to."""
        ...

    def is_cycle(self, source_topic: str) -> bool:
        """True when `source_topic` originated at the destination cluster and must never be replicated back."""
        ...


@dataclass(frozen=True)
class MirusNamingPolicy:
    """Mirus naming: destination = prefix + source topic + suffix.

    The name says nothing about where a topic came from, so `is_cycle` is always False; a bidirectional pair
    of connectors is kept from looping by the provenance headers (a record's origin cluster id), record by record.
    """

    prefix: str = ""
    suffix: str = ""

    def destination_topic(self, source_topic: str) -> str:
        return f"{self.prefix}{source_topic}{self.suffix}"

    def is_cycle(self, source_topic: str) -> bool:
        return False


@dataclass(frozen=True)
class DefaultReplicationPolicy:
    """MirrorMaker 2's DefaultReplicationPolicy: remote topics are named `<source alias><separator><topic>`.

    Because each hop prepends its source alias, a topic's name lists the clusters it came through (`A.B.t` was
    produced on A, copied to B, then to the cluster holding it). A topic whose alias chain contains the target
    alias started at the target and is a cycle, so with target B: `B.t` and `A.B.t` are refused, `A.t` and `t`
    are not, and a name like `A.B.A.t` can never be produced. Aliases must not contain the separator, otherwise
    the chain could not be parsed back.
    """

    source_alias: str
    target_alias: str
    separator: str = "."

    def __post_init__(self) -> None:
        if not self.separator:
            raise ValueError("the separator must not be empty")
        for role, alias in (("source", self.source_alias), ("target", self.target_alias)):
            if not alias:
                raise ValueError(f"the {role} alias must not be empty")
            if self.separator in alias:
                raise ValueError(f"the {role} alias {alias!r} must not contain the separator {self.separator!r}")

    def destination_topic(self, source_topic: str) -> str:
        return f"{self.source_alias}{self.separator}{source_topic}"

    def topic_source(self, topic: str) -> str | None:
        """The alias of the cluster `topic` was replicated from, or None for a topic that is not remote.

        As MM2's `topicSource`: the text before the first separator is an alias only if something other than
        separators follows it (Java's `split` drops trailing empty parts), so `A.` and `t` are not remote.
        """
        parts = topic.split(self.separator)
        while parts and parts[-1] == "":
            parts.pop()
        return parts[0] if len(parts) >= 2 else None

    def upstream_topic(self, topic: str) -> str | None:
        """The name `topic` had on the cluster it was replicated from (one hop back), or None if not remote."""
        source = self.topic_source(topic)
        if source is None:
            return None
        return topic[len(source) + len(self.separator) :]

    def is_cycle(self, source_topic: str) -> bool:
        topic: str | None = source_topic
        while topic is not None:
            source = self.topic_source(topic)
            if source is None:
                return False
            if source == self.target_alias:
                return True
            topic = self.upstream_topic(topic)
        return False


@dataclass(frozen=True)
class IdentityReplicationPolicy:
    """MirrorMaker 2's IdentityReplicationPolicy: the destination topic has the source topic's name.

    Wanted for migrations and for consumers that must not learn new names, but the name no longer records
    where a topic came from, so MM2 loses its name-based cycle detection and `is_cycle` is always False here.
    Two connectors replicating the same topic in opposite directions would loop forever on names alone; the
    provenance headers (a record's origin cluster id) are what stop records from going back to their origin.
    """

    source_alias: str
    target_alias: str

    def destination_topic(self, source_topic: str) -> str:
        return source_topic

    def is_cycle(self, source_topic: str) -> bool:
        return False


def _java_replacement_to_python(replacement: str, pattern: re.Pattern[str]) -> str:
    """Translate a Java `Matcher.replaceFirst` replacement into a Python `Match.expand` template.

    Follows Java's parsing exactly: `\\x` is a literal `x`; `$n` takes as many digits as still name an existing
    group (so `$12` with one group is group 1 then `2`); `${name}` is a named group. Errors name what is wrong,
    as Java's IllegalArgumentException/IndexOutOfBoundsException would.
    """
    out: list[str] = []
    i, n = 0, len(replacement)
    while i < n:
        c = replacement[i]
        if c == "\\":
            if i + 1 == n:
                raise ValueError(f"invalid replacement {replacement!r}: character to be escaped is missing")
            out.append(replacement[i + 1].replace("\\", "\\\\"))
            i += 2
        elif c == "$":
            i += 1
            if i == n:
                raise ValueError(f"invalid replacement {replacement!r}: group index is missing after '$'")
            if replacement[i] == "{":
                close = replacement.find("}", i + 1)
                name = replacement[i + 1 : close] if close >= 0 else ""
                if close < 0 or not name:
                    raise ValueError(f"invalid replacement {replacement!r}: '${{' must be followed by a name and '}}'")
                if name not in pattern.groupindex:
                    raise ValueError(f"invalid replacement {replacement!r}: the regex has no group named {name!r}")
                out.append(f"\\g<{name}>")
                i = close + 1
            elif replacement[i].isdigit() and replacement[i].isascii():
                number = int(replacement[i])
                i += 1
                while i < n and replacement[i].isdigit() and replacement[i].isascii():
                    longer = number * 10 + int(replacement[i])
                    if longer > pattern.groups:
                        break
                    number = longer
                    i += 1
                if number > pattern.groups:
                    raise ValueError(f"invalid replacement {replacement!r}: the regex has no group {number}")
                out.append(f"\\g<{number}>")
            else:
                raise ValueError(
                    f"invalid replacement {replacement!r}: '$' must be followed by a group number or {{name}}"
                )
        else:
            out.append(c)
            i += 1
    return "".join(out)


@lru_cache(maxsize=1024)
def _compiled_router(regex: str, replacement: str) -> tuple[re.Pattern[str], str]:
    pattern = compile_java_regex(regex)
    return pattern, _java_replacement_to_python(replacement, pattern)


@dataclass(frozen=True)
class RegexRouter:
    """Kafka Connect's `org.apache.kafka.connect.transforms.RegexRouter`, applied to topic names.

    When `regex` matches the WHOLE topic name, the name becomes `replacement` with Java group references
    (`$1`, `${name}`) filled in; any other name passes unchanged. Invalid regexes or references raise
    `ValueError` at construction, not on the first record.
    """

    regex: str
    replacement: str

    def __post_init__(self) -> None:
        _compiled_router(self.regex, self.replacement)

    def route(self, topic: str) -> str:
        pattern, template = _compiled_router(self.regex, self.replacement)
        match = pattern.fullmatch(topic)
        return match.expand(template) if match else topic


@dataclass(frozen=True)
class TopicNamer:
    """A replication policy followed by RegexRouter renames: the complete source → destination name mapping.

    Cycle detection looks at the source name through the policy only: routers rename what the policy produced
    and cannot make a topic's origin any clearer.
    """

    policy: ReplicationPolicy = field(default_factory=MirusNamingPolicy)
    routers: tuple[RegexRouter, ...] = ()

    def destination_topic(self, source_topic: str) -> str:
        name = self.policy.destination_topic(source_topic)
        for router in self.routers:
            name = router.route(name)
        return name

    def is_cycle(self, source_topic: str) -> bool:
        return self.policy.is_cycle(source_topic)
