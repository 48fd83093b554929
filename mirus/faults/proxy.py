"""A TCP proxy on loopback whose link can be cut and restored: the network between replicator and a cluster.

Kafka clients connect to the address a broker advertises in its metadata, not to the one they bootstrapped
with, so a proxy in front of a broker only sees all traffic when the broker advertises the proxy's port. The
fault harness starts its brokers that way (`brokers.py`).

A cut closes every open connection and then accepts new ones only to close them at once: clients see resets
and refused requests, as when a link or a load balancer goes away, and the listening port stays reserved.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
from typing import cast

BUFFER = 256 * 1024


class TcpProxy:
    """Forwards 127.0.0.1:`port` to `target`; `cut()` and `restore()` switch the link off and on."""

    def __init__(self, target: tuple[str, int], port: int = 0) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", port), reuse_port=False)
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._peers: dict[socket.socket, socket.socket] = {}
        self._lock = threading.Lock()
        self._cut = False
        self._closing = False
        self.connections = 0  # accepted while the link was up
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
            events = self._selector.select(timeout=0.2)
            with self._lock:
                for key, _mask in events:
                    sock = cast(socket.socket, key.fileobj)  # registered as sockets only
                    if sock is self._listener:
                        self._accept()
                    elif sock in self._peers:
                        self._pump(sock)

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
        self._peers[client], self._peers[upstream] = upstream, client
        self._selector.register(client, selectors.EVENT_READ)
        self._selector.register(upstream, selectors.EVENT_READ)

    def _pump(self, sock: socket.socket) -> None:
        peer = self._peers[sock]
        try:
            data = sock.recv(BUFFER)
            if data:
                peer.sendall(data)
                return
        except OSError:
            pass
        self._drop(sock)

    def _drop(self, sock: socket.socket) -> None:
        peer = self._peers.pop(sock, None)
        for s in (sock, peer):
            if s is None:
                continue
            self._peers.pop(s, None)
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(s)
            _reset(s)


def _reset(sock: socket.socket) -> None:
    """Close with RST rather than FIN: the peer learns at once that the connection is gone."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    sock.close()
