"""Exploration: does a K scale on documents' cached cells (APE's attention temperature) close the gap to the full prefill?

APE (Yang, Chen, Chen, ICLR 2025) divides the attention logits of parallel-encoded contexts by a
temperature. A logit is q·k, so scaling the cached K of every document cell by s is a temperature
of 1/s on those cells alone; RoPE is linear, so the scale commutes with the rotation. This script
scales the K rows of the document cells in the blob `ask` restores (the preamble's and the
question's cells are untouched), through a patch of pc_cpu.engine.prompts.document_cells, and scores NQ
answers against the full prefill of the same tokens, paired. Tuning data only: NQ questions whose
line in the file is even (the odd ones are kept for reporting, as in `pc-cpu bench documents accuracy`).

Not a product path: the patch and the reading of blob internals are for this measurement.

    python bench/ape_k_scale.py --model qwen2.5-coder-0.5b --n 100 --scale 1.0 --scale 1.1 --scale 0.9
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time

import numpy as np

from pc_cpu import PromptCache
from pc_cpu.benchmarks.documents import SYSTEM, correct, passage_text
from pc_cpu.benchmarks.evaldata import doc_items, load_nq
from pc_cpu.benchmarks.intervals import paired_difference
from pc_cpu.engine.prompts import document_cells
from pc_cpu.kvstate import state_blob

F16 = 1  # ggml type id


def scale_document_k(blob: memoryview, home: int, scale: float) -> None:
    """Multiplies, in place, the F16 K rows of every cell at a position >= `home` by `scale`."""
    positions = state_blob.section_positions(blob)
    for rec in state_blob.k_rows(blob):
        if rec.type != F16:
            raise SystemExit(f"K type {rec.type} is not F16; this experiment scales F16 rows only")
        moved = positions[rec.section] >= home
        rows = np.ndarray((rec.n_cell, rec.row_size // 2), dtype=np.float16, buffer=blob, offset=rec.offset)
        rows[moved] = (rows[moved].astype(np.float32) * scale).astype(np.float16)


@contextlib.contextmanager
def k_scale(scale: float, home: int):
    """Scales documents' K in every prompt `ask` assembles while inside."""
    original = document_cells.DocumentEncoder.assembled

    def scaled(self, pieces):
        view = original(self, pieces)
        if scale != 1.0:
            scale_document_k(view, home, scale)
        return view

    document_cells.DocumentEncoder.assembled = scaled
    try:
        yield
    finally:
        document_cells.DocumentEncoder.assembled = original


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--docs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--scale", type=float, action="append", default=[])
    args = parser.parse_args()
    scales = args.scale or [1.0]
    questions = load_nq()
    items = [it for it in doc_items(questions, args.docs, min(len(questions), 4 * args.n)) if it.index % 2 == 0]
    items = items[:args.n]
    hits = {s: [] for s in scales}
    full = []
    started = time.time()
    with tempfile.TemporaryDirectory() as store, PromptCache(args.model, threads=args.threads, store=store) as pc:
        from pc_cpu.pml.document_layout import preamble_tokens

        home = len(preamble_tokens(SYSTEM, pc.model, pc.schemas.markup))
        for k, item in enumerate(items):
            ids = [pc.add_document(passage_text(p), system=SYSTEM) for p in item.passages]
            baseline = pc.ask(item.question, documents=ids, system=SYSTEM, max_tokens=24, use_cache=False)
            full.append(correct(baseline.text, item.answers))
            for s in scales:
                pc.evict()  # a free slot keeps its stream and would serve the next variant's head unscaled
                with k_scale(s, home):
                    cached = pc.ask(item.question, documents=ids, system=SYSTEM, max_tokens=24)
                hits[s].append(correct(cached.text, item.answers))
            if (k + 1) % 10 == 0:
                print(f"{k + 1}/{len(items)} {time.time() - started:.0f}s full {np.mean(full):.2f} "
                      + " ".join(f"x{s}: {np.mean(h):.2f}" for s, h in hits.items()), flush=True)
    rows = {"model": args.model, "n": len(items), "full_prefill": float(np.mean(full))}
    for s, h in hits.items():
        d = paired_difference(h, full)
        rows[f"k_scale_{s}"] = {"accuracy": float(np.mean(h)), "vs_full_pts": d.pts()}
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
