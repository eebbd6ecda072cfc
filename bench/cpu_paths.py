"""What the CPU settings cost: extra buffer types on/off, 1 thread against every core (idle and under load), flash attention.

Each measurement is a fresh process (the extra-buffer decision is made once per process), running
one full prefill of the same tokens (TTFT) and then greedy decoding (tokens per second), through
PromptCache with use_cache=False. Settings alternate within each repeat, so drift in the machine's
speed hits them alike; medians are reported. "Under load" runs one busy process per core
but one beside it (a stand-in for the other jobs on a laptop: a browser, a build).

    python bench/cpu_paths.py --model qwen2.5-coder-0.5b --repeats 3
    python bench/cpu_paths.py --what flash-attn --prompt-tokens 4000 --repeats 3   # on against pc_cpu's default
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from contextlib import contextmanager

CHILD = """
import json, sys, time
from pc_cpu import PromptCache
model, threads, n_prompt, n_decode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
flash_attn = {"default": None, "on": True, "off": False}[sys.argv[5]]
words = " ".join(f"item {i} is on shelf {i % 17}." for i in range(n_prompt))
with PromptCache(model, threads=threads or None, n_ctx=max(4096, n_prompt + 2 * n_decode + 64), store=False,
                 flash_attn=flash_attn) as pc:
    tokens = pc.model.tokenize(words, special=False)[:n_prompt]
    text = pc.model.detokenize(tokens)
    escaped = text.replace("&", "&amp;").replace("<", "&lt;")
    schema = '<schema name="b"><module name="m">' + escaped + '</module></schema>'
    pc.load_schema(schema, encode=False)
    # A user turn, so that the model answers at length (a bare continuation may end at once).
    stream = pc.stream('<prompt schema="b"><m/><user>List every item on shelf 3, one per line.</user></prompt>',
                       max_tokens=n_decode, use_cache=False)
    first = None
    for _ in stream:
        first = first or time.perf_counter()
    end, r = time.perf_counter(), stream.result
    # Pieces can hold several tokens (an incomplete UTF-8 character waits): count tokens, time from the first piece.
    decode_s = end - first if first else 0.0
    print(json.dumps({"ttft_ms": r.ttft_ms, "prompt_tokens": r.prompt_tokens,
                      "decode_tps": (len(r.token_ids) - 1) / decode_s if decode_s > 0 else None,
                      "extra_buffers": pc.model.extra_buffers.enabled, "flash_attn": pc.flash_attn}))
"""


@contextmanager
def busy_cores(count: int):
    """Keeps `count` processes spinning for the duration."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def measure(model: str, threads: int, extra: str, n_prompt: int, n_decode: int, flash: str = "default") -> dict:
    env = {**os.environ, "PC_CPU_EXTRA_BUFFERS": extra}
    out = subprocess.run([sys.executable, "-c", CHILD, model, str(threads), str(n_prompt), str(n_decode), flash],
                         env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--what", choices=("extra-buffers", "threads", "both", "flash-attn"), default="both")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    settings = []  # (load, threads, extra buffers, flash attention)
    if args.what in ("extra-buffers", "both"):
        settings += [("idle", cores, "on", "default"), ("idle", cores, "off", "default")]
    if args.what in ("threads", "both"):
        # 0: pc_cpu's default (every core for batches, half of them for one-token decodes)
        settings += [(load, t, "auto", "default") for load in ("idle", "busy") for t in sorted({1, cores}) + [0]]
    if args.what == "flash-attn":  # "default": pc_cpu.engine.llama.context.default_flash_attn (off but on sliding windows)
        settings += [("idle", 0, "auto", "on"), ("idle", 0, "auto", "default")]
    results: dict[tuple, list[dict]] = {s: [] for s in settings}
    for _ in range(args.repeats):
        for s in settings:
            load, threads, extra, flash = s
            if load == "busy":
                with busy_cores(max(1, cores - 1)):
                    results[s].append(measure(args.model, threads, extra, args.prompt_tokens, args.decode_tokens, flash))
            else:
                results[s].append(measure(args.model, threads, extra, args.prompt_tokens, args.decode_tokens, flash))
    print(f"model {args.model}, {cores} cores, {args.prompt_tokens}-token full prefill, "
          f"{args.decode_tokens} decoded tokens, median of {args.repeats}")
    print("| load | threads | extra buffers | flash attention | TTFT (ms) | decode (tokens/s) |")
    print("|---|---|---|---|---|---|")
    for (load, threads, extra, flash), runs in results.items():
        ttft = statistics.median(r["ttft_ms"] for r in runs)
        tps = statistics.median(r["decode_tps"] for r in runs if r["decode_tps"])
        label = threads or f"default ({cores} batch, {max(1, cores // 2)} decode)"
        used = "on" if runs[0]["extra_buffers"] else "off"
        flash_used = "on" if runs[0]["flash_attn"] else "off"
        print(f"| {load} | {label} | {extra} ({used}) | {flash} ({flash_used}) | {ttft:.0f} | {tps:.1f} |")
    print(json.dumps({"/".join(map(str, k)): v for k, v in results.items()}))


if __name__ == "__main__":
    main()
