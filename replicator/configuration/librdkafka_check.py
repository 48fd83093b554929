"""librdkafka as the judge of client settings: a throw-away client is created (never connected) and its complaints
are collected, one setting at a time, for the submission checks of `replicator.configuration.client_rules`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from replicator.configuration.masking import SECRET_MASK

# librdkafka's warnings about the throw-away clients (e.g. "no bootstrap.servers") are noise.
_SILENT_LOGGER = logging.getLogger(f"{__name__}.librdkafka-check")
_SILENT_LOGGER.addHandler(logging.NullHandler())
_SILENT_LOGGER.propagate = False
_SILENT_LOGGER.setLevel(logging.CRITICAL + 1)

_QUOTED = re.compile(r'"([^"]+)"')
SETTING_NAME = re.compile(r"\b[a-z][a-z0-9_]*(?:\.[a-z0-9_]+)+\b")
CREATE_PREFIX = re.compile(r"^Failed to create (?:consumer|producer|admin client): ")


def _try_client(kind: str, conf: Mapping[str, str]) -> str | None:
    """Create and destroy a client of `kind` with `conf`; librdkafka's complaint, or None if it accepted it."""
    settings: dict[str, Any] = {**conf, "logger": _SILENT_LOGGER}
    try:
        if kind == "consumer":
            settings.setdefault("group.id", "mirus-config-check")
            Consumer(settings).close()
        elif kind == "producer":
            producer = Producer(settings)
            close = getattr(producer, "close", None)  # confluent-kafka >= 2.12
            if close is not None:
                close()
        else:
            AdminClient(settings)
    except KafkaException as err:
        first = err.args[0] if err.args else err
        return first.str() if isinstance(first, KafkaError) else str(first)
    except (ValueError, TypeError) as err:
        return str(err)
    return None


def _culprit(message: str, conf: Mapping[str, str]) -> str | None:
    """The setting a librdkafka message is about, when the message says so."""
    quoted: str  # findall of a pattern with one group: the group's text
    for quoted in _QUOTED.findall(message):
        if quoted in conf:
            return quoted
    for key in sorted(conf, key=len, reverse=True):
        if re.search(rf"(?<![\w.]){re.escape(key)}(?![\w.])", message):
            return key
    for key in sorted(conf, key=len, reverse=True):  # prose such as "SASL mechanism GSSAPI"
        if re.search(rf"(?<![\w.]){re.escape(key.replace('.', ' '))}s?(?![\w.])", message, re.IGNORECASE):
            return key
    if "JAAS" in message and "sasl.jaas.config" in conf:
        return "sasl.jaas.config"
    if "TrustStore" in message:
        return next((k for k in conf if k.startswith("ssl.truststore.")), None)
    return None


def librdkafka_problems(kind: str, settings: Mapping[str, str]) -> list[tuple[str | None, str]]:
    """Every (setting, message) librdkafka rejects; setting is None when no single setting is to blame.

    librdkafka stops at the first problem, so the offending setting is removed and the check repeated until
    the rest is accepted. A message that names no setting is pinned on the setting that
    draws the same message when set alone.
    """
    conf = {k: v for k, v in settings.items() if k != "bootstrap.servers"}
    problems: list[tuple[str | None, str]] = []
    for _ in range(len(conf) + 1):
        message = _try_client(kind, conf)
        if message is None:
            break
        key = _culprit(message, conf)
        if key is None:
            # e.g. an alias (`linger.ms` is reported as "queue.buffering.max.ms"): find the setting that, alone,
            # draws the same complaint.
            expected = CREATE_PREFIX.sub("", message)
            key = next(
                (k for k in conf if CREATE_PREFIX.sub("", _try_client(kind, {k: conf[k]}) or "") == expected), None
            )
        problems.append((key, message))
        if key is None:
            break
        del conf[key]
    return problems


def librdkafka_reason(message: str, key: str | None, value: str, *, secret: bool) -> str:
    text = CREATE_PREFIX.sub("", message.strip())
    if text.startswith("No such configuration property"):
        return (
            f"unknown client setting {key!r}: librdkafka (the Kafka client used here) has no such configuration "
            "property; Java-only client settings are not supported "
            "(see https://github.com/confluentinc/librdkafka/blob/master/CONFIGURATION.md)"
        )
    if secret and value:
        text = text.replace(value, SECRET_MASK)
    return f"rejected by librdkafka: {text}"
