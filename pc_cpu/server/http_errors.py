"""Gives what a client is told when a request fails, and logs what only the server's operator may read.

The rule, for every route and for an error inside an event stream alike:
- A PromptCacheError is the client's to fix: 400 (404 for an UnknownDocumentError) with its
  message, minus any absolute filesystem path (`<path>` instead; the API's own /v1/... and
  /health are kept).
- A StoreUnavailableError is the shared store (Redis) being down while the request must change it
  (the document library): 503 with its message, which names the store (its password left out).
- A StoreError, or an OSError saying the disk is full, is the server's store failing to write:
  507 "the server's store cannot be written (disk full?)", never its path or OS message.
- Any other exception is a bug or a failure of the machine: 500 with a generic message.
A 5xx carries a request id, in its message and its X-Request-Id header; the server log has one
line with that id, the exception and its traceback.
A body that does not validate is a 422 whose message names each field that is wrong
(`validation_message`), or the body itself when it is no JSON object.
"""

from __future__ import annotations

import errno
import logging
import re
import uuid
from dataclasses import dataclass
from email.message import Message
from typing import Sequence

from starlette.responses import JSONResponse

from pc_cpu.errors import PromptCacheError, StoreError, StoreUnavailableError, UnknownDocumentError
from pc_cpu.server.openai_api import error_json

log = logging.getLogger(__name__)

# An absolute path: a slash that does not continue a word, a URL or a relative path, up to a space,
# quote, bracket or separator; the API's own routes are not server paths.
_ABSOLUTE_PATH = re.compile(r"""(?<![\w.~:/-])/(?!v1\b|health\b)[^\s'"()\[\]<>:;,]+""")
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
_LOG_HAS_IT = "the details are in the server's log"
STORE_MESSAGE = ("the server's store cannot be written (disk full?); retry later, or ask the server's operator to "
                 "free disk space or fix the store directory")
INTERNAL_MESSAGE = "internal error: the request failed on the server's side, not because of what it sent"


@dataclass(frozen=True)
class HttpError:
    """One failed request as the client sees it."""

    status: int
    message: str
    type: str
    request_id: str | None = None  # a 5xx's: names the log line that has the details

    def json(self) -> dict:
        return error_json(self.message, self.type)

    def response(self) -> JSONResponse:
        headers = {"X-Request-Id": self.request_id} if self.request_id else None
        return JSONResponse(self.json(), status_code=self.status, headers=headers)


def http_error(exc: Exception, where: str) -> HttpError:
    """Returns what the client is told about `exc`; logs a server-side failure with its request id.

    Args:
        exc: what a route (or a stream's worker) raised.
        where: the request, e.g. "POST /v1/documents", for the log line.
    """
    if isinstance(exc, StoreUnavailableError):  # the shared Redis is down: retry later, nothing is wrong with the request
        log.warning("%s: %s", where, exc)
        return HttpError(503, str(exc), "ServiceUnavailable")
    if isinstance(exc, StoreError) or (isinstance(exc, OSError) and exc.errno in _DISK_FULL):
        return _server_side(507, STORE_MESSAGE, "InsufficientStorage", exc, where)
    if isinstance(exc, PromptCacheError):
        return HttpError(404 if isinstance(exc, UnknownDocumentError) else 400, hide_paths(str(exc)),
                         type(exc).__name__)
    return _server_side(500, INTERNAL_MESSAGE, "InternalError", exc, where)


MAX_PROBLEMS = 10  # a list of 2,000 wrong stop strings needs one line of example, not 2,000


def validation_message(errors: Sequence[dict], content_type: str | None) -> str:
    """Returns the 422's message for FastAPI's validation `errors`: `where: what` for each, the first MAX_PROBLEMS.

    Args:
        errors: RequestValidationError.errors() (pydantic's, plus FastAPI's json_invalid).
        content_type: the request's Content-Type header; None when it has none.
    """
    problems = [_problem(error, content_type) for error in errors[:MAX_PROBLEMS]]
    if len(errors) > MAX_PROBLEMS:
        problems.append(f"and {len(errors) - MAX_PROBLEMS} more")
    return "invalid request: " + "; ".join(problems)


def _problem(error: dict, content_type: str | None) -> str:
    where = ".".join(str(part) for part in error.get("loc", ()))
    if error.get("type") == "json_invalid":  # FastAPI's loc is ("body", character)
        reason = (error.get("ctx") or {}).get("error", "not JSON")
        return f"body: not JSON at character {error['loc'][-1]}: {reason}; send one JSON object, in UTF-8"
    if where == "body" and not _is_json(content_type):  # FastAPI reads no body of another type
        sent = f"Content-Type {content_type!r}" if content_type else "no Content-Type"
        return f"body: send a JSON object with the header Content-Type: application/json (this one has {sent})"
    if where == "body" and error.get("type") == "missing":
        return "body: empty; send one JSON object"
    return f"{where}: {error.get('msg')}"


def _is_json(content_type: str | None) -> bool:
    """Returns whether FastAPI reads a body of `content_type` as JSON: application/json or application/*+json."""
    if not content_type:
        return False
    header = Message()
    header["content-type"] = content_type
    subtype = header.get_content_subtype()
    return header.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json"))


def hide_paths(message: str) -> str:
    """Returns `message` with every absolute filesystem path written `<path>`: where the server keeps its files is its own."""
    return _ABSOLUTE_PATH.sub("<path>", message)


def _server_side(status: int, message: str, type_: str, exc: Exception, where: str) -> HttpError:
    request_id = uuid.uuid4().hex[:12]
    log.error("request %s (%s) failed: %s: %s", request_id, where, type(exc).__name__, exc, exc_info=exc)
    return HttpError(status, f"{message} (request id {request_id}; {_LOG_HAS_IT})", type_, request_id)
