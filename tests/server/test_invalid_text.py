"""Text that cannot become UTF-8 (a lone UTF-16 surrogate, JSON "\\udc80") is a 422 naming the field, on every route."""

from __future__ import annotations

import json

import pytest

from tests.server.conftest import DOC_PROMPT, DOC_SCHEMA

LONE = "\udc80"  # what Python's json makes of the JSON escape "\udc80": a str that UTF-8 cannot encode
USER = {"role": "user", "content": "<doc/> Hi"}


def _post_raw(client, url: str, body: dict):
    """Posts `body` as JSON with every non-ASCII character escaped (httpx's json= cannot encode a surrogate)."""
    return client.post(url, content=json.dumps(body), headers={"content-type": "application/json"})


@pytest.mark.parametrize("url, body, field, at", [
    ("/v1/completions", {"prompt": DOC_PROMPT[:20] + LONE + DOC_PROMPT[20:]}, "prompt", 21),
    ("/v1/completions", {"prompt": [LONE]}, "prompt[0]", 1),
    ("/v1/completions", {"prompt": DOC_PROMPT, "stop": ["ok", "x" + LONE]}, "stop[1]", 2),
    ("/v1/chat/completions", {"schema": "c", "messages": [{"role": "user", "content": "Hi " + LONE}]},
     "messages[0].content", 4),
    ("/v1/chat/completions", {"schema": "c", "messages": [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": LONE}]},
        USER]}, "messages[0].content[1].text", 1),
    ("/v1/chat/completions", {"schema": "c" + LONE, "messages": [USER]}, "schema", 2),
    ("/v1/chat/completions", {"documents": ["a" + LONE], "messages": [USER]}, "documents[0]", 2),
    ("/v1/documents", {"text": "Boats " + LONE + " float."}, "text", 7),
    ("/v1/documents", {"text": "Boats float.", "name": LONE + ".txt"}, "name", 1),
    ("/v1/documents", {"text": "Boats float.", "system": "Be " + LONE}, "system", 4),
    ("/v1/schemas", {"pml": DOC_SCHEMA.replace("boats", "boats" + LONE)}, "pml", DOC_SCHEMA.index("boats") + 6),
])
def test_a_lone_surrogate_is_a_422_naming_the_field_and_where(client, url, body, field, at):
    response = _post_raw(client, url, body)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["type"] == "RequestValidationError"
    assert f"invalid Unicode: a lone surrogate (U+DC80) at character {at} of {field}; send UTF-8 text" \
        in error["message"]


def test_a_lone_surrogate_in_a_key_is_refused_without_echoing_it(client):
    response = _post_raw(client, "/v1/documents", {"text": "Boats float.", "x" + LONE: LONE})
    assert response.status_code == 422, response.text
    assert "a key of the body" in response.json()["error"]["message"]


def test_surrogate_bytes_in_the_body_are_refused_too(client):
    # Python's json reads UTF-8-encoded surrogates (CESU-8 bytes ED B2 80) as a lone surrogate.
    body = b'{"text": "Boats \xed\xb2\x80 float."}'
    response = client.post("/v1/documents", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text
    assert "lone surrogate (U+DC80) at character 7 of text" in response.json()["error"]["message"]


def test_a_surrogate_pair_is_ordinary_text(client):
    response = _post_raw(client, "/v1/documents", {"text": "Boats float \U0001F6A4."})  # \ud83d\udea4 in the JSON
    assert response.status_code == 200, response.text
    assert client.delete(f"/v1/documents/{response.json()['id']}").status_code == 200
