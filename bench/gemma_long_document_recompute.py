"""Gemma 3: how much a long document's missing window-layer cells change a partial recompute.

llama.cpp saves only the last window (512) of a sequence's window-layer cells, so a stored
document longer than that lacks the rest. Tokens recomputed near its end (tail:K, 10%) attend to
some of those. This asks one question over [short, long] with each policy, with the stored blob
and with a whole one (computed in spans in the library context, bit-identical where both hold a
cell), and against a full prefill in one batch, and prints the largest logit differences relative
to the largest logit.

    python bench/gemma_long_document_recompute.py > bench/results/gemma_long_document_recompute.json
"""
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' prompt helpers, run from anywhere
from pc_cpu import PromptCache
from pc_cpu.pml.document_layout import document_segment, document_tokens, preamble_tokens
from pc_cpu.kvstate import state_blob, parts
from pc_cpu.store.entry import Entry
from tests.engine.test_documents import cached_logits, prefill_logits, _prompt
from tests.engine.test_gemma import lamps

QUESTION = "Which lamp was painted red in 1905?"
out = {}
with PromptCache("gemma3-270m", threads=1, n_ctx=4096, store=False) as pc:
    short = pc.add_document("The Calder Light was automated in 1987 and painted white in 1990.")
    text = " ".join(lamps(k) for k in range(8))
    long = pc.add_document(text)
    pre = preamble_tokens(None, pc.model, pc.markup)
    tokens = document_tokens(text, pc.model)
    out["long_tokens"] = len(tokens)
    docs = [short, long]
    prompt = _prompt(pc, QUESTION, docs)
    full = prefill_logits(pc, list(prompt.tokens), [])
    partial = {p: cached_logits(pc, QUESTION, docs, recompute=p) for p in ("0", "tail:64", "10%", "tail:256", "all")}
    stored = pc.document_cells(long)
    home = len(pre)
    blobs = pc.engine.modules.encoder.compute_apart(document_segment(pre, tokens, "long"))
    whole = bytes(state_blob.splice(blobs))
    out["cells_stored_vs_whole"] = [state_blob.section_cells(stored), state_blob.section_cells(whole)]
    # the cells both hold must agree (same batches), so the difference is only the missing ones
    for sec in range(2):
        for layer in (0, 1):
            a, b = state_blob.layer_kv(stored, layer, section=sec), state_blob.layer_kv(whole, layer, section=sec)
            rows = {p: i for i, p in enumerate(b[0].tolist())}
            idx = [rows[p] for p in a[0].tolist()]
            out.setdefault("common_cells_max_abs_diff", []).append(
                max(float(np.abs(a[1] - b[1][idx]).max()), float(np.abs(a[2] - b[2][idx]).max())))
    key = pc.engine.documents.encoder.document_key(pre, long, tokens)
    pc.store.put(key, Entry(parts.pack([whole]), len(tokens), (home, home + len(tokens))))
    wholes = {p: cached_logits(pc, QUESTION, docs, recompute=p) for p in partial}
    scale = float(np.abs(full).max())
    for p in partial:
        out[p] = {"stored_vs_whole_max_rel": float(np.abs(partial[p] - wholes[p]).max()) / scale,
                  "stored_vs_full": float(np.abs(partial[p] - full).max()) / scale,
                  "whole_vs_full": float(np.abs(wholes[p] - full).max()) / scale,
                  "argmax_stored_whole_full": [int(partial[p].argmax()), int(wholes[p].argmax()), int(full.argmax())]}
print(json.dumps(out, indent=1))
