"""Documents: the RAG workload, the cost of adding one, TTFT as the library grows, relocation's speed and its cost to answers.

    pc-cpu bench documents rag --docs 500 --prompts 100 [--model NAME] [--threads 2] [--no-peers]
    pc-cpu bench documents relocation --n 200 [--model NAME] [--timing-only]

`rag`: the gold passages of `--docs` NaturalQuestions questions are added as documents
(about 9x the 8K context on SmolLM2). The time to add each is recorded (and compared with
a full prefill of the same tokens). At 50, 100, 250 and `--docs` documents, `--prompts`
questions are asked over 5 passages (the gold one and 4 others, in a random order):
TTFT cached and full prefill (same tokens, same run), the cost of computing only the
uncached tokens after the restored cells, accuracy, and the store's bytes.

`relocation`: speed of moving a 5-document prompt's cells three ways: the C library's one
pass (pc_state_assemble, what `ask` does), the C relocator then the splicer (the path before
it), and llama.cpp's seq_add on a private copy (a state_set per document, then the K-shift);
each ends with one state_set into the prompt's stream; as MB/s and TTFT; and answers, paired over `--n` questions: documents
moved, documents computed at the positions the prompt gives them, and the full prefill. It drives
the machinery by hand (Machinery: the contexts and document encoders a PromptCache builds, from the
same constructors), not a PromptCache.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass
import time

import numpy as np

from pc_cpu import PromptCache
from pc_cpu.allocator import map_large_blocks_apart
from pc_cpu.benchmarks.evaldata import load_nq
from pc_cpu.benchmarks.intervals import paired_difference
from pc_cpu.benchmarks.scoring import normalize_answer
from pc_cpu.engine.cells.relocate import apply_pending_shifts
from pc_cpu.engine.llama.context import ContextConfig, default_flash_attn
from pc_cpu.engine.llama.model import Model
from pc_cpu.engine.llama.sequences import SequenceRoles
from pc_cpu.engine.prompts.document_cells import DocumentEncoder
from pc_cpu.engine.prompts.document_prompt import DocumentWork
from pc_cpu.errors import DocumentError
from pc_cpu.kvstate import ops
from pc_cpu.memory import DEFAULT_PARALLEL
from pc_cpu.model_path import resolve_model_path
from pc_cpu.opening import cache_ropes, open_contexts, open_store
from pc_cpu.pml.document_layout import document_id, document_tokens, layout_documents, preamble_tokens, tail_tokens
from pc_cpu.pml.roles import markup_from_template

SYSTEM = "Answer the question from the documents, in a few words."


@dataclass(frozen=True)
class DocumentsBench:
    """What to run: `rag` uses docs, prompts and peers; `relocation` uses n and timing_only."""

    model: str | None = None
    threads: int = 2
    docs: int = 500
    prompts: int = 100
    n: int = 200
    timing_only: bool = False
    peers: bool = True
    recompute: tuple[str, ...] = ()  # rag: policies also asked at the full library (ask(recompute=...)), paired


def correct(text: str, answers) -> bool:
    norm = normalize_answer(text)
    return any(normalize_answer(a) in norm for a in answers)


def pct(values, q):
    return float(np.percentile(values, q))


def passage_text(p) -> str:
    return f"{p.title}: {p.text}"


def rag(job: DocumentsBench) -> dict:
    """Returns the RAG workload's measurements (module docstring); the library is stored in a temporary directory."""
    questions = load_nq()
    rng = random.Random(0)
    chosen = rng.sample(range(len(questions)), job.docs)
    with tempfile.TemporaryDirectory(prefix="pc_cpu_docs_") as store:  # ~23 KB per token on SmolLM2
        return _rag(job, questions, chosen, store)


def _rag(job: DocumentsBench, questions, chosen: list[int], store: str) -> dict:
    out: dict = {"model": job.model, "docs": job.docs, "prompts": job.prompts, "threads": job.threads}
    with PromptCache(job.model, threads=job.threads, store=store, ram_bytes=8 << 30) as pc:
        out["model"] = pc.model.path.name  # the file, also when job.model is None (the default)
        out["flash_attn"] = pc.flash_attn  # pc_cpu's default; the peers get the same
        preamble = preamble_tokens(SYSTEM, pc.model, pc.schemas.markup)
        pc.ask("warm up", documents=[], system=SYSTEM, max_tokens=1)
        ids, add_ms, add_tokens = [], [], []
        sizes = sorted({s for s in (50, 100, 250, job.docs) if s <= job.docs})
        by_size = {}
        for i, q in enumerate(chosen):
            text = passage_text(questions[q].gold)
            t0 = time.perf_counter()
            ids.append(pc.add_document(text, system=SYSTEM))
            add_ms.append((time.perf_counter() - t0) * 1000)
            add_tokens.append(len(document_tokens(text, pc.model)))
            if len(ids) in sizes:
                by_size[len(ids)] = run_prompts(pc, questions, chosen[:len(ids)], ids, job,
                                                full=len(ids) == job.docs)
                print(json.dumps({"library": len(ids), **{k: v for k, v in by_size[len(ids)].items()
                                                          if not isinstance(v, list)}}), file=sys.stderr, flush=True)
        # A prefill of one document's tokens after the preamble, to compare adding one with. The exact
        # prefixes the questions left to compute in the background must be done first: full_prefill
        # takes the prompt stream they would be using.
        pc.wait_idle()
        prefill_ms = []
        for q in chosen[-20:]:
            tokens = list(preamble) + list(document_tokens(passage_text(questions[q].gold), pc.model))
            t0 = time.perf_counter()
            pc.workbench.full_prefill(tokens).close()
            prefill_ms.append((time.perf_counter() - t0) * 1000)
        disk = next(t for t in pc.store.tiers if t.name == "disk")
        ram = next(t for t in pc.store.tiers if t.name == "ram")
        library_tokens = sum(add_tokens)
        out.update({
            "library_tokens": library_tokens, "n_ctx": pc.n_ctx,
            "add_ms_last20_median": statistics.median(add_ms[-20:]),
            "prefill_doc_ms_median": statistics.median(prefill_ms),
            "add_vs_prefill": statistics.median(add_ms[-20:]) / statistics.median(prefill_ms),
            "ram_bytes": ram.bytes_used, "disk_bytes": disk.bytes_used, "resident_cells": pc.schemas.resident_cells,
            "by_library_size": by_size,
        })
        model_path, n_ctx = str(pc.model.path), pc.n_ctx
    token_lists = by_size[job.docs].pop("token_lists")
    if job.peers:
        out["peers"] = llama_peers(model_path, n_ctx, job.threads, token_lists, flash_attn=out["flash_attn"])
    return out


def llama_peers(path: str, n_ctx: int, threads: int, token_lists: list[list[int]], *, flash_attn: bool) -> dict:
    """Returns TTFT p50/p95 of the same prompts through llama-cpp-python's Llama, plain and with LlamaRAMCache."""
    import llama_cpp

    from pc_cpu.engine.llama.extra_buffers import llama_peer  # loaded as pc_cpu loads models, for a like comparison

    result = {}
    for name in ("Llama", "Llama + LlamaRAMCache"):
        llm = llama_peer(path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, flash_attn=flash_attn,
                         verbose=False)
        if "RAMCache" in name:
            llm.set_cache(llama_cpp.LlamaRAMCache(capacity_bytes=8 << 30))
        llm.create_completion(prompt=token_lists[0], max_tokens=1)  # warm-up, untimed
        times = []
        for tokens in token_lists:
            t0 = time.perf_counter()
            llm.create_completion(prompt=tokens, max_tokens=1, temperature=0.0)
            times.append((time.perf_counter() - t0) * 1000)
        llm.close()
        result[name] = {"p50_ms": pct(times, 50), "p95_ms": pct(times, 95)}
    return result


def run_prompts(pc, questions, library, ids, job: DocumentsBench, *, full: bool) -> dict:
    rng = random.Random(len(library))
    n = job.prompts if full else min(job.prompts, 20)
    cached_ms, baseline_ms, tail_ms, hits_c, hits_b, same, token_lists = [], [], [], 0, 0, 0, []
    by_policy: dict[str, list[tuple[float, bool, bool, int]]] = {}
    correct_full: list[bool] = []
    for k in range(n):
        gold = rng.randrange(len(library))
        others = rng.sample([i for i in range(len(library)) if i != gold], 4)
        order = others + [gold]
        rng.shuffle(order)
        q = questions[library[gold]]
        docs = [ids[i] for i in order]
        cached = pc.ask(q.question, documents=docs, system=SYSTEM, max_tokens=24)
        cached_ms.append(cached.ttft_ms)
        if full:
            baseline = pc.ask(q.question, documents=docs, system=SYSTEM, max_tokens=24, use_cache=False)
            baseline_ms.append(baseline.ttft_ms)
            hits_c += correct(cached.text, q.answers)
            hits_b += correct(baseline.text, q.answers)
            correct_full.append(correct(baseline.text, q.answers))
            same += cached.token_ids == baseline.token_ids
            for policy in job.recompute:
                redone = pc.ask(q.question, documents=docs, system=SYSTEM, max_tokens=24, recompute=policy)
                by_policy.setdefault(policy, []).append(
                    (redone.ttft_ms, correct(redone.text, q.answers), redone.token_ids == baseline.token_ids,
                     redone.uncached_tokens))
            tail_ms.append(uncached_only_ms(pc, q.question, docs))
            texts = [pc.documents.library.get(d).text for d in docs]
            token_lists.append(list(pc.documents.prompt(q.question, texts, system=SYSTEM).tokens))
    result = {"cached_p50_ms": pct(cached_ms, 50), "cached_p95_ms": pct(cached_ms, 95), "n": n}
    if full:
        result.update({
            "baseline_p50_ms": pct(baseline_ms, 50), "baseline_p95_ms": pct(baseline_ms, 95),
            "speedup_p50": pct(baseline_ms, 50) / pct(cached_ms, 50),
            "uncached_only_p50_ms": pct(tail_ms, 50), "cached_vs_uncached_only": pct(cached_ms, 50) / pct(tail_ms, 50),
            "accuracy_cached": hits_c / n, "accuracy_full": hits_b / n, "identical_answers": same / n,
            "token_lists": token_lists,
            "recompute": {policy: {"p50_ms": pct([r[0] for r in rows], 50),
                                   "speedup_p50": pct(baseline_ms, 50) / pct([r[0] for r in rows], 50),
                                   "accuracy": sum(r[1] for r in rows) / n, "identical_answers": sum(r[2] for r in rows) / n,
                                   "computed_tokens_mean": statistics.mean(r[3] for r in rows),
                                   "vs_full_prefill": asdict(paired_difference([r[1] for r in rows],
                                                                               correct_full))}
                          for policy, rows in by_policy.items()},
        })
    return result


def uncached_only_ms(pc, question, docs) -> float:
    """Returns the TTFT of the question once its documents' cells are in place: only its own tokens are computed.

    Asked twice over the documents encoded apart (prefix "off"): the second finds the stream the first
    one's slot kept, holding the preamble and the moved documents, and computes the question alone.
    """
    pc.wait_idle()  # the exact prefixes the questions left to compute first: they would take a slot
    options = {"documents": docs, "system": SYSTEM, "max_tokens": 1, "prefix": "off"}
    pc.ask(question, **options)
    again = pc.ask(question, **options)
    if set(again.tiers.values()) != {"context"}:
        raise RuntimeError(f"the question was not answered from the stream the one before kept: {again.tiers}")
    return again.ttft_ms


# --- relocation ------------------------------------------------------------------------------------

class Machinery:
    """What the relocation bench drives by hand: a PromptCache's model, contexts and document encoders, no façade.

    Built from the constructors PromptCache wires (pc_cpu/cache.py, pc_cpu.opening), with its defaults:
    the library context (n_ctx: the training context, at most 8192), the prompt context (a stream per
    slot, the workspace, the adder's), a RAM tier only, the document encoder questions are assembled
    with (the workspace) and the one documents are added with (the adder's stream).
    """

    def __init__(self, model: str | None, *, threads: int, ram_bytes: int, n_seq_max: int = 64):
        map_large_blocks_apart()  # freed blobs of cells go back to the OS, as in a PromptCache (pc_cpu.allocator)
        self.roles = SequenceRoles.for_contexts(DEFAULT_PARALLEL, n_seq_max)
        self.model, self.ctx, self.prompts = open_contexts(
            Model(resolve_model_path(model)), self.roles,
            lambda m: ContextConfig(n_ctx=min(m.info.n_ctx_train or 8192, 8192), n_seq_max=n_seq_max,
                                    threads=threads, flash_attn=default_flash_attn(m.info)))
        self.markup = markup_from_template(self.model.chat_template(), bos_token=self.model.bos_text(),
                                           eos_token=self.model.eos_text())
        self.store = open_store(False, ram_bytes=ram_bytes, disk_bytes=0)
        self.ropes = cache_ropes(self.model)
        self.encoder = DocumentEncoder(self.prompts, self.roles.workspace, self.store, self.ropes)
        self.adder = DocumentEncoder(self.prompts, self.roles.adder, self.store, self.ropes)
        self.texts: dict[str, str] = {}

    def add(self, text: str, *, system: str | None) -> str:
        """Returns the document's id after computing its cells after the system message in the adder's stream (add_document)."""
        doc_id = document_id(text)
        self.adder.document_blob(preamble_tokens(system, self.model, self.markup), doc_id,
                                 document_tokens(text, self.model))
        self.texts[doc_id] = text
        return doc_id

    def prompt(self, question: str, docs: list[str], *, system: str | None):
        """Returns the layout of `question` over documents `add` encoded, each after the system message alone."""
        return layout_documents(preamble_tokens(system, self.model, self.markup),
                                [(d, document_tokens(self.texts[d], self.model)) for d in docs],
                                tail_tokens(question, self.model, self.markup))

    def close(self) -> None:
        self.prompts.close()
        self.ctx.close()
        self.model.close()

    def __enter__(self) -> "Machinery":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def relocation(job: DocumentsBench) -> dict:
    """Returns the relocation speed of both paths and, unless timing_only, the paired answers (module docstring)."""
    questions = load_nq()
    rng = random.Random(1)
    picks = rng.sample(range(len(questions)), job.n + 4)
    out: dict = {"model": job.model, "n": job.n, "threads": job.threads}
    with Machinery(job.model, threads=job.threads, ram_bytes=8 << 30) as pc:
        out["model"] = pc.model.path.name
        if pc.ropes is None:
            raise DocumentError("the relocation bench compares the C relocator with llama.cpp's seq_add, and "
                                 "this model's cells are moved by seq_add only (a sliding window); use another model")
        ids = {q: pc.add(passage_text(questions[q].gold), system=SYSTEM) for q in picks}
        one_pass_ms, c_ms, seq_add_ms, mbytes = [], [], [], []
        moved_hits = placed_hits = full_hits = 0
        moved, placed, full = [], [], []
        moved_same_full = moved_same_placed = 0
        for k in range(job.n):
            if k and k % 20 == 0:
                print(f"{k}/{job.n}", file=sys.stderr, flush=True)
            gold = picks[k]
            others = rng.sample([q for q in picks if q != gold], 4)
            order = others + [gold]
            rng.shuffle(order)
            q = questions[gold]
            prompt = pc.prompt(q.question, [ids[i] for i in order], system=SYSTEM)
            work = DocumentWork(prompt, pc.encoder, True)
            work.prepare()
            pieces = work.pieces
            # One pass, as `ask` assembles (into the encoder's reused buffer).
            t0 = time.perf_counter()
            pc.prompts.state_set(0, pc.encoder.assembled(pieces))
            one_pass_ms.append((time.perf_counter() - t0) * 1000)
            pc.prompts.seq_rm(0)
            # Two passes: relocate, then join (restore_blob), then one state_set.
            t0 = time.perf_counter()
            relocated = [p.blob if p.delta == 0 else ops.relocate(p.blob, p.delta, pc.ropes) for p in pieces]
            pc.prompts.state_set(0, ops.restore_blob(relocated, pc.prompts.n_stream))
            c_ms.append((time.perf_counter() - t0) * 1000)
            mbytes.append(sum(len(p.blob) for p in pieces) / 1e6)
            if job.timing_only:
                pc.prompts.seq_rm(0)
            else:
                moved_answer = greedy(pc, prompt)
            # seq_add path: each document restored into the library's scratch, moved by llama.cpp, shared
            # into staging; the K-shift applied; the staging cells read out in order into the stream.
            t0 = time.perf_counter()
            seq_add_assemble(pc, pieces)
            seq_add_ms.append((time.perf_counter() - t0) * 1000)
            pc.prompts.seq_rm(0)
            if job.timing_only:
                continue
            placed_answer = greedy(pc, prompt, blobs=placed_blobs(pc, prompt))
            # The full prefill, as `ask(use_cache=False)` computes it (DocumentWork's baseline), answered greedily.
            DocumentWork(prompt, pc.encoder, False).prefill(0)
            full_answer = greedy(pc, prompt, prefilled=True)
            moved.append(correct(pc.model.detokenize(moved_answer), q.answers))
            placed.append(correct(pc.model.detokenize(placed_answer), q.answers))
            full.append(correct(pc.model.detokenize(full_answer), q.answers))
            moved_hits, placed_hits, full_hits = sum(moved), sum(placed), sum(full)
            moved_same_full += moved_answer == full_answer
            moved_same_placed += moved_answer == placed_answer
        n = job.n
        out.update({"one_pass_ms_median": statistics.median(one_pass_ms),
            "one_pass_MB_per_s": statistics.median(m / (t / 1000) for m, t in zip(mbytes, one_pass_ms)),
            "c_path_ms_median": statistics.median(c_ms), "seq_add_path_ms_median": statistics.median(seq_add_ms),
            "c_path_MB_per_s": statistics.median(m / (t / 1000) for m, t in zip(mbytes, c_ms)),
            "seq_add_MB_per_s": statistics.median(m / (t / 1000) for m, t in zip(mbytes, seq_add_ms)),
            "prompt_MB_median": statistics.median(mbytes)})
        if not job.timing_only:
            out.update({"accuracy_moved": moved_hits / n, "accuracy_at_position": placed_hits / n,
                        "accuracy_full": full_hits / n, "moved_equals_at_position": moved_same_placed / n,
                        "moved_equals_full": moved_same_full / n, "paired": paired(moved, placed, full)})
    return out


def paired(moved, placed, full) -> dict:
    """Returns the paired accuracy differences (points) with their 95% bootstrap intervals."""
    out = {}
    for name, (a, b) in {"moved_minus_at_position": (moved, placed), "moved_minus_full": (moved, full),
                         "at_position_minus_full": (placed, full)}.items():
        interval = paired_difference([float(x) for x in a], [float(x) for x in b])
        out[name] = {"points": 100 * interval.estimate, "low": 100 * interval.low, "high": 100 * interval.high}
    return out


def seq_add_assemble(pc, pieces) -> None:
    """Builds prompt stream 0 from the pieces with llama.cpp's seq_add on private copies in the library."""
    ctx, scratch, staging = pc.ctx, pc.roles.scratch, 0
    ctx.seq_rm(staging)
    for piece in pieces:
        info = ops.scan(piece.blob)
        ctx.state_set(scratch, piece.blob)
        if piece.delta:
            ctx.seq_add(scratch, info.pos_min, info.pos_max + 1, piece.delta)
        ctx.seq_cp(scratch, staging, info.pos_min + piece.delta, info.pos_max + 1 + piece.delta)
        ctx.seq_rm(scratch)
    apply_pending_shifts(ctx, scratch)
    blob = ctx.state_get(staging)
    ctx.seq_rm(staging)
    restore = ops.restream(blob, pc.prompts.n_stream)
    ops.order_in_place(restore)
    pc.prompts.state_set(0, restore)


def placed_blobs(pc, prompt) -> list[bytes]:
    """Returns the preamble's cells and each document computed after the preamble at the position the prompt gives it."""
    work, seq = pc.prompts, pc.roles.adder  # the stream add_document computes in: free while nothing is added
    preamble, _ = pc.encoder.preamble_blob(prompt.preamble)
    blobs = [preamble]
    for doc in prompt.documents:
        first = doc.start - prompt.home
        work.seq_rm(seq)
        work.decode(prompt.preamble, range(first, doc.start), seq, logits_last=False)
        work.decode(doc.tokens, range(doc.start, doc.end), seq, logits_last=False)
        work.seq_rm(seq, first, doc.start)
        blobs.append(bytes(ops.restream(work.state_get(seq), 1)))
        work.seq_rm(seq)
    return blobs


def greedy(pc, prompt, *, blobs=None, prefilled: bool = False, max_tokens: int = 24) -> list[int]:
    """Returns greedy tokens after the prompt's cells in stream 0 (restored from `blobs` when given), tail computed.

    `prefilled`: stream 0 holds the whole prompt, its tail computed already (its last logits ready).
    """
    work = pc.prompts
    if blobs is not None:
        work.state_set(0, ops.restore_blob(blobs, work.n_stream))
    if not prefilled:
        work.decode(prompt.tail, range(prompt.tail_start, prompt.end), 0)
    tokens, pos = [], prompt.end
    for _ in range(max_tokens):
        token = int(np.argmax(work.logits()))
        if pc.model.is_end_of_generation(token):
            break
        tokens.append(token)
        work.decode([token], [pos], 0)
        pos += 1
    work.seq_rm(0)
    return tokens


# --- report ----------------------------------------------------------------------------------------

def markdown(what: str, result: dict) -> str:
    """Returns a result of `rag` or `relocation` as a Markdown table (the JSON has every field)."""
    rows = _rag_rows(result) if what == "rag" else _relocation_rows(result)
    return "\n".join(["| measure | value |", "|---|---|", *(f"| {name} | {value} |" for name, value in rows)])


def _rag_rows(r: dict) -> list[tuple[str, str]]:
    full = r["by_library_size"][r["docs"]]
    rows = [
        ("library", f"{r['docs']} documents, {r['library_tokens']:,} tokens ({r['library_tokens'] / r['n_ctx']:.1f}x "
                    f"the {r['n_ctx']}-cell context)"),
        ("TTFT p50 / p95, cached", f"{full['cached_p50_ms']:.0f} / {full['cached_p95_ms']:.0f} ms"),
        ("TTFT p50 / p95, full prefill (same tokens)", f"{full['baseline_p50_ms']:.0f} / {full['baseline_p95_ms']:.0f} ms"),
        ("speedup at p50", f"{full['speedup_p50']:.1f}x"),
        ("cached / computing only the uncached tokens", f"{full['cached_p50_ms']:.0f} / {full['uncached_only_p50_ms']:.0f} ms "
                                                         f"= {full['cached_vs_uncached_only']:.2f}"),
        ("TTFT p50 as the library grows", ", ".join(f"{size}: {v['cached_p50_ms']:.0f} ms"
                                                    for size, v in sorted(r["by_library_size"].items()))),
        ("adding one document / prefill of its tokens", f"{r['add_ms_last20_median']:.0f} / {r['prefill_doc_ms_median']:.0f} ms "
                                                         f"= {r['add_vs_prefill']:.2f}"),
        ("resident context cells", str(r["resident_cells"])),
        ("RAM / disk bytes", f"{r['ram_bytes'] / 1e9:.2f} GB / {r['disk_bytes'] / 1e9:.2f} GB"),
        ("accuracy cached / full prefill", f"{full['accuracy_cached']:.0%} / {full['accuracy_full']:.0%} (n = {full['n']})"),
        ("answers token-identical to the full prefill", f"{full['identical_answers']:.0%}"),
    ]
    for policy, got in full.get("recompute", {}).items():
        d = got["vs_full_prefill"]
        rows.append((f"recompute {policy}: accuracy, vs full prefill, TTFT p50 (speedup), tokens computed",
                     f"{got['accuracy']:.0%}, {d['estimate'] * 100:+.1f} pts [{d['low'] * 100:+.1f}, "
                     f"{d['high'] * 100:+.1f}], {got['p50_ms']:.0f} ms ({got['speedup_p50']:.1f}x), "
                     f"{got['computed_tokens_mean']:.0f}"))
    for name, peer in r.get("peers", {}).items():
        rows.append((f"{name}, TTFT p50 / p95", f"{peer['p50_ms']:.0f} / {peer['p95_ms']:.0f} ms"))
    return rows


def _relocation_rows(r: dict) -> list[tuple[str, str]]:
    rows = [
        ("C one pass (pc_state_assemble), one state_set", f"{r['one_pass_ms_median']:.1f} ms "
                                                           f"({r['one_pass_MB_per_s']:.0f} MB/s)"),
        ("C relocator, then splicer, one state_set", f"{r['c_path_ms_median']:.1f} ms ({r['c_path_MB_per_s']:.0f} MB/s)"),
        ("llama.cpp seq_add on private copies", f"{r['seq_add_path_ms_median']:.1f} ms ({r['seq_add_MB_per_s']:.0f} MB/s)"),
        ("prompt cells (median)", f"{r['prompt_MB_median']:.1f} MB"),
    ]
    for name, d in r.get("paired", {}).items():
        rows.append((name.replace("_", " "), f"{d['points']:+.1f} points [{d['low']:+.1f}, {d['high']:+.1f}] (n = {r['n']})"))
    return rows
