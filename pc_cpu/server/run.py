"""Gives the ways to run the app under uvicorn: in the foreground (`pc-cpu serve`) or in a thread.

Binds 127.0.0.1 by default: the API has no authentication, so exposing it is the caller's choice.
"""

from __future__ import annotations

import logging
import threading
import time

import uvicorn

from pc_cpu.errors import PromptCacheError
from pc_cpu.server.app import create_app

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000


def serve(cache, *, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, log_level: str = "info") -> None:
    """Serves `cache` until interrupted (Ctrl-C); returns after every stream is closed.

    Args:
        cache: a PromptCache with its schemas loaded; the caller closes it afterwards.
        host, port: where to listen; port 0 picks a free one.
    """
    if host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("listening on %s: anyone who can reach it can use the model and load schemas", host)
    uvicorn.run(create_app(cache), host=host, port=port, log_level=log_level)


class ServerThread:
    """Runs the app for `cache` in a background thread: `start()` returns once it accepts connections.

        with ServerThread(cache) as server:       # port 0: a free loopback port
            httpx.get(server.base_url + "/health")
    """

    def __init__(self, cache, *, host: str = DEFAULT_HOST, port: int = 0, log_level: str = "warning"):
        config = uvicorn.Config(create_app(cache), host=host, port=port, log_level=log_level, lifespan="on")
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, name="pc-cpu-server", daemon=True)
        self.host = host
        self.port = port

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 10.0) -> "ServerThread":
        """Starts the server; raises PromptCacheError if it is not accepting connections within `timeout` s."""
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise PromptCacheError(f"the server did not start on {self.host}:{self.port} within {timeout} s; "
                                       "is the port in use?")
            time.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stops accepting, waits for open requests and streams to end, then joins the thread."""
        self.server.should_exit = True
        self._thread.join(timeout)

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
