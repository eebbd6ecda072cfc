"""Shows which llama_decode call shapes change a token's bits on this CPU and build: why exactness rests on equal calls.

The same tokens at the same positions are computed in one call, then split in two calls at every
point; the cells (state bytes) and the last token's logits are compared with the one-call ones.
A split "changes bits" when any cell differs. llama.cpp's matmul kernels tile a batch's rows
(tinyBLAS picks a tile by the rows left; repacked weights run 4-row tiles), so which splits do
depends on the weight types, the CPU, the build and the extra buffer types (README, "Same tokens,
same answer").

    python bench/batch_shapes.py --model qwen2.5-coder-0.5b
    PC_CPU_EXTRA_BUFFERS=on python bench/batch_shapes.py --model qwen2.5-coder-0.5b
    PYTHONPATH=~/.cache/pc_cpu/llama_variants/avx2 python bench/batch_shapes.py   # another build (bench/cpu_variants.py)
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from pc_cpu.engine.llama.context import Context, ContextConfig
from pc_cpu.engine.llama.extra_buffers import decide, system_info
from pc_cpu.engine.llama.model import Model
from pc_cpu.model_path import resolve_model_path

TEXT = ("The lighthouse keeper climbed the spiral stairs every evening at dusk, trimmed the wick, polished "
        "the great lens and wrote the weather into a leather book. What did the keeper polish?")


def computed(ctx: Context, tokens: list[int], splits: list[int]) -> tuple[np.ndarray, bytes]:
    """Returns the last token's logits and the cells of `tokens` computed in calls that start at 0 and at `splits`."""
    ctx.seq_rm(0)
    edges = sorted({0, *splits, len(tokens)})
    for lo, hi in zip(edges, edges[1:]):
        ctx.decode(tokens[lo:hi], range(lo, hi), 0, logits_last=hi == len(tokens))
    return ctx.logits(), ctx.state_get(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", action="store_true", help="one JSON object instead of lines")
    args = parser.parse_args()
    model = Model(resolve_model_path(args.model))
    ctx = Context(model, ContextConfig(n_ctx=512, n_seq_max=1, flash_attn=False, kv_unified=False,
                                       threads=args.threads))
    tokens = model.tokenize(TEXT, special=False)
    n = len(tokens)
    logits, cells = computed(ctx, tokens, [])
    changed, worst = [], 0.0
    for first in range(1, n):  # calls of `first` and n - first tokens
        other_logits, other_cells = computed(ctx, tokens, [first])
        if other_cells != cells:
            changed.append(first)
        worst = max(worst, float(np.abs(other_logits - logits).max()))
    features = " ".join(f.split(":")[-1].split("=")[0].strip() for f in system_info().split("|")
                        if f.strip().endswith("= 1"))
    report = {"model": model.path.name, "tokens": n, "features": features,
              "extra_buffers": decide().enabled, "first_call_sizes_that_change_bits": changed,
              "max_logit_difference": worst}
    if args.json:
        print(json.dumps(report))
        return
    print(f"{model.path.name}, {n} tokens; build: {features}; extra buffers {'on' if report['extra_buffers'] else 'off'}")
    print(f"two calls of (k, {n} - k) tokens change the cells for k in: {changed or 'none'}")
    print(f"largest last-token logit difference from one call: {worst:.3f}")
    ctx.close()
    model.close()


if __name__ == "__main__":
    main()
