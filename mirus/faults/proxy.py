"""A TCP proxy on loopback whose link can be cut and restored: the network between replicator and a cluster.

Kafka clients connect to the address a broker advertises in its metadata, not to the one they bootstrapped
with, so a proxy in front of a broker only sees all traffic when the broker advertises the proxy's port. The
fault harness starts its brokers that way (`brokers.py`).

A cut closes every open connection and then accepts new ones only to close them at once: clients see resets
and refused requests, as when a link or a load balancer goes away, and the listening port stays reserved.

With `delay_s` the link is also a long one (a wide-area link without netem, which a kernel may lack): every
chunk read from either side is written to the other `delay_s` later, so a request and its response take
twice `delay_s` more, whatever their size. Only latency is added: the proxy reads each side as soon as data
arrives and holds up to `window` bytes per direction and connection in its delay line (see `WINDOW`), so it
neither limits bandwidth nor slows the sender's TCP.
`bytes_to_target` / `bytes_from_target` count what it forwarded, in both modes.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time
from collections import deque
from typing import cast

BUFFER = 256 * 1024
# Bytes a delay line holds per direction and connection before the proxy stops reading that side (back-pressure
# instead of unbounded memory): 16 MiB in 25 ms is 640 MiB/s, beyond anything one loopback machine pushes.
WINDOW = 16 * 1024 * 1024
# Buffers handed to one sendmsg(): Linux's IOV_MAX is 1024.
_IOV_MAX = 1024


class TcpProxy:
    """Forwards 127.0.0.1:`port` to `target`; `cut()` and `restore()` switch the link off and on.

    `delay_s` > 0 delays every byte by that much in each direction (a round trip takes twice `delay_s` longer)."""

    def __init__(self, target: tuple[str, int], port: int = 0, delay_s: float = 0.0, window: int = WINDOW) -> None:
        self.target = target
        self.delay_s = delay_s
        self._window = window
        self._listener = socket.create_server(("127.0.0.1", port), reuse_port=False)
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._peers: dict[socket.socket, socket.socket] = {}
        self._upstreams: set[socket.socket] = set()  # the proxy's connections to the target (for the counts)
        # The delay lines (delay_s > 0 only), keyed by the socket they are written to: chunks with the time they
        # are due, oldest first (one delay for all, so due times only grow); bytes held; sockets whose reading is
        # paused because the line they feed is full; sockets waiting for room in their send buffer.
        self._lines: dict[socket.socket, deque[tuple[float, memoryview]]] = {}
        self._held: dict[socket.socket, int] = {}
        self._paused: set[socket.socket] = set()
        self._blocked: set[socket.socket] = set()
        self._masks: dict[socket.socket, int] = {}  # what each delayed socket is registered for
        self._lock = threading.Lock()
        self._cut = False
        self._closing = False
        self.connections = 0  # accepted while the link was up
        self.bytes_to_target = 0  # forwarded client → target
        self.bytes_from_target = 0  # forwarded target → client
        self._thread = threading.Thread(target=self._serve, name=f"tcp-proxy-{self.port}", daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def is_cut(self) -> bool:
        return self._cut

    def cut(self) -> None:
        """Reset every connection and refuse new ones until `restore()`."""
        with self._lock:
            self._cut = True
            for sock in list(self._peers):
                self._drop(sock)

    def restore(self) -> None:
        with self._lock:
            self._cut = False

    def close(self) -> None:
        self._closing = True
        self._thread.join(5)
        with self._lock:
            for sock in list(self._peers):
                self._drop(sock)
        self._selector.close()
        self._listener.close()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- the forwarding loop ----------------------------------------------------------------------------

    def _serve(self) -> None:
        while not self._closing:
            events = self._selector.select(timeout=self._next_due())
            with self._lock:
                for key, mask in events:
                    sock = cast(socket.socket, key.fileobj)  # registered as sockets only
                    if sock is self._listener:
                        self._accept()
                        continue
                    if mask & selectors.EVENT_WRITE and sock in self._peers:
                        self._blocked.discard(sock)
                        self._send_due(sock)
                    if mask & selectors.EVENT_READ and sock in self._peers:
                        if self.delay_s:
                            self._hold(sock)
                        else:
                            self._pump(sock)
                if self.delay_s:
                    for sock in [s for s, line in self._lines.items() if line and s not in self._blocked]:
                        if sock in self._lines:  # not dropped by an earlier send's error
                            self._send_due(sock)

    def _next_due(self) -> float:
        """How long the loop may wait for events: until the next delayed chunk is due (at most 0.2 s)."""
        if not self.delay_s:
            return 0.2
        heads = [line[0][0] for s, line in self._lines.items() if line and s not in self._blocked]
        return min(0.2, max(0.0, min(heads) - time.monotonic())) if heads else 0.2

    def _accept(self) -> None:
        try:
            client, _ = self._listener.accept()
        except BlockingIOError:
            return
        if self._cut:
            _reset(client)
            return
        try:
            upstream = socket.create_connection(self.target, timeout=2)
        except OSError:
            _reset(client)  # the broker behind the proxy is down: the client sees what it would see directly
            return
        self.connections += 1
        for sock in (client, upstream):
            sock.setblocking(True)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(5)
            if self.delay_s:
                # One thread serves every delay line: a socket that cannot take more now must not hold up the others.
                sock.setblocking(False)
                self._lines[sock], self._held[sock], self._masks[sock] = deque(), 0, selectors.EVENT_READ
        self._peers[client], self._peers[upstream] = upstream, client
        self._upstreams.add(upstream)
        self._selector.register(client, selectors.EVENT_READ)
        self._selector.register(upstream, selectors.EVENT_READ)

    def _pump(self, sock: socket.socket) -> None:
        peer = self._peers[sock]
        try:
            data = sock.recv(BUFFER)
            if data:
                peer.sendall(data)
                self._count(peer, len(data))
                return
        except OSError:
            pass
        self._drop(sock)

    def _count(self, to: socket.socket, sent: int) -> None:
        if to in self._upstreams:
            self.bytes_to_target += sent
        else:
            self.bytes_from_target += sent

    # -- the delay lines (delay_s > 0) ------------------------------------------------------------------

    def _hold(self, sock: socket.socket) -> None:
        """Read what `sock` has and put it on the line to its peer, due `delay_s` from now."""
        peer = self._peers[sock]
        try:
            data = sock.recv(BUFFER)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(sock)  # at once, as without delay: Kafka clients only close connections they are done with
            return
        self._lines[peer].append((time.monotonic() + self.delay_s, memoryview(data)))
        self._held[peer] += len(data)
        if self._held[peer] > self._window:
            self._paused.add(sock)  # the line is full: leave the rest in the sender's socket until it drains
            self._interest(sock)

    def _send_due(self, sock: socket.socket) -> None:
        """Write the chunks of `sock`'s line that are due, in one sendmsg(); what it does not take waits for room."""
        line, now = self._lines[sock], time.monotonic()
        due = [chunk for _at, chunk in _head(line, now)]
        if not due:
            self._interest(sock)  # not blocked any more: no longer woken for writability
            return
        try:
            sent = sock.sendmsg(due)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._drop(sock)
            return
        self._count(sock, sent)
        self._held[sock] -= sent
        while sent:
            at, chunk = line[0]
            if sent < len(chunk):
                line[0] = (at, chunk[sent:])
                break
            sent -= len(chunk)
            line.popleft()
        if line and line[0][0] <= now:
            self._blocked.add(sock)  # the send buffer is full: wait until the socket is writable again
        self._interest(sock)
        peer = self._peers[sock]
        if peer in self._paused and self._held[sock] <= self._window // 2:
            self._paused.discard(peer)
            self._interest(peer)

    def _interest(self, sock: socket.socket) -> None:
        """Register `sock` for what it waits for now: reading unless its line is full, writing while blocked (a
        system call only when that changed: this runs after every send)."""
        mask = (0 if sock in self._paused else selectors.EVENT_READ) | (
            selectors.EVENT_WRITE if sock in self._blocked else 0
        )
        before = self._masks.get(sock, 0)
        if mask == before:
            return
        self._masks[sock] = mask
        if not before:
            self._selector.register(sock, mask)
        elif mask:
            self._selector.modify(sock, mask)
        else:
            self._selector.unregister(sock)

    def _drop(self, sock: socket.socket) -> None:
        peer = self._peers.pop(sock, None)
        for s in (sock, peer):
            if s is None:
                continue
            self._peers.pop(s, None)
            self._upstreams.discard(s)
            self._lines.pop(s, None)
            self._held.pop(s, None)
            self._paused.discard(s)
            self._blocked.discard(s)
            self._masks.pop(s, None)
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(s)
            _reset(s)


def _head(line: deque[tuple[float, memoryview]], now: float) -> list[tuple[float, memoryview]]:
    """The chunks of `line` due by `now` (at most one sendmsg's worth)."""
    due: list[tuple[float, memoryview]] = []
    for entry in line:
        if entry[0] > now or len(due) == _IOV_MAX:
            break
        due.append(entry)
    return due


def _reset(sock: socket.socket) -> None:
    """Close with RST rather than FIN: the peer learns at once that the connection is gone."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    sock.close()
