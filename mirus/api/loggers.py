"""Kafka Connect's `/admin/loggers` over Python's logging: log4j level names, read and set in the API's process.

Connect's `scope=cluster` reaches every worker of its cluster; the API is one process here, so both scopes set the
levels of this process (as a standalone Connect worker does), and never those of replicator runs.
"""

from __future__ import annotations

import logging
import time
from typing import Any

ROOT = "root"
# log4j's levels, as Kafka Connect reads and shows them, and the Python level each sets.
LEVELS = {
    "OFF": logging.CRITICAL + 10,
    "FATAL": logging.CRITICAL,
    "ERROR": logging.ERROR,
    "WARN": logging.WARNING,
    "INFO": logging.INFO,
    "DEBUG": logging.DEBUG,
    "TRACE": logging.DEBUG - 5,
    "ALL": logging.NOTSET + 1,
}
_NAMES = {level: name for name, level in LEVELS.items()}


class LoggerLevels:
    """When each logger's level was last set over the API (`last_modified`, ms since the epoch, as KIP-976)."""

    def __init__(self) -> None:
        self.modified: dict[str, int] = {}

    def all(self) -> dict[str, dict[str, Any]]:
        """Loggers whose level is set explicitly, and the root logger."""
        named = {
            name: self._level(logger)
            for name, logger in sorted(logging.root.manager.loggerDict.items())
            if isinstance(logger, logging.Logger) and logger.level != logging.NOTSET
        }
        return {**named, ROOT: self._level(logging.root)}

    def get(self, name: str) -> dict[str, Any] | None:
        """The effective level of an existing logger; None if no logger has that name."""
        if name.lower() == ROOT:
            return self._level(logging.root)
        logger = logging.root.manager.loggerDict.get(name)
        return self._level(logger) if isinstance(logger, logging.Logger) else None

    def set(self, namespace: str, level: str) -> list[str]:
        """Set `level` on `namespace` and every existing logger below it (all of them for root): their names."""
        python_level = LEVELS[level.upper()]
        if namespace.lower() == ROOT:
            targets = [n for n, lg in logging.root.manager.loggerDict.items() if isinstance(lg, logging.Logger)]
            logging.root.setLevel(python_level)
            targets.append(ROOT)
        else:
            targets = [
                n
                for n, lg in logging.root.manager.loggerDict.items()
                if isinstance(lg, logging.Logger) and (n == namespace or n.startswith(namespace + "."))
            ]
            if namespace not in targets:
                targets.append(namespace)
        now = int(time.time() * 1000)
        for name in targets:
            if name != ROOT:
                logging.getLogger(name).setLevel(python_level)
            self.modified[name] = now
        return sorted(targets)

    def _level(self, logger: logging.Logger) -> dict[str, Any]:
        name = ROOT if logger is logging.root else logger.name
        level = logger.getEffectiveLevel()
        shown = _NAMES.get(level) or next((n for lv, n in sorted(_NAMES.items(), reverse=True) if lv <= level), "ALL")
        return {"level": shown, "last_modified": self.modified.get(name)}


def valid_level(level: object) -> bool:
    return isinstance(level, str) and level.upper() in LEVELS
