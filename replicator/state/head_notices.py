"""Postgres telling a process's tasks that their connector's row changed (migration 0012's trigger notifies channel
`mirus_connector_head` with the connector's name at the commit that changed or deleted it).

Told, a task reads its connector's row at its loop's next turn (`replicator.engine.follower`), so a new topic's
partitions, a pause or a new config reach it within a turn; told of any connector, a worker reads at once which
tasks it hosts (a new assignment's task starts then). One LISTEN connection per process serves all its tasks.
Whether notices do arrive is proven, not assumed: every PROBE_S this process notifies a probe channel from another
connection, and `heard()` is true while the last probe came back. Only then do its tasks read their rows seldom (every
10 s instead of twice a second: most of an idle task's Postgres transactions); behind PgBouncer in transaction mode,
which takes LISTEN but delivers nothing, while this connection is being made again, or if it silently died, they
read twice a second and notice a change at their next read.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, text

log = logging.getLogger(__name__)

CHANNEL = "mirus_connector_head"
PROBE_CHANNEL = "mirus_connector_head_probe"
RECONNECT_S = 5.0  # after the connection failed or was refused
WAIT_S = 1.0  # a close is noticed within this
PROBE_S = 10.0  # how often a probe is sent while the last came back
PROBE_TIMEOUT_S = 5.0  # a probe not back by then: notices are not heard


class HeadNotices:
    """A thread listening on one connection of `engine` (taken out of its pool) and calling, for every notice, the
    callbacks subscribed to that connector."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._subscribed: dict[str | None, list[Callable[[], None]]] = {}  # None: every connector's
        self._guard = threading.Lock()
        self._closed = threading.Event()
        self.listening = threading.Event()  # set while LISTEN is in effect
        self._probe = f"{os.getpid()}-{id(self)}"  # this object's probes, told from other processes'
        self._probe_sent: float | None = None  # (monotonic) when the probe on its way was sent
        self._probe_back = False  # the last probe came back on the listening connection
        self._next_probe = 0.0  # (monotonic) when the next probe is due once the last came back
        self._thread = threading.Thread(target=self._listen, name="mirus-head-notices", daemon=True)
        self._thread.start()

    def subscribe(self, connector: str | None, changed: Callable[[], None]) -> Callable[[], None]:
        """Call `changed` (on this object's thread) whenever `connector`'s row changes (None: any connector's);
        returns the unsubscribe."""
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

    def heard(self) -> bool:
        """Whether notices are proven to arrive: listening, the last probe back, none overdue."""
        return self.listening.is_set() and self._probe_back and self.unanswered_s() <= PROBE_TIMEOUT_S

    def unanswered_s(self) -> float:
        """How long the probe on its way has gone unanswered (0 with none on its way)."""
        sent = self._probe_sent
        return 0.0 if sent is None else time.monotonic() - sent

    def close(self) -> None:
        self._closed.set()
        self._thread.join(WAIT_S * 2)

    def _notify(self, connectors: set[str] | None) -> None:
        """Call the callbacks of `connectors` (None: of every connector, for what may have been missed)."""
        with self._guard:
            callbacks = [
                changed
                for name, subscribed in self._subscribed.items()
                if connectors is None or name is None or name in connectors
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
                    cursor.execute(f"LISTEN {PROBE_CHANNEL}")
                self.listening.set()
                self._notify(None)  # changes made while not listening
                self._send_probe()
                while not self._closed.is_set():
                    if select.select([connection], [], [], WAIT_S)[0]:
                        connection.poll()
                        notices = list(connection.notifies)
                        connection.notifies.clear()
                        if any(n.channel == PROBE_CHANNEL and n.payload == self._probe for n in notices):
                            self._probe_sent, self._probe_back = None, True
                            self._next_probe = time.monotonic() + PROBE_S
                        names = {n.payload for n in notices if n.channel == CHANNEL}
                        if names:
                            log.debug("notified: %s", " ".join(sorted(names)))  # a stage in orchestration_latency.py
                            self._notify(names)
                    sent, now = self._probe_sent, time.monotonic()
                    if (sent is None and now >= self._next_probe) or (sent is not None and now - sent > PROBE_S):
                        self._send_probe()  # the next, or again: a path that came back is noticed
            except Exception as exc:  # the database is away or refuses: the tasks' own reads go on meanwhile
                log.info("connector change notices unavailable, retrying in %.0fs: %s", RECONNECT_S, exc)
                self._closed.wait(RECONNECT_S)
            finally:
                self.listening.clear()
                self._probe_sent, self._probe_back = None, False
                if connection is not None:
                    try:
                        connection.close()
                    except Exception as exc:  # already broken
                        log.debug("closing the notices connection: %s", exc)

    def _send_probe(self) -> None:
        """A probe notified from another connection than the listening one (so through a pooler that does not
        carry notices, it never comes back)."""
        self._probe_sent = time.monotonic()
        with self._engine.connect() as conn:
            conn.execute(
                text("SELECT pg_notify(:channel, :payload)"), {"channel": PROBE_CHANNEL, "payload": self._probe}
            )
            conn.commit()
