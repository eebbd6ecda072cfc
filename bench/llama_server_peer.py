"""pc_cpu against llama.cpp's own server (`llama-server`, with its cache on), on the same model, threads, context and slots.

The peer (issue 56; pc_cpu.benchmarks.llama_server): `llama-server` built from the llama.cpp that
llama-cpp-python 0.3.36's sdist vendors (the same commit as pc_cpu's) into $PC_CPU_LLAMA_SERVER_DIR
(default ~/.cache/pc_cpu/llama-server; built once, on first use, downloading the sdist, ~20 min on
2 cores; or give a binary with --llama-server PATH), run with its cache on (`cache_prompt`,
`--cache-reuse 256`, `--cache-ram 8192`), `--no-repack` when pc_cpu's CPU check turned extra
buffers off, flash attention as pc_cpu's default for the model. Slots: `--parallel S`,
`-c S * n_ctx`, so each slot has pc_cpu's n_ctx cells, as each of pc_cpu's S prompt slots has.
`pc-cpu bench peers --llama-server PATH` runs the same peer on that command's two workloads.

Workloads (each system runs its own conversation on the same questions, greedy, answers of at most
--answer-tokens; llama-server gets pc_cpu's chat template's tokens for its own messages, through
/completion, so both see the same template):
- "one conversation": --turns turns, idle between turns (a user reading);
- "8 conversations over 4 slots": turns round-robin (each conversation's turn 1, then each one's
  turn 2, ...), requests one at a time;
- "one document, 10 questions": a ~4K-token document (NQ-open gold paragraphs, read in place from
  $PC_CPU_EVALDATA, default ../shared/evaldata) as a system message, then each question in a
  conversation of its own (PromptCache.ask over the document on pc_cpu; its tokens to llama-server);
- "RAG, new combinations": a library of --library NQ-open gold passages (added once, untimed, as
  PromptCache.add_document; llama-server has no library), then --rag-questions questions, each over
  its gold passage and 4 others drawn at random, in a random order (a new combination each time);
  both get the same tokens (pc_cpu's `ask` layout). Accuracy: an NQ answer in the reply (as `pc-cpu
  bench documents` scores it), pc_cpu's and llama-server's; llama-server's answers are compared
  with its own full prefill of the same tokens (`cache_prompt` false), counting those that differ;
- "agent loop" and "8 agents over 4 slots": bench/agent_loop.py's agent (a ~3,500-token system
  message with 12 tools), 8 steps each adding a scripted call and the tool's result, a one-token
  answer per step (its TTFT), one agent, then 8 agents round-robin.
With --llama, llama-cpp-python's `Llama` (one context of n_ctx, its in-context prefix reuse, the same
token ids, streamed) answers every workload but the 8 agents (each would recompute its ~4K-token
history at every step: ~25 min here).
TTFT: pc_cpu's Result.ttft_ms (in-process); llama-server's, the wall time from sending the request
to its first streamed token (loopback HTTP adds ~1 ms); Llama's, to its first streamed chunk. Reported p50/p99 per workload, turns after
each conversation's first.

    python bench/llama_server_peer.py [--model qwen2.5-coder-0.5b] [--threads 2] [--turns 12] [--llama]
        [--workloads conversation,interleaved,document,agents,rag] [--agents 1,8]
        [--llama-server PATH] [--out bench/results/llama_server_peer.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from pc_cpu import PromptCache
from pc_cpu.benchmarks.llama_server import LlamaServer, build_llama_server

sys.path.insert(0, str(Path(__file__).parent))
from report_file import new_report, write_report  # noqa: E402  (bench scripts share these helpers)
from several_servers import manual  # noqa: E402  (the same ~4K-token document of NQ passages)
from agent_loop import TOOLS  # noqa: E402  (the agent's 12 tools)

REPO = Path(__file__).resolve().parent.parent
SYSTEM = "You are a helpful assistant. Answer in one sentence."
QUESTIONS = ["Name a large city by the sea.", "What is it known for?", "Name another one.", "Which of the two is older?",
             "What do people eat there?", "And in the first one?", "Which has the larger port?", "Name a river in one.",
             "How long is it?", "What crosses it?", "Summarise what you said.", "Thank you. One last fact?"]
DOCUMENT = "one document, 10 questions"
TOPICS = ["rivers", "mountains", "deserts", "islands", "forests", "lakes", "volcanoes", "glaciers"]
DOC_QUESTIONS = ["What is the first topic of the notes?", "Which year appears first?", "Name one person mentioned.",
                 "Name one place mentioned.", "What is the last topic?", "Which number is largest?",
                 "What is said about music?", "What is said about sport?", "Name a country in the notes.",
                 "Which title comes second?"]


# --- llama-cpp-python's Llama, the third system (--llama) -----------------------------------------

class LlamaPeer:
    """llama-cpp-python's `Llama` (loaded as pc_cpu loads models) with LlamaServer's `complete`: one context, its prefix reuse."""

    def __init__(self, model: Path, *, threads: int, n_ctx: int, flash_attn: bool):
        from pc_cpu.engine.llama.extra_buffers import llama_peer

        self.llm = llama_peer(model, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, flash_attn=flash_attn,
                              verbose=False)

    def __enter__(self) -> "LlamaPeer":
        return self

    def __exit__(self, *exc) -> None:
        self.llm.close()

    def complete(self, tokens: list[int], n_predict: int) -> dict:
        """Returns {ttft_ms, text, cached} of one greedy completion of `tokens`, streamed (cached: the prefix it kept)."""
        from pc_cpu.pml.chat import common_prefix

        cached = common_prefix(list(self.llm._input_ids[:self.llm.n_tokens]), tokens)
        started, ttft, text = time.perf_counter(), None, []
        for chunk in self.llm.create_completion(prompt=tokens, max_tokens=n_predict, temperature=0.0, top_k=1,
                                                stream=True):
            if ttft is None:
                ttft = (time.perf_counter() - started) * 1000
            text.append(chunk["choices"][0]["text"])
        return {"ttft_ms": ttft, "text": "".join(text), "cached": cached}


# --- workloads ----------------------------------------------------------------------------------

def conversations(n: int, turns: int) -> list[list[str]]:
    """Returns n conversations' questions: the first the plain QUESTIONS, the others about a topic each."""
    return [QUESTIONS[:turns] if i == 0 else
            [f"Tell me about {TOPICS[i % len(TOPICS)]}." if t == 0 else q for t, q in enumerate(QUESTIONS[:turns])]
            for i in range(n)]


def run_chats(ask, plan: list[tuple[int, int]], questions: list[list[str]]) -> list[dict]:
    """Returns each (conversation, turn) of `plan` answered by `ask(messages) -> (ttft_ms, text, cached)`, in order."""
    histories = [[{"role": "system", "content": SYSTEM}] for _ in questions]
    rows = []
    for conv, turn in plan:
        messages = histories[conv]
        messages.append({"role": "user", "content": questions[conv][turn]})
        ttft, text, cached = ask(messages)
        messages.append({"role": "assistant", "content": text})
        rows.append({"conversation": conv, "turn": turn + 1, "ttft_ms": round(ttft, 1), "cached": cached,
                     "answer": text})
    return rows


def round_robin(n: int, turns: int) -> list[tuple[int, int]]:
    return [(conv, turn) for turn in range(turns) for conv in range(n)]


def run_agents(step_ttft, agents: int, steps: int, system: str) -> list[dict]:
    """Returns each (agent, step) of agents taking steps round-robin, answered by `step_ttft(messages) -> (ms, cached)`."""
    from agent_loop import Agent

    crew = [Agent(system, i, steps) for i in range(agents)]
    rows = []
    for step in range(steps):
        for agent in crew:
            ttft, cached = step_ttft(agent.messages)
            rows.append({"conversation": agent.index, "turn": step + 1, "ttft_ms": round(ttft, 1), "cached": cached})
            agent.advance(step)
    return rows


def summary(rows: list[dict]) -> dict:
    later = sorted(r["ttft_ms"] for r in rows if r["turn"] > 1) or sorted(r["ttft_ms"] for r in rows)
    p99 = later[min(len(later) - 1, round(0.99 * (len(later) - 1)))]
    return {"p50_ms": round(statistics.median(later), 1), "p99_ms": round(p99, 1), "n": len(later)}


def run(args) -> dict:
    from pc_cpu.engine.llama.extra_buffers import decide

    binary = Path(args.llama_server) if args.llama_server else build_llama_server()
    options = dict(threads=args.threads, n_ctx=args.n_ctx, parallel=4, store=False, remote_store=False)
    out: dict = {"threads": args.threads, "n_ctx_per_slot": args.n_ctx, "slots": 4, "workloads": {}}
    # The cache stays open while llama-server runs (idle: its tokenizer makes llama-server's prompts).
    with PromptCache(args.model, **options) as pc:
        out["model"], model_path, flash_attn = pc.model.path.name, pc.model.path, pc.flash_attn
        template = lambda messages: list(pc.conversations.prompt(messages).tokens)  # noqa: E731
        workloads = _workloads(args, pc)
        results = {}
        for name, (plan, questions, pc_ask, _) in workloads.items():
            pc.chat([{"role": "user", "content": "Hello"}], max_tokens=1)  # warm-up, untimed
            results[name] = {"pc_cpu": run_chats(pc_ask, plan, questions)}
            print(json.dumps({name: summary(results[name]["pc_cpu"])}), file=sys.stderr, flush=True)
        agents = _agent_workloads(args, pc)
        for name, (count, system) in agents.items():
            def pc_step(messages):
                result = pc.chat(messages, tools=TOOLS, max_tokens=1)
                pc.wait_idle()  # the tool runs
                return result.ttft_ms, result.cached_tokens

            results[name] = {"pc_cpu": run_agents(pc_step, count, args.steps, system)}
            print(json.dumps({name: summary(results[name]["pc_cpu"])}), file=sys.stderr, flush=True)
        pc.evict()
        decision = decide()
        out["llama_server"] = {"binary": str(binary), "args": None, "no_repack": not decision.enabled}
        if "rag" in args.workloads:
            out["workloads"]["RAG, new combinations"] = rag(args, pc, binary, flash_attn, not decision.enabled)
            print(json.dumps(out["workloads"]["RAG, new combinations"]["summary"]), file=sys.stderr, flush=True)
        for name, (plan, questions, _, tokens_of) in workloads.items():
            with LlamaServer(binary, model_path, threads=args.threads, n_ctx=args.n_ctx, slots=4,
                             flash_attn=flash_attn, no_repack=not decision.enabled) as server:
                out["llama_server"]["args"] = server.args[1:]
                server.complete(template([{"role": "user", "content": "Hello"}]), 1)  # warm-up, untimed
                if name == DOCUMENT:  # its cells computed once, untimed, as add_document computed pc_cpu's
                    server.complete(tokens_of([{"role": "user", "content": "Hello"}]), 1)

                def ask(messages, server=server, tokens_of=tokens_of):
                    done = server.complete(tokens_of(messages), args.answer_tokens)
                    return done["ttft_ms"], done["text"], done["cached"]

                results[name]["llama-server"] = run_chats(ask, plan, questions)
            print(json.dumps({name: summary(results[name]["llama-server"])}), file=sys.stderr, flush=True)
        if args.llama:
            for name, (plan, questions, _, tokens_of) in workloads.items():
                with LlamaPeer(model_path, threads=args.threads, n_ctx=args.n_ctx, flash_attn=flash_attn) as peer:
                    peer.complete(template([{"role": "user", "content": "Hello"}]), 1)  # warm-up, untimed

                    def llama_ask(messages, peer=peer, tokens_of=tokens_of):
                        done = peer.complete(tokens_of(messages), args.answer_tokens)
                        return done["ttft_ms"], done["text"], done["cached"]

                    results[name]["Llama"] = run_chats(llama_ask, plan, questions)
                print(json.dumps({name: {"Llama": summary(results[name]["Llama"])}}), file=sys.stderr, flush=True)
            for name, (count, system) in agents.items():
                if count > 1:
                    continue  # one context: 8 agents each recompute their history at every step (~25 min here)
                with LlamaPeer(model_path, threads=args.threads, n_ctx=args.n_ctx, flash_attn=flash_attn) as peer:
                    def llama_step(messages, peer=peer):
                        done = peer.complete(list(pc.conversations.prompt(messages, tools=TOOLS).tokens), 1)
                        return done["ttft_ms"], done["cached"]

                    results[name]["Llama"] = run_agents(llama_step, count, args.steps, system)
                print(json.dumps({name: {"Llama": summary(results[name]["Llama"])}}), file=sys.stderr, flush=True)
        for name, (count, system) in agents.items():
            with LlamaServer(binary, model_path, threads=args.threads, n_ctx=args.n_ctx, slots=4,
                             flash_attn=flash_attn, no_repack=not decision.enabled) as server:
                server.complete(template([{"role": "user", "content": "Hello"}]), 1)  # warm-up, untimed

                def server_step(messages, server=server):
                    done = server.complete(list(pc.conversations.prompt(messages, tools=TOOLS).tokens), 1)
                    return done["ttft_ms"], done["cached"]

                results[name]["llama-server"] = run_agents(server_step, count, args.steps, system)
            print(json.dumps({name: summary(results[name]["llama-server"])}), file=sys.stderr, flush=True)
    for name, by_system in results.items():
        table = {system: summary(rows) for system, rows in by_system.items()}
        for peer in ("llama-server", "Llama"):
            if peer in table:
                table[f"{peer} / pc_cpu p50"] = round(table[peer]["p50_ms"] / table["pc_cpu"]["p50_ms"], 2)
        out["workloads"][name] = {"summary": table, "rows": by_system}
    return out


def _workloads(args, pc: PromptCache) -> dict:
    """Returns, by name: (plan, questions, pc_cpu's ask, the tokens llama-server gets for a conversation's messages)."""
    template = lambda messages: list(pc.conversations.prompt(messages).tokens)  # noqa: E731

    def chat(messages):
        result = pc.chat(messages, max_tokens=args.answer_tokens)
        pc.wait_idle()  # idle between turns, as while a user reads: pc_cpu repairs and stores the answer
        return result.ttft_ms, result.text, result.cached_tokens

    chosen = {}
    if "conversation" in args.workloads:
        chosen["one conversation"] = (round_robin(1, args.turns), conversations(1, args.turns), chat, template)
    if "interleaved" in args.workloads:
        turns = min(args.turns, 6)
        chosen["8 conversations over 4 slots"] = (round_robin(8, turns), conversations(8, turns), chat, template)
    if "document" in args.workloads:
        text = manual(args.doc_tokens, lambda t: pc.model.tokenize(t, special=False))
        doc = pc.add_document(text, name="manual", system=SYSTEM)

        def ask_doc(messages):
            result = pc.ask(messages[-1]["content"], documents=[doc], system=SYSTEM, max_tokens=args.answer_tokens)
            pc.wait_idle()
            return result.ttft_ms, result.text, result.cached_tokens

        def doc_tokens(messages):
            return list(pc.documents.prompt(messages[-1]["content"], [text], system=SYSTEM).tokens)

        plan = [(i, 0) for i in range(len(DOC_QUESTIONS))]
        chosen[DOCUMENT] = (plan, [[q] for q in DOC_QUESTIONS], ask_doc, doc_tokens)
    return chosen


def rag(args, pc: PromptCache, binary: Path, flash_attn: bool, no_repack: bool) -> dict:
    """Returns the RAG workload's TTFTs and accuracies (module docstring) for pc_cpu and llama-server."""
    import random

    from pc_cpu.benchmarks.documents import SYSTEM as RAG_SYSTEM, correct, passage_text
    from pc_cpu.benchmarks.evaldata import load_nq

    questions = load_nq()
    rng = random.Random(0)
    library = rng.sample(range(len(questions)), args.library)
    ids = [pc.add_document(passage_text(questions[q].gold), system=RAG_SYSTEM) for q in library]
    prompts = []
    for _ in range(args.rag_questions):
        gold = rng.randrange(len(library))
        order = [gold] + rng.sample([i for i in range(len(library)) if i != gold], 4)
        rng.shuffle(order)
        prompts.append((questions[library[gold]], [ids[i] for i in order]))
    pc.ask("warm up", documents=[], system=RAG_SYSTEM, max_tokens=1)
    rows = {"pc_cpu": [], "llama-server": [], "llama-server full prefill": []}
    token_lists = []
    for q, docs in prompts:
        result = pc.ask(q.question, documents=docs, system=RAG_SYSTEM, max_tokens=args.answer_tokens)
        rows["pc_cpu"].append({"ttft_ms": result.ttft_ms, "correct": correct(result.text, q.answers),
                               "answer": result.text})
        texts = [pc.documents.library.get(d).text for d in docs]
        token_lists.append(list(pc.documents.prompt(q.question, texts, system=RAG_SYSTEM).tokens))
    pc.wait_idle()
    with LlamaServer(binary, pc.model.path, threads=args.threads, n_ctx=args.n_ctx, slots=4, flash_attn=flash_attn,
                     no_repack=no_repack) as server:
        server.complete(token_lists[0][:8], 1)  # warm-up, untimed
        for (q, _), tokens in zip(prompts, token_lists):
            done = server.complete(tokens, args.answer_tokens)
            rows["llama-server"].append({"ttft_ms": done["ttft_ms"], "correct": correct(done["text"], q.answers),
                                         "answer": done["text"], "cached": done["cached"]})
            full = server.complete(tokens, args.answer_tokens, cache_prompt=False)
            rows["llama-server full prefill"].append({"ttft_ms": full["ttft_ms"], "answer": full["text"],
                                                      "correct": correct(full["text"], q.answers)})
    if args.llama:
        rows["Llama"] = []
        with LlamaPeer(pc.model.path, threads=args.threads, n_ctx=args.n_ctx, flash_attn=flash_attn) as peer:
            peer.complete(token_lists[0][:8], 1)  # warm-up, untimed
            for (q, _), tokens in zip(prompts, token_lists):
                done = peer.complete(tokens, args.answer_tokens)
                rows["Llama"].append({"ttft_ms": done["ttft_ms"], "correct": correct(done["text"], q.answers),
                                      "answer": done["text"], "cached": done["cached"]})
    table = {name: {"p50_ms": round(statistics.median(r["ttft_ms"] for r in got), 1),
                    "p99_ms": round(sorted(r["ttft_ms"] for r in got)[min(len(got) - 1, round(0.99 * (len(got) - 1)))], 1),
                    "accuracy": round(sum(r["correct"] for r in got) / len(got), 3), "n": len(got)}
             for name, got in rows.items()}
    table["llama-server / pc_cpu p50"] = round(table["llama-server"]["p50_ms"] / table["pc_cpu"]["p50_ms"], 2)
    if "Llama" in table:
        table["Llama / pc_cpu p50"] = round(table["Llama"]["p50_ms"] / table["pc_cpu"]["p50_ms"], 2)
    table["llama-server answers differing from its full prefill"] = sum(
        a["answer"] != b["answer"] for a, b in zip(rows["llama-server"], rows["llama-server full prefill"]))
    return {"summary": table, "rows": rows, "library": args.library}


def _agent_workloads(args, pc: PromptCache) -> dict:
    """Returns, by name: (agents, system message) of the agent-loop workloads chosen."""
    if "agents" not in args.workloads:
        return {}
    from agent_loop import INSTRUCTIONS, reference_notes

    system = INSTRUCTIONS + "\n" + reference_notes(2000, lambda t: pc.model.tokenize(t, special=False))
    chosen = {"agent loop": (1, system), "8 agents over 4 slots": (8, system)}
    return {name: (count, text) for name, (count, text) in chosen.items() if str(count) in args.agents.split(",")}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--n-ctx", type=int, default=8192)
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--answer-tokens", type=int, default=24)
    parser.add_argument("--doc-tokens", type=int, default=4000)
    parser.add_argument("--workloads", default="conversation,interleaved,document,agents,rag")
    parser.add_argument("--steps", type=int, default=8, help="agent-loop steps")
    parser.add_argument("--agents", default="1,8", help="agent-loop workloads by agent count: 1, 8 or both")
    parser.add_argument("--library", type=int, default=200, help="RAG: passages in the library")
    parser.add_argument("--rag-questions", type=int, default=40)
    parser.add_argument("--llama-server", default=None, help="a llama-server binary (default: built once)")
    parser.add_argument("--llama", action="store_true",
                        help="also llama-cpp-python's Llama (one context, its prefix reuse); not on 8 agents")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "llama_server_peer.json")
    args = parser.parse_args(argv)
    report = new_report("llama_server_peer.py", argv)
    report["models"][args.model] = result = run(args)
    print(json.dumps({name: w["summary"] for name, w in result["workloads"].items()}, indent=1))
    write_report(report, args.out, [])


if __name__ == "__main__":
    main()
