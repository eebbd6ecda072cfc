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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' Engine and texts, run from anywhere
from pc_cpu.engine.cells.streams import full_prefill  # noqa: E402
from pc_cpu.pml.document_layout import document_segment, document_tokens, preamble_tokens  # noqa: E402
from pc_cpu.kvstate import state_blob, parts  # noqa: E402
from pc_cpu.store.entry import Entry  # noqa: E402
from tests.engine.machinery import Engine  # noqa: E402
from tests.engine.test_gemma import lamps  # noqa: E402

QUESTION = "Which lamp was painted red in 1905?"


def cached_logits(engine: Engine, docs: list[str], recompute: str):
    """Returns the last logits of QUESTION over `docs` assembled as `ask` assembles it (encoded apart, prefix "off")."""
    work = engine.question(QUESTION, docs, recompute=recompute)
    work.prepare()
    work.prefill(0)
    try:
        return engine.prompts.logits()
    finally:
        engine.prompts.seq_rm(0)


def full_logits(engine: Engine, tokens: list[int]):
    """Returns the last logits of a full prefill of `tokens` in prompt stream 0, in llama.cpp's own batches."""
    full_prefill(engine.prompts, tokens, 0)
    try:
        return engine.prompts.logits()
    finally:
        engine.prompts.seq_rm(0)


out = {}
# The machinery as a PromptCache builds it (tests/engine/machinery.py), driven by hand.
with Engine("gemma3-270m", threads=1, n_ctx=4096, store=False) as pc:
    short = pc.add("The Calder Light was automated in 1987 and painted white in 1990.")
    text = " ".join(lamps(k) for k in range(8))
    long = pc.add(text)
    pre = preamble_tokens(None, pc.model, pc.markup)
    tokens = document_tokens(text, pc.model)
    out["long_tokens"] = len(tokens)
    docs = [short, long]
    prompt = pc.document_prompt(QUESTION, docs)
    full = full_logits(pc, list(prompt.tokens))
    partial = {p: cached_logits(pc, docs, p) for p in ("0", "tail:64", "10%", "tail:256", "all")}
    stored, _ = pc.encoder.document_blob(pre, long, tokens)  # as stored: the cells a prompt restores
    home = len(pre)
    blobs = pc.modules.encoder.compute_apart(document_segment(pre, tokens, "long"))
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
    key = pc.encoder.document_key(pre, long, tokens)
    pc.store.put(key, Entry(parts.pack([whole]), len(tokens), (home, home + len(tokens))))
    wholes = {p: cached_logits(pc, docs, p) for p in partial}
    scale = float(np.abs(full).max())
    for p in partial:
        out[p] = {"stored_vs_whole_max_rel": float(np.abs(partial[p] - wholes[p]).max()) / scale,
                  "stored_vs_full": float(np.abs(partial[p] - full).max()) / scale,
                  "whole_vs_full": float(np.abs(wholes[p] - full).max()) / scale,
                  "argmax_stored_whole_full": [int(partial[p].argmax()), int(wholes[p].argmax()), int(full.argmax())]}
print(json.dumps(out, indent=1))
