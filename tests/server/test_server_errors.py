"""Server-side failures: a generic 5xx with a request id whose details are in the log, never a path or a traceback."""

from __future__ import annotations

import errno
import logging
import re

import pytest

from pc_cpu.errors import DocumentError, StoreError
from pc_cpu.store.disk import DiskStore
from tests.server.conftest import DOC_PROMPT, sse_events

SECRET = "/root/.cache/pc_cpu/store/0123abcd.pcs"  # what must never reach a client
REQUEST_ID = re.compile(r"request id ([0-9a-f]{12})")


def _logged(caplog, request_id: str) -> str:
    """Returns the server log lines that name `request_id`, with their tracebacks."""
    return "\n".join(r.getMessage() + (r.exc_text or "") for r in caplog.records if request_id in r.getMessage())


def _full_disk(error: str):
    def put(self, key, entry):
        if error == "OSError":
            raise OSError(errno.ENOSPC, "No space left on device", SECRET)
        raise StoreError(f"cannot write store file {SECRET}: [Errno 28] No space left on device; free disk space")
    return put


@pytest.mark.parametrize("error", ["StoreError", "OSError"])
def test_a_full_disk_while_adding_a_document_is_507_without_the_path(client, monkeypatch, caplog, error):
    monkeypatch.setattr(DiskStore, "put", _full_disk(error))
    caplog.set_level(logging.ERROR, logger="pc_cpu.server")
    response = client.post("/v1/documents", json={"text": f"A note written when the disk was full ({error})."})
    assert response.status_code == 507, response.text
    body = response.json()["error"]
    assert body["type"] == "InsufficientStorage" and "/root" not in response.text and ".pcs" not in response.text
    assert body["message"].startswith("the server's store cannot be written (disk full?)")
    request_id = REQUEST_ID.search(body["message"]).group(1)
    assert response.headers["x-request-id"] == request_id
    assert SECRET in _logged(caplog, request_id)  # the operator still finds what happened
    listing = client.get("/v1/documents")
    assert listing.status_code == 200  # the server goes on
    assert "disk was full" not in listing.text  # and the failed add left no document registered


def test_an_unexpected_exception_is_a_generic_500_logged_with_its_id(client, server_cache, monkeypatch, caplog):
    def broken():
        raise RuntimeError(f"cannot open {SECRET}")

    monkeypatch.setattr(server_cache, "list_documents", broken)
    caplog.set_level(logging.ERROR, logger="pc_cpu.server")
    response = client.get("/v1/documents")
    assert response.status_code == 500, response.text
    body = response.json()["error"]
    assert body["type"] == "InternalError" and "/root" not in response.text and "RuntimeError" not in response.text
    request_id = REQUEST_ID.search(body["message"]).group(1)
    logged = _logged(caplog, request_id)
    assert SECRET in logged and "Traceback" in logged and "GET /v1/documents" in logged


class _BreaksAfterOnePiece:
    """Stands for a PromptCache stream that fails mid-answer with an unexpected error."""

    result = None

    def __iter__(self):
        yield "Boats"
        raise RuntimeError(f"decode failed reading {SECRET}")

    def close(self) -> None:
        pass


def test_an_unexpected_error_inside_a_stream_is_a_generic_event(client, server_cache, monkeypatch, caplog):
    monkeypatch.setattr(server_cache, "stream", lambda *args, **kwargs: _BreaksAfterOnePiece())
    caplog.set_level(logging.ERROR, logger="pc_cpu.server")
    with client.stream("POST", "/v1/completions", json={"prompt": DOC_PROMPT, "stream": True}) as response:
        assert response.status_code == 200
        events = sse_events(response)
    assert events[0]["choices"][0]["text"] == "Boats" and events[-1] == "[DONE]"
    error = events[-2]["error"]
    assert error["type"] == "InternalError" and "/root" not in str(events)
    assert SECRET in _logged(caplog, REQUEST_ID.search(error["message"]).group(1))


def test_a_path_in_a_client_error_message_is_hidden(client, server_cache, monkeypatch):
    def refuse(*args, **kwargs):
        raise DocumentError(f"document cannot be read from '{SECRET}'; see GET /v1/documents")

    monkeypatch.setattr(server_cache, "add_document", refuse)
    response = client.post("/v1/documents", json={"text": "Some text."})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["message"] == "document cannot be read from '<path>'; see GET /v1/documents"
