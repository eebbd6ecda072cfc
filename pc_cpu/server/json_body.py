"""Gives the routes' JSON reader, which turns every body a client can fix into a refusal naming what is wrong.

FastAPI reads a body with json.loads and turns any error but a JSONDecodeError into a 400 "There was
an error parsing the body" that names nothing. The bodies that took that path, and what they get here:
- an integer with more digits than Python's int() reads (4,300) reads as an infinity of its sign,
  which every number field refuses naming the field ("body.max_tokens: Input should be a finite
  number") and which a field the server ignores may hold;
- bytes that are not UTF-8, and arrays or objects nested deeper than the reader recurses, are a
  JSONDecodeError saying so, which the 422 handler shows (pc_cpu.server.http_errors.validation_message).
"""

from __future__ import annotations

import json
from typing import Any, Callable

from fastapi import Request
from fastapi.routing import APIRoute


class JSONBodyRoute(APIRoute):
    """A route whose request body is read by `read_json` (set as the app router's `route_class`)."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()

        async def with_json_body(request: Request):
            return await handler(JSONBodyRequest(request.scope, request.receive))

        return with_json_body


class JSONBodyRequest(Request):
    async def json(self) -> Any:
        """Returns the body as read_json reads it, read once."""
        if not hasattr(self, "_json"):
            self._json = read_json(await self.body())
        return self._json


def read_json(body: bytes) -> Any:
    """Returns the body parsed as JSON, an integer too long for int() as an infinity.

    Raises:
        json.JSONDecodeError: the body is not JSON, not UTF-8, or nested too deeply; the message says which.
    """
    try:
        return json.loads(body, parse_int=_int)
    except UnicodeDecodeError as exc:
        raise json.JSONDecodeError(f"byte 0x{exc.object[exc.start]:02x} is not UTF-8",
                                   body.decode("utf-8", "replace"), exc.start) from None
    except RecursionError:
        raise json.JSONDecodeError("arrays or objects nested too deeply to read",
                                   body.decode("utf-8", "replace"), 0) from None


def _int(digits: str) -> int | float:
    try:
        return int(digits)
    except ValueError:  # more digits than sys.get_int_max_str_digits(): far beyond any field's range
        return float("-inf") if digits.startswith("-") else float("inf")
