"""The topic rules of a connector config: which source topics are selected (Mirus whitelists and regexes, MM2
`topics` / `topics.exclude`) and what they are called at the destination (Mirus prefix/suffix, MM2 replication
policies, RegexRouter transforms). Several properties are read together, so these rows of
`replicator.configuration.properties` are marked with a `part` and read here rather than one by one.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from replicator.configuration.properties import MAX_TOPIC_NAME
from replicator.configuration.reader import PropertyReader
from replicator.topics.naming import (
    DefaultReplicationPolicy,
    IdentityReplicationPolicy,
    MirusNamingPolicy,
    RegexRouter,
    ReplicationPolicy,
    TopicNamer,
)
from replicator.topics.selection import TopicSelector, compile_java_regex, regex_list_pattern

_MM2_POLICY_PACKAGE = "org.apache.kafka.connect.mirror."
_DEFAULT_POLICY_NAMES = frozenset({_MM2_POLICY_PACKAGE + "DefaultReplicationPolicy", "DefaultReplicationPolicy"})
_IDENTITY_POLICY_NAMES = frozenset({_MM2_POLICY_PACKAGE + "IdentityReplicationPolicy", "IdentityReplicationPolicy"})
_REGEX_ROUTER_TYPES = frozenset({"org.apache.kafka.connect.transforms.RegexRouter", "RegexRouter"})
_SELECTION_PROPERTIES = ("topics.whitelist", "topics.regex", "topics.regex.list", "topics")
_TOPIC_CHARS = re.compile(r"[A-Za-z0-9._-]*")
_LEGAL_TOPIC = f"1 to {MAX_TOPIC_NAME} letters, digits, '.', '_' or '-', not '.' or '..'"


def _legal_topic(name: str) -> bool:
    return 0 < len(name) <= MAX_TOPIC_NAME and name not in (".", "..") and _TOPIC_CHARS.fullmatch(name) is not None


class TopicRules(PropertyReader):
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

    def check_destination_names(self, selector: TopicSelector, namer: TopicNamer) -> None:
        """Named topics must be legal Kafka names, and so must what the naming policy makes of them."""
        naming = next(
            (
                p
                for p in (
                    "destination.topic.name.suffix",
                    "destination.topic.name.prefix",
                    "transforms",
                    "replication.policy.class",
                    "source.cluster.alias",
                )
                if self.props.get(p)
            ),
            "source.cluster.alias",
        )
        for topic in sorted(selector.whitelist):
            if not _legal_topic(topic):
                self.fail("topics.whitelist", f"{topic[:60]!r}: not a Kafka topic name ({_LEGAL_TOPIC})")
                continue
            destination = namer.destination_topic(topic)
            if not _legal_topic(destination):
                shown = destination if len(destination) <= 60 else f"{destination[:60]}… ({len(destination)} chars)"
                self.fail(naming, f"names topic {topic!r} {shown!r}, not a Kafka topic name ({_LEGAL_TOPIC})")

    def check_regex(self, prop: str, pattern: str, compile_one: Callable[[str], object]) -> bool:
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
            return self._mirus_policy(prefix or "", suffix or "", separator)
        for prop in mirus_props:  # only reachable with an explicit replication.policy.class
            self.fail(
                prop,
                "cannot be combined with replication.policy.class: destination names would be ambiguous; "
                "use either MM2 naming or Mirus prefix/suffix naming",
            )
        if policy_class is None or policy_class in _DEFAULT_POLICY_NAMES:
            policy = self._default_policy(source_alias, target_alias, "." if separator is None else separator)
            return None if mirus_props else policy
        if policy_class in _IDENTITY_POLICY_NAMES:
            return None if mirus_props else IdentityReplicationPolicy(source_alias, target_alias)
        self.fail(
            "replication.policy.class",
            f"only {_MM2_POLICY_PACKAGE}DefaultReplicationPolicy or {_MM2_POLICY_PACKAGE}IdentityReplicationPolicy "
            f"(or their short names) are supported, got {self.shown('replication.policy.class', policy_class)}",
        )
        return None

    def _mirus_policy(self, prefix: str, suffix: str, separator: str | None) -> MirusNamingPolicy | None:
        """Mirus naming: the source name with a prefix and a suffix."""
        if separator is not None:
            self.fail(
                "replication.policy.separator",
                "only applies with replication.policy.class DefaultReplicationPolicy (or source.cluster.alias "
                "without destination.topic.name.prefix/suffix)",
            )
        ok = True
        for prop, value in (("destination.topic.name.prefix", prefix), ("destination.topic.name.suffix", suffix)):
            if value and not _TOPIC_CHARS.fullmatch(value):
                self.fail(prop, f"may only contain letters, digits, '.', '_' and '-', got {self.shown(prop, value)}")
                ok = False
        if ok and len(prefix) + len(suffix) >= MAX_TOPIC_NAME:
            self.fail(
                "destination.topic.name.suffix" if len(suffix) >= len(prefix) else "destination.topic.name.prefix",
                f"prefix and suffix together are {len(prefix) + len(suffix)} characters: no "
                f"destination topic name would fit Kafka's limit of {MAX_TOPIC_NAME}",
            )
            ok = False
        return MirusNamingPolicy(prefix, suffix) if ok else None

    def _default_policy(self, source_alias: str, target_alias: str, separator: str) -> ReplicationPolicy | None:
        """MirrorMaker 2's default naming: `<source alias><separator><topic>`."""
        if not separator or not _TOPIC_CHARS.fullmatch(separator):
            self.fail(
                "replication.policy.separator",
                "must be non-empty and only contain letters, digits, '.', '_' and '-', "
                f"got {self.shown('replication.policy.separator', separator)}",
            )
            return None
        ok = True
        for prop, alias in (("source.cluster.alias", source_alias), ("target.cluster.alias", target_alias)):
            if separator in alias:
                shown_separator = self.shown("replication.policy.separator", separator)
                self.fail(
                    prop, f"must not contain the replication separator {shown_separator}, got {self.shown(prop, alias)}"
                )
                ok = False
            elif not _TOPIC_CHARS.fullmatch(alias):
                self.fail(prop, f"may only contain letters, digits, '.', '_' and '-', got {self.shown(prop, alias)}")
                ok = False
        if ok and len(source_alias) + len(separator) >= MAX_TOPIC_NAME:
            self.fail(
                "source.cluster.alias",
                f"remote topic names start with the alias and separator ({len(source_alias) + len(separator)} "
                f"characters): none would fit Kafka's limit of {MAX_TOPIC_NAME}",
            )
            ok = False
        return DefaultReplicationPolicy(source_alias, target_alias, separator) if ok else None

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
