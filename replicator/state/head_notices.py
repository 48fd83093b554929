"""Postgres telling a process's tasks that their connector's row changed (migration 0012's trigger notifies channel
`mirus_connector_head` with the connector's name at the commit that changed or deleted it).

A task reads its connector's row twice a second (`replicator.engine.follower`); told, it reads it at its loop's next
turn, so a new topic's partitions, a pause or a new config reach it within a turn instead of at the next read. One
LISTEN connection per process serves all its tasks. The reads go on regardless: behind PgBouncer in transaction mode
(which does not carry LISTEN) or while this connection is being made again, a task notices at its next read.
"""

from __future__ import annotations

import logging
import select
import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine

log = logging.getLogger(__name__)

CHANNEL = "mirus_connector_head"
RECONNECT_S = 5.0  # after the connection failed or was refused
WAIT_S = 1.0  # a close is noticed within this


class HeadNotices:
    """A thread listening on one connection of `engine` (taken out of its pool) and calling, for every notice, the
    callbacks subscribed to that connector."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._subscribed: dict[str, list[Callable[[], None]]] = {}
        self._guard = threading.Lock()
        self._closed = threading.Event()
        self.listening = threading.Event()  # set while LISTEN is in effect
        self._thread = threading.Thread(target=self._listen, name="mirus-head-notices", daemon=True)
        self._thread.start()

    def subscribe(self, connector: str, changed: Callable[[], None]) -> Callable[[], None]:
        """Call `changed` (on this object's thread) whenever `connector`'s row changes; returns the unsubscribe."""
        with self._guard:
            self._subscribed.setdefault(connector, []).append(changed)

        def unsubscribe() -> None:
            with self._guard:
                callbacks = self._subscribed.get(connector, [])
                if changed in callbacks:
                    callbacks.remove(changed)
                if not callbacks:
                    self._subscribed.pop(connector, None)

        return unsubscribe

    def close(self) -> None:
        self._closed.set()
        self._thread.join(WAIT_S * 2)

    def _notify(self, connectors: set[str] | None) -> None:
        """Call the callbacks of `connectors` (None: of every connector, for what may have been missed)."""
        with self._guard:
            callbacks = [
                changed
                for name, subscribed in self._subscribed.items()
                if connectors is None or name in connectors
                for changed in subscribed
            ]
        for changed in callbacks:
            changed()

    def _listen(self) -> None:
        while not self._closed.is_set():
            connection: Any = None
            try:
                pooled = self._engine.raw_connection()
                connection = pooled.driver_connection
                pooled.detach()  # a LISTEN belongs to its session: this connection never goes back to the pool
                connection.autocommit = True
                with connection.cursor() as cursor:
                    cursor.execute(f"LISTEN {CHANNEL}")
                self.listening.set()
                self._notify(None)  # changes made while not listening
                while not self._closed.is_set():
                    if select.select([connection], [], [], WAIT_S)[0]:
                        connection.poll()
                        names = {notice.payload for notice in connection.notifies}
                        log.debug("notified: %s", " ".join(sorted(names)))  # a stage in orchestration_latency.py
                        connection.notifies.clear()
                        self._notify(names)
            except Exception as exc:  # the database is away or refuses: the tasks' own reads go on meanwhile
                log.info("connector change notices unavailable, retrying in %.0fs: %s", RECONNECT_S, exc)
                self._closed.wait(RECONNECT_S)
            finally:
                self.listening.clear()
                if connection is not None:
                    try:
                        connection.close()
                    except Exception as exc:  # already broken
                        log.debug("closing the notices connection: %s", exc)
