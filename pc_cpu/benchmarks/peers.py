"""pc_cpu against llama-cpp-python's own prefix reuse and llama.cpp's own server, on the same tokens, model and threads.

NOTE: this is the one module outside pc_cpu/engine that imports llama_cpp, and only to run the peer
(`llama_cpp.Llama`, with and without `LlamaRAMCache`) exactly as a user of that library would.
With a `llama-server` binary (pc_cpu.benchmarks.llama_server), llama.cpp's own server joins them:
one slot of the same n_ctx, its cache on (`cache_prompt`, `--cache-reuse 256`, `--cache-ram`), the
same token ids through /completion, TTFT to its first streamed token.

Workloads (prompts answered in turn; the first warms every system up and is not timed):
- "shared prefix": every prompt imports all documents and asks a different question, so the documents
  are a common prefix (a peer's best case);
- "documents not a prefix": prompt i imports a sliding window of documents (i, i+1, i+2), so each prompt
  starts with a different document and prefix reuse finds only the system message.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from pc_cpu.benchmarks import workloads
from pc_cpu.benchmarks.timing import stats
from pc_cpu.errors import PromptCacheError
from pc_cpu.pml.chat import common_prefix
from pc_cpu.pml.text import escape_text

QUESTIONS = ("Who is mentioned first?", "Which year appears?", "Name one place.", "What is the topic?",
             "Who is mentioned last?", "Which number is largest?", "Name a person.", "What happened?")


def _schema_and_prompts(tokenize, doc_tokens: int, n_docs: int, count: int) -> tuple[str, dict[str, list[str]]]:
    texts = workloads.passages(200)
    per_doc = max(doc_tokens // n_docs, 32)
    docs = ["".join(workloads.fill(tokenize, texts[i * 7:], per_doc)) for i in range(n_docs)]
    body = "".join(f'<module name="d{i}">{escape_text(t)}</module>' for i, t in enumerate(docs))
    schema = f'<schema name="peer"><system>Answer from the documents.</system><user>{body}</user></schema>'
    everything = "".join(f"<d{i}/>" for i in range(n_docs))
    shared = [f'<prompt schema="peer">{everything}<user>{QUESTIONS[i % len(QUESTIONS)]}</user></prompt>'
              for i in range(count)]
    window = ['<prompt schema="peer">' + "".join(f"<d{(i + k) % n_docs}/>" for k in sorted(
        range(3), key=lambda k: (i + k) % n_docs)) + f'<user>{QUESTIONS[i % len(QUESTIONS)]}</user></prompt>'
        for i in range(count)]
    return schema, {"shared prefix": shared, "documents not a prefix": window}


def _llama_server_ttfts(binary: Path, model: Path, token_lists: dict[str, list[list[int]]], measured: dict, *,
                        threads: int, n_ctx: int, flash_attn: bool) -> list[str]:
    """Adds llama-server's TTFTs on every workload's prompts to `measured`; returns the server's arguments."""
    from pc_cpu.benchmarks.llama_server import LlamaServer
    from pc_cpu.engine.llama.extra_buffers import decide

    for name, lists in token_lists.items():
        # A fresh server per workload, as Llama is reset per workload: no cells carried between them.
        with LlamaServer(binary, model, threads=threads, n_ctx=n_ctx, slots=1, flash_attn=flash_attn,
                         no_repack=not decide().enabled) as server:
            server.complete(lists[0], 1)  # the warm-up prompt, untimed
            measured[name][LLAMA_SERVER] = [server.complete(t, 1)["ttft_ms"] for t in lists[1:]]
            args = server.args[1:]
    return args


def _llama_ttft(llm, tokens: list[int]) -> float:
    t0 = time.perf_counter()
    llm.create_completion(prompt=tokens, max_tokens=1, temperature=0.0)
    return (time.perf_counter() - t0) * 1000


LLAMA_SERVER = "llama-server (cache_prompt, --cache-reuse 256, --cache-ram)"


def run(model=None, threads: int = 2, *, doc_tokens: int = 1500, n_docs: int = 6, repeats: int = 5,
        llama_server: Path | None = None, progress: Callable[[int], None] | None = None) -> dict:
    """Returns TTFT stats per workload for pc_cpu (cached, baseline), the two llama-cpp-python peers and llama-server.

    llama_server: a llama-server binary; None leaves that peer out.
    """
    if llama_server is not None and not Path(llama_server).is_file():  # before minutes of measuring
        raise PromptCacheError(f"llama-server binary {str(llama_server)!r} is not a file: give the path of one "
                               "(python bench/llama_server_peer.py builds it from llama-cpp-python's sdist)")
    import llama_cpp  # see the module NOTE: the peer, used as its users do

    from pc_cpu.engine.llama.extra_buffers import llama_peer  # loaded as pc_cpu loads models, for a like comparison

    from pc_cpu import PromptCache
    from pc_cpu.model_path import resolve_model_path

    path = str(resolve_model_path(model))
    n_ctx = 4 * doc_tokens + 2048
    report = {"threads": threads, "doc_tokens": doc_tokens, "n_docs": n_docs, "repeats": repeats, "workloads": []}
    # The same flash attention for everyone, pc_cpu's default (default_flash_attn: off, but llama.cpp's
    # choice, on, for sliding-window models): on a CPU it changes a prefill's time and a decode's.
    with PromptCache(path, threads=threads, n_ctx=n_ctx, store=False) as pc:
        flash_attn = pc.flash_attn
        tokenize = lambda t: pc.model.tokenize(t, special=False)  # noqa: E731
        schema, sets = _schema_and_prompts(tokenize, doc_tokens, n_docs, repeats + 1)
        pc.load_schema(schema)
        token_lists = {name: [list(pc.plan(p).tokens) for p in prompts] for name, prompts in sets.items()}
        measured = {name: {"pc_cpu cached": [], "pc_cpu full prefill": []} for name in sets}
        for name, prompts in sets.items():
            pc.generate(prompts[0], max_tokens=1)
            for p in prompts[1:]:
                measured[name]["pc_cpu cached"].append(pc.generate(p, max_tokens=1).ttft_ms)
                measured[name]["pc_cpu full prefill"].append(pc.generate(p, max_tokens=1, use_cache=False).ttft_ms)
        report["model"] = pc.model.path.name  # not llama.cpp's description ("llama 256M Q4_1" for SmolLM2-135M)
    if progress:
        progress(1)
    for peer in ("llama_cpp.Llama (in-context prefix reuse)", "llama_cpp.Llama + LlamaRAMCache"):
        llm = llama_peer(path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, flash_attn=flash_attn,
                         verbose=False)
        try:
            if "RAMCache" in peer:
                llm.set_cache(llama_cpp.LlamaRAMCache(capacity_bytes=2 << 30))
            for name, lists in token_lists.items():
                llm.reset()
                _llama_ttft(llm, lists[0])
                measured[name][peer] = [_llama_ttft(llm, t) for t in lists[1:]]
        finally:
            llm.close()
        if progress:
            progress(1)
    if llama_server is not None:
        report["llama_server"] = _llama_server_ttfts(llama_server, Path(path), token_lists, measured, threads=threads,
                                                     n_ctx=n_ctx, flash_attn=flash_attn)
        if progress:
            progress(1)
    for name, systems in measured.items():
        lists = token_lists[name]
        row = {"workload": name, "prompt_tokens": round(sum(map(len, lists[1:])) / len(lists[1:])),
               # what a prefix cache can reuse: tokens each prompt shares with the one before it
               "prefix_with_previous": round(sum(common_prefix(a, b) for a, b in zip(lists, lists[1:]))
                                             / len(lists[1:]))}
        base = stats(systems["pc_cpu full prefill"]).p50
        row["systems"] = {s: {**stats(v).to_dict(), "speedup_vs_full_prefill": round(base / stats(v).p50, 1)}
                          for s, v in systems.items()}
        report["workloads"].append(row)
    return report
