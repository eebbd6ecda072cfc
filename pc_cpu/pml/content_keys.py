"""Gives the content keys of cached cells: digests of what the cells depend on, by one recipe family.

Every key that finds cells in a tier is made here (pc_cpu.store.keys.StoreKey carries it): a
schema's encodings (pc_cpu.pml.encoding.encoding_content builds its parts), a document's
preamble, cells and exact prefix, and a conversation's prefixes and answers. Each is the sha256
of a tag naming the recipe and its version, then the parts. Two serializations of the parts:
JSON of short descriptions (content_digest), and raw token bytes where a conversation's digest
is extended call by call over thousands of tokens (prefix_digests hashes each token once,
for every end at once). Both are kept byte for byte as earlier releases wrote them, so a store
written before keeps serving; changing one means bumping its tag, and old entries then miss.
"""

from __future__ import annotations

import hashlib
import json
from array import array
from typing import Any, Sequence

DOCUMENT_MODE = "document"  # the StoreKey mode of a document's cells (pc_cpu.pml.document_layout)
_CONTENT_TAG = "pc_cpu.content/1"  # bump if a recipe changes: every key changes, old store files miss


def content_digest(*parts: Any) -> str:
    """Returns the sha256 hex digest of JSON-able parts (ints, strings, lists of them), fields kept apart."""
    canonical = json.dumps([_CONTENT_TAG, *parts], ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


# --- documents ---------------------------------------------------------------------------------

def preamble_content(preamble: tuple[int, ...]) -> str:
    """Returns the content digest of a preamble's cells: its tokens at positions 0..n-1."""
    return content_digest(DOCUMENT_MODE, "preamble", list(preamble))


def document_content(preamble: tuple[int, ...], tokens: tuple[int, ...]) -> str:
    """Returns the content digest of a document's cells: computed after `preamble`, from its home position."""
    return content_digest(DOCUMENT_MODE, "document", list(preamble), len(preamble), list(tokens))


def prefix_content(tokens: tuple[int, ...], cuts: tuple[int, ...]) -> str:
    """Returns the content digest of a prompt's exact prefix: its tokens before the tail, computed at 0..n-1 in calls from `cuts`.

    The tokens are the preamble and the documents in prompt order, so another system message,
    other documents or another order is another prefix; the calls they were computed in
    (DocumentPrompt.prefix_cuts) are part of what the cells are.
    """
    return content_digest(DOCUMENT_MODE, "prefix", list(tokens), list(cuts))


# --- conversations -----------------------------------------------------------------------------

def prefix_digests(tokens: Sequence[int], cuts: Sequence[int], ends: Sequence[int], *, how: str = "") -> dict[int, str]:
    """Returns {end: the content digest of the cells of tokens[:end]} for each of `ends`, in one pass.

    The cells depend on the tokens, on the calls they were decoded in (`cuts`: where each call
    starts) and on `how` they were made beyond that ("": as the full prefill; "documents": with
    documents encoded apart and moved into place).
    """
    # Each token hashed as 2*token + 1 where a call starts: the same tokens decoded in other
    # calls are other cells, so another digest.
    marked = array("q", (2 * token for token in tokens))
    for cut in cuts:
        if 0 < cut < len(marked):
            marked[cut] += 1
    digest = hashlib.sha256(f"pc_cpu.chat/1 {how}".encode())
    out, pos = {}, 0
    for end in sorted(set(ends)):
        digest.update(marked[pos:end].tobytes())
        pos = end
        out[end] = digest.copy().hexdigest()
    return out


def answer_digest(tokens: Sequence[int]) -> str:
    """Returns a digest of `tokens` alone (not of what precedes them): how an edited conversation finds its old answers."""
    return hashlib.sha256(b"pc_cpu.chat.answer/1 " + array("q", tokens).tobytes()).hexdigest()
