"""Gives the ways to run the app under uvicorn: in the foreground (`pc-cpu serve`) or in a thread.

Binds 127.0.0.1 by default. Listening on any other address needs an API key, or `insecure=True`
(pc_cpu.server.guard.check_exposure).
"""

from __future__ import annotations

import copy
import logging
import threading
import time

import uvicorn
from uvicorn.config import LOGGING_CONFIG

from pc_cpu.errors import PromptCacheError
from pc_cpu.server.app import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_SCHEMAS, create_app
from pc_cpu.server.guard import check_exposure, is_loopback

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000


def serve(cache, *, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, api_key: str | None = None,
          insecure: bool = False, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
          max_schemas: int = DEFAULT_MAX_SCHEMAS, log_level: str = "info") -> None:
    """Serves `cache` until interrupted (Ctrl-C); returns after every stream is closed.

    Args:
        cache: a PromptCache with its schemas loaded; the caller closes it afterwards.
        host, port: where to listen; port 0 picks a free one.
        api_key: the key every route but /health needs (`Authorization: Bearer KEY`); None: none.
        insecure: allow a non-loopback `host` without an api_key.
        max_body_bytes, max_schemas: the limits of pc_cpu.server.app.create_app.

    Raises:
        PromptCacheError: `host` is not loopback and there is neither an api_key nor `insecure`.
    """
    check_exposure(host, api_key, insecure=insecure)
    if not api_key and not is_loopback(host):
        log.warning("listening on %s without an API key (--insecure): anyone who can reach it can use the model "
                    "and load schemas", host)
    app = create_app(cache, api_key=api_key, max_body_bytes=max_body_bytes, max_schemas=max_schemas)
    uvicorn.run(app, host=host, port=port, log_level=log_level, log_config=_log_config())


def _log_config() -> dict:
    """Returns uvicorn's logging setup with pc_cpu's loggers printed like its own (schemas loaded, errors)."""
    config = copy.deepcopy(LOGGING_CONFIG)
    config["loggers"]["pc_cpu"] = {"handlers": ["default"], "level": "INFO", "propagate": False}
    return config


class ServerThread:
    """Runs the app for `cache` in a background thread: `start()` returns once it accepts connections.

        with ServerThread(cache) as server:       # port 0: a free loopback port
            httpx.get(server.base_url + "/health")
    """

    def __init__(self, cache, *, host: str = DEFAULT_HOST, port: int = 0, log_level: str = "warning",
                 api_key: str | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 max_schemas: int = DEFAULT_MAX_SCHEMAS):
        check_exposure(host, api_key)
        app = create_app(cache, api_key=api_key, max_body_bytes=max_body_bytes, max_schemas=max_schemas)
        config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on")
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
