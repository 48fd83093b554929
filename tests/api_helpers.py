"""The HTTP API served by a real uvicorn on a free port, in a background thread, for tests over real HTTP."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn

from mirus.api.app import create_app
from mirus.api.auth import ApiSettings
from mirus.waiting import wait_until
from replicator.state.store import Store
from tests.conftest import free_port


@contextmanager
def serve_api(store: Store, settings: ApiSettings, destination: str | None = None) -> Iterator[str]:
    """Yields the API's base URL; the server stops when the block ends."""
    port = free_port()
    settings = settings.model_copy(update={"host": "127.0.0.1", "port": port})
    config = uvicorn.Config(create_app(store, settings, destination), host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True, name=f"api-{port}")
    thread.start()
    wait_until(lambda: server.started, timeout=30, what="the API to listen")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)
