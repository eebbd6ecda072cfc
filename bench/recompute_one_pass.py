"""Recompute of a document prompt: 5 runs of 16 tokens against one run of 80, one-pass path against the old one.

A question over 5 documents of ~150 tokens. Four ways to build its stream (DocumentEncoder.prefill,
the documents' cells already in RAM, so no encoding is timed):

- runs5: the first 16 tokens of each document computed again (5 runs, as head:16 would if the
  first document were not left out);
- run80: 80 consecutive tokens of the last document computed again (one run);
- none: nothing computed again (the floor: restore and the question);

each through the old path (every run decoded alone in the workspace stream, the state read back
after it, cached pieces cut by llama.cpp round trips) and the new one (pc_cpu.engine.recompute.recompute_pass:
all runs in one decode in the library context; one run keeps the stream path, so `run80 new` is the
stream path; `run80 lib` forces the one-pass code on it, for comparison). Settings alternate within
each repeat; medians reported. Then one build of each is timed by phase (the context calls).
The machinery is driven by hand: built as a PromptCache builds it (tests/engine/machinery.py Engine).

    python bench/recompute_one_pass.py [--model qwen2.5-coder-0.5b] [--threads 2] [--repeats 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' Engine, run from anywhere
from pc_cpu.engine.recompute import recompute_pass  # noqa: E402
from pc_cpu.engine.prompts.document_prompt import DocumentWork  # noqa: E402
from pc_cpu.kvstate import ops  # noqa: E402
from tests.engine.machinery import Engine  # noqa: E402

TOPICS = ["lighthouse keeper", "river ferry", "mountain observatory", "harbour market", "glass workshop"]
QUESTION = "Which place opens earliest in the morning?"


def document(topic: str, i: int) -> str:
    sentences = [f"The {topic} opens at {6 + i} in the morning and closes at {17 + i} in the evening.",
                 f"Visitors to the {topic} are asked to sign the book by the door and to keep to the paths.",
                 f"In {1880 + 7 * i} the {topic} was rebuilt after a storm took away most of its roof.",
                 f"Its keeper, who has worked there for {12 + i} years, says the busiest month is August.",
                 f"A small museum beside the {topic} shows tools, maps and letters from the first owners.",
                 f"Tickets cost {3 + i} euros for adults; children and the people of the town enter free.",
                 f"On clear days the {topic} can be seen from the old bridge, {2 + i} kilometres away."]
    return " ".join(sentences)


def build_prompts(pc: Engine):
    ids = [pc.add(document(t, i)) for i, t in enumerate(TOPICS)]
    base = pc.document_prompt(QUESTION, ids)
    last = base.documents[-1]
    return {
        "runs5": replace(base, recomputed=tuple((d.start, d.start + 16) for d in base.documents)),
        "run80": replace(base, recomputed=((last.start, last.start + 80),)),
        "none": base,
    }


def pieces_of(pc: Engine, prompt):
    work = DocumentWork(prompt, pc.encoder, True)
    work.prepare()
    return work.pieces


def build(pc: Engine, prompt, pieces, way: str) -> float:
    """Returns the seconds a build of prompt stream 0 takes the `way` given (old, new, lib)."""
    enc = pc.encoder
    room = enc.library
    enc.library = None if way == "old" else room
    try:
        t0 = time.perf_counter()
        if way == "lib":  # the one-pass code on a single run, which prefill sends to the stream path
            pc.prompts.seq_rm(0)
            cached = ops.restore_blob([enc.move(p, 0) for p in pieces], 1)
            assert recompute_pass.recompute_in_library(room, cached, prompt.recomputed,
                                                       prompt.tokens[:prompt.tail_start], pc.prompts, 0)
            enc._tail(prompt, 0)
        else:
            enc.prefill(prompt, pieces, 0)
        seconds = time.perf_counter() - t0
    finally:
        enc.library = room
        pc.prompts.seq_rm(0)
    return seconds


CALLS = ("state_set", "state_get", "state_get_reusing", "decode", "seq_cp", "seq_rm", "seq_add")


def phases(pc: Engine, prompt, pieces, way: str) -> dict[str, float]:
    """Returns milliseconds by context call (library/prompts) of one build, and the rest (Python, blob ops)."""
    spent: dict[str, float] = defaultdict(float)
    patched = []
    for name, ctx in (("library", pc.ctx), ("prompts", pc.prompts)):
        for call in CALLS:
            original = getattr(ctx, call)

            def timed(*args, _original=original, _key=f"{name}.{call}", **kwargs):
                t0 = time.perf_counter()
                try:
                    return _original(*args, **kwargs)
                finally:
                    spent[_key] += (time.perf_counter() - t0) * 1000
            setattr(ctx, call, timed)
            patched.append((ctx, call))
    try:
        total = build(pc, prompt, pieces, way) * 1000
    finally:
        for ctx, call in patched:
            delattr(ctx, call)
    out = {key: round(ms, 2) for key, ms in sorted(spent.items())}
    out["rest"] = round(total - sum(spent.values()), 2)
    out["total"] = round(total, 2)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--n-ctx", type=int, default=2048)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    pc = Engine(args.model, threads=args.threads, n_ctx=args.n_ctx, store=False)
    try:
        prompts = build_prompts(pc)
        pieces = {name: pieces_of(pc, prompt) for name, prompt in prompts.items()}
        settings = [("runs5", "old"), ("runs5", "new"), ("run80", "old"), ("run80", "lib"), ("none", "new")]
        for setting in settings:  # warm-up: first-touch of buffers and kernels
            build(pc, prompts[setting[0]], pieces[setting[0]], setting[1])
        times = defaultdict(list)
        for _ in range(args.repeats):
            for name, way in settings:
                times[f"{name} {way}"].append(build(pc, prompts[name], pieces[name], way) * 1000)
        medians = {key: round(statistics.median(v), 1) for key, v in times.items()}
        report = {
            "model": args.model, "threads": args.threads, "repeats": args.repeats,
            "documents": [len(d.tokens) for d in prompts["none"].documents], "tail": len(prompts["none"].tail),
            "median_ms": medians,
            "ratio_runs5_new_over_run80_old": round(medians["runs5 new"] / medians["run80 old"], 2),
            "ratio_runs5_old_over_run80_old": round(medians["runs5 old"] / medians["run80 old"], 2),
            "phases_ms": {f"{name} {way}": phases(pc, prompts[name], pieces[name], way) for name, way in settings},
        }
    finally:
        pc.close()
    if args.json:
        print(json.dumps(report, indent=1))
        return
    print(f"{args.model}, {args.threads} threads, documents {report['documents']} tokens, question "
          f"{report['tail']}, median of {args.repeats}")
    for key, ms in medians.items():
        print(f"  {key:10s} {ms:8.1f} ms")
    print(f"  runs5 new / run80 old = {report['ratio_runs5_new_over_run80_old']}, "
          f"runs5 old / run80 old = {report['ratio_runs5_old_over_run80_old']}")
    for key, ph in report["phases_ms"].items():
        print(f"  phases {key}: " + ", ".join(f"{k} {v}" for k, v in ph.items()))


if __name__ == "__main__":
    main()
