"""TTFT of a PML prompt that imports a schema's modules out of order (so they are moved), by both moving paths.

A schema of ~`--tokens` tokens of document modules; prompts import all of them and
ask a short question:

- in_order: in schema order, nothing moved (the modules' own resident cells);
- moved_relocator: in reverse order, every module but the one at the preamble moved,
  its private copy re-rotated by the C relocator (pc_cpu.engine.cells.relocate.copy_moved);
- moved_seq_add: the same prompt, the copies moved by llama.cpp's seq_add instead
  (the path sliding-window models took before the relocator knew their second RoPE);
- full_prefill: the same tokens as the moved prompt, nothing cached.

One cache's machinery, built as a PromptCache builds it (tests/engine/machinery.py Engine: the
relocator is switched off by hand for moved_seq_add), its prompts run by its scheduler as
`generate` runs them; settings alternate within each repeat; medians and ratios to the full
prefill's median.

    python bench/packed.py --model gemma3-270m --threads 2 --repeats 5 [--tokens 1000] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from ttft import document_modules  # noqa: E402  (bench/ is run as a script directory)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' Engine, run from anywhere
from tests.engine.machinery import Engine  # noqa: E402

SETTINGS = ("in_order", "moved_relocator", "moved_seq_add", "full_prefill")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    with Engine(args.model, threads=args.threads, n_ctx=8192, store=False) as pc:
        modules = document_modules(pc, args.tokens, texts_per_module=1)
        body = "".join(f'<module name="{n}">{t}</module>' for n, t in modules)
        layout = pc.load(f'<schema name="bench"><system>Answer from the documents.</system><user>{body}</user></schema>')
        question = "<user>When was the Calder Light automated?</user>"
        in_order = f'<prompt schema="bench">{"".join(f"<{n}/>" for n, _ in modules)}{question}</prompt>'
        moved = f'<prompt schema="bench">{"".join(f"<{n}/>" for n, _ in reversed(modules))}{question}</prompt>'
        relocator = pc.modules.rope
        if relocator is None:
            raise SystemExit("this model's cells are moved by seq_add only: nothing to compare")

        def run(setting: str) -> float:
            pc.modules.rope = None if setting == "moved_seq_add" else relocator
            prompt = in_order if setting == "in_order" else moved
            pc.drop_held()  # a stream still holding this prompt's cells would be reused, not assembled
            return pc.generate(layout, prompt, max_tokens=1, use_cache=setting != "full_prefill").ttft_ms

        for setting in SETTINGS:  # warm-up, untimed
            run(setting)
        times: dict[str, list[float]] = {s: [] for s in SETTINGS}
        for _ in range(args.repeats):
            for setting in SETTINGS:
                times[setting].append(run(setting))
        pc.modules.rope = relocator
        plan = pc.plan(layout, moved)
    full = statistics.median(times["full_prefill"])
    out = {"model": pc.model.path.name, "threads": args.threads, "repeats": args.repeats,
           "cached_tokens": plan.cached_tokens, "uncached_tokens": plan.uncached_tokens, "modules": len(modules),
           "ttft_ms": {s: round(statistics.median(t), 1) for s, t in times.items()},
           "speedup": {s: round(full / statistics.median(t), 2) for s, t in times.items()}, "runs_ms": times}
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"{out['model']}: {len(modules)} modules, {plan.cached_tokens} cached + {plan.uncached_tokens} computed "
          f"tokens, {args.threads} threads, median of {args.repeats}")
    print("| setting | TTFT ms | vs full prefill |\n|---|---|---|")
    for s in SETTINGS:
        print(f"| {s} | {out['ttft_ms'][s]} | {out['speedup'][s]}x |")


if __name__ == "__main__":
    main()
