"""Gives what keeps strangers and oversized requests out of the server: the API key, the body limit, the bind check.

- `check_api_key`: the key as given, stripped; one no client could send in a header is refused.
- `BearerAuth`: every path but /health needs `Authorization: Bearer KEY` (what OpenAI clients
  send); anything else is a 401 JSON error. Keys are compared in constant time.
- `BodyLimit`: a request body over the limit is a 413 JSON error naming the limit and its flag,
  refused before the app parses it (the declared Content-Length, else as the bytes arrive).
- `check_exposure`: listening beyond loopback without a key is refused unless asked for.

Both middlewares are plain ASGI, so a streamed answer passes through them untouched.
"""

from __future__ import annotations

import hmac
import ipaddress

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pc_cpu.errors import ConfigError, PromptCacheError
from pc_cpu.server.openai_api import error_json

API_KEY_ENV = "PC_CPU_API_KEY"
OPEN_PATHS = ("/health",)  # for load balancers and liveness probes: says nothing a stranger can use
_KEY_FIX = ("use printable ASCII without spaces, e.g. the output of "
            "python -c 'import secrets; print(secrets.token_urlsafe(32))'")


def check_api_key(api_key: str) -> str:
    """Returns the API key without the whitespace around it; raises ConfigError when no client could send it.

    A header value loses its surrounding whitespace on the way (HTTP strips it), so a key kept
    with a space or newline around it (`--api-key " k"`, a key file's last newline) would let
    no one in. Inside the key, whitespace, control and non-ASCII characters cannot be sent
    intact in a header either. The message never quotes the key: it may end up in a log.
    """
    key = api_key.strip()
    if not key:
        raise ConfigError(f"the API key (--api-key or ${API_KEY_ENV}) is empty; {_KEY_FIX}, or leave both unset "
                          "to serve without a key")
    for index, char in enumerate(key):
        problem = _header_problem(char)
        if problem:
            raise ConfigError(f"the API key (--api-key or ${API_KEY_ENV}) has {problem} at character {index + 1}, "
                              f"which clients cannot send in 'Authorization: Bearer KEY'; {_KEY_FIX}")
    return key


def _header_problem(char: str) -> str | None:
    """Returns what keeps `char` out of a Bearer token, or None when it is printable ASCII."""
    if char == " ":
        return "a space"
    if not char.isascii():
        return "a non-ASCII character"
    if not char.isprintable():
        return "a tab or other control character"
    return None


def is_loopback(host: str) -> bool:
    """Returns whether `host` is a loopback address (or 'localhost'); names are not resolved."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, api_key: str | None, *, insecure: bool = False) -> None:
    """Raises PromptCacheError when serving on `host` would let anyone who reaches it in without a key."""
    if api_key or insecure or is_loopback(host):
        return
    raise PromptCacheError(
        f"refusing to serve on {host} without an API key: anyone who can reach it could run the model and "
        f"load schemas; pass --api-key KEY (or set ${API_KEY_ENV}), listen on 127.0.0.1, or pass --insecure "
        "to serve without a key")


def _error(status: int, message: str, type_: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(error_json(message, type_), status_code=status, headers=headers)


class BearerAuth:
    """ASGI middleware: refuses every request but those to OPEN_PATHS unless it carries the key."""

    def __init__(self, app: ASGIApp, api_key: str):
        """`api_key`: as check_api_key returns it (create_app checks it before the first request builds this)."""
        self.app = app
        self._expected = api_key.encode("ascii")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS and not self._authorized(scope):
            response = _error(401, "missing or wrong API key: send the header 'Authorization: Bearer KEY' with the "
                                   f"key the server was started with (--api-key or ${API_KEY_ENV})",
                              "AuthenticationError", {"WWW-Authenticate": "Bearer"})
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                # compare_digest takes as long whatever prefix matches: timing tells nothing about the key
                return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self._expected)
        return False


class BodyLimit:
    """ASGI middleware: refuses a request body over `max_bytes` with a 413 before the app reads it.

    The body is read here (at most `max_bytes`, which the app would read whole anyway) and
    handed on; after it, the app's receive() goes to the client again (disconnects).
    """

    def __init__(self, app: ASGIApp, max_bytes: int, *, flag: str = "--max-body-bytes"):
        self.app = app
        self.max_bytes = max_bytes
        self.flag = flag

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left before sending its whole body: nobody to answer
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                await self._refuse(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        body: list[Message] = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replay() -> Message:
            return body.pop() if body else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = _error(413, f"request body is larger than this server's limit of {self.max_bytes} bytes; "
                               f"send less, or restart the server with a higher {self.flag}",
                          "RequestTooLarge")
        await response(scope, receive, send)
