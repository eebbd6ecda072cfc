"""Documents against the full prefill: paired accuracy and TTFT of `ask` variants.

    pc-cpu bench documents accuracy --model qwen2.5-coder-0.5b --policy 0 --policy relevant:1 \
        --order given --n 300 --split odd --out q05_odd.jsonl --results bench/RESULTS.md

Each item is a question over 5 documents in a random order (NQ: the gold passage and 4 other
questions' gold passages; KV retrieval: 5 key-value pairs, one per document). With `--per-document K`
each document holds K passages or pairs instead of one (5 NQ documents of 6 passages: a prompt of
~4K tokens; 5 KV documents of 6 pairs: 30 pairs), recorded as the task "nq 6/doc" or "kv 6/doc". Its documents are
added with `add_document`, then the question is asked through `PromptCache.ask`: once as the
baseline (`use_cache=False`, a full prefill of the same tokens) per order, and once per
(recompute policy, order) variant with the cache. Answers, correctness and `Result.ttft_ms` go to a
JSON-lines file, one record per answer, so a run can stop and resume (`--out` again) and be
summarized later (`--summary`).

A cached variant asks with `prefix="off"`: it measures the documents encoded apart, never an exact
prefix an earlier variant left in the store. The variant `exact` measures a question asked again
over the same documents in the same order: the item's question is asked once unrecorded with
`prefix="first"` (it computes and stores the exact prefix), then again, recorded, as a user would
(`prefix="background"`); that answer restores the exact prefix and computes only the question.

Tuning uses the even lines of the data files, reporting the odd ones: `--split`.

Between answers the resident cells are dropped (`PromptCache.evict`), so every cached answer
restores its documents from the RAM tier, as a question over documents not asked about a moment
ago does, and a variant never reuses the stream an earlier variant left behind.
"""

from __future__ import annotations

import json
import random
import statistics
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from pc_cpu.benchmarks.documents import SYSTEM as NQ_SYSTEM  # as `bench documents rag` asks
from pc_cpu.benchmarks.documents import correct, passage_text
from pc_cpu.benchmarks.evaldata import DocItem, KVItem, doc_items, kv_items, load_kv, load_nq
from pc_cpu.benchmarks.intervals import discordant, paired_difference
from pc_cpu.benchmarks.prompts import KV_SYSTEM
FULL = "full prefill"  # the policy field of a baseline record
EXACT = "exact"  # the policy field of a question asked again, answered from the exact prefix (module docstring)
EXACT_RAM = "exact-ram"  # the same, with the prefix's stream dropped in between: restored from the RAM tier
REPEATED = (EXACT, EXACT_RAM)  # variants that are not recompute policies
SPLITS = ("odd", "even", "all")
# "shuffled": every item's documents added first, in a seeded random order, so that a question's
# documents were encoded after other questions' (a new combination of a library); "item": each
# item's documents added just before it is asked, in its order, and removed after it.
LIBRARIES = ("shuffled", "item")
ANY = "-"  # the encoding field of variants that do not depend on it (the full prefill, exact prefixes)
TASKS = ("nq", "kv")
GOAL_PTS = 2.5  # the goal: within 2.5 points of the full prefill
GOAL_SPEEDUP = 10.0  # at >= 10x its TTFT
# The disk tier's budget: 300 NQ items' documents, each encoded twice, with their stand-in contexts,
# take ~6 GB on Qwen2.5-Coder-0.5B; what does not fit is computed again, not lost.
STORE_BYTES = 32 << 30


@dataclass(frozen=True)
class AccuracyJob:
    """One run: every model answers every item with the baseline and each (policy, order) variant."""

    models: tuple[str | None, ...] = (None,)
    policies: tuple[str, ...] = ("0",)
    orders: tuple[str, ...] = ("given",)
    task: str = "nq"
    split: str = "odd"
    n: int = 300
    docs: int = 5
    threads: int = 2
    max_tokens: int = 0  # 0: 24 for NQ, 128 for KV (the small models restate the key first)
    encodings: tuple[str, ...] = ("library",)  # ask(encoding=...) of the cached variants
    library: str = "shuffled"  # LIBRARIES: how the library holding the items' documents is built
    per_document: int = 1  # NQ passages or KV pairs per document
    block: int = 0  # "shuffled": items whose documents are shuffled and added together (0: all of them)
    # Where the documents' encodings are kept (None: a temporary directory). A later run over the same
    # items (the same blocks, so the same library order and stand-ins) restores them instead of computing.
    store: str | None = None

    @property
    def answer_tokens(self) -> int:
        return self.max_tokens or (128 if self.task == "kv" else 24)


@dataclass(frozen=True)
class Question:
    """One item as `ask` sees it: document texts in prompt order, the question, the accepted answers."""

    index: int  # the record's line in the data file (its parity is the split)
    system: str
    documents: tuple[str, ...]
    question: str
    answers: tuple[str, ...]
    gold_index: int


def questions(task: str, split: str, n: int, docs: int, per_document: int = 1) -> list[Question]:
    """Returns the first `n` items of the split, drawn deterministically (the same arguments, the same items).

    Each of the `docs` documents holds `per_document` passages (NQ) or pairs (KV), one per line;
    `gold_index` is the document holding the gold one.
    """
    if task not in TASKS or split not in SPLITS:
        raise ValueError(f"task {task!r} / split {split!r}: use one of {TASKS} / {SPLITS}")
    if per_document < 1:
        raise ValueError(f"per_document={per_document}: a document holds at least one passage or pair")
    keep = (lambda i: True) if split == "all" else (lambda i: i % 2 == (1 if split == "odd" else 0))
    if task == "kv":
        records = load_kv()
        items = kv_items(records, docs * per_document, len(records))
        return [_kv_question(it, per_document) for it in items if keep(it.index)][:n]
    nq = load_nq()
    return [_nq_question(it, per_document) for it in doc_items(nq, docs * per_document, len(nq), seed=0)
            if keep(it.index)][:n]


def _grouped(lines: list[str], per_document: int) -> tuple[str, ...]:
    return tuple("\n".join(lines[i:i + per_document]) for i in range(0, len(lines), per_document))


def _nq_question(item: DocItem, per_document: int = 1) -> Question:
    texts = _grouped([passage_text(p) for p in item.passages], per_document)
    return Question(item.index, NQ_SYSTEM, texts, item.question, item.answers, item.gold_index // per_document)


def _kv_question(item: KVItem, per_document: int = 1) -> Question:
    texts = _grouped([f'"{k}": "{v}"' for k, v in item.pairs], per_document)
    return Question(item.index, KV_SYSTEM, texts, f'Key: "{item.key}"\nCorresponding value:', (item.value,),
                    item.gold_index // per_document)


def task_label(record: dict) -> str:
    """Returns the task a record's row goes by: "nq", "kv", or e.g. "nq 6/doc" with several passages per document."""
    per_document = record.get("per_document", 1)
    return record["task"] if per_document == 1 else f"{record['task']} {per_document}/doc"


def read_records(path: Path) -> list[dict]:
    """Returns the records of a run's JSON-lines file ([] when it does not exist)."""
    if not path.exists():
        return []
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _done(records: list[dict]) -> set[tuple]:
    return {(r["model"], task_label(r), r["index"], r["order"], r["policy"], _encoding(r)) for r in records}


def _encoding(record: dict) -> str:
    """Returns a record's document encoding; "preamble" for records made before `encoding` existed."""
    return record.get("encoding", ANY if record["policy"] in (FULL, *REPEATED) else "preamble")


def variant(record: dict) -> str:
    """Returns the name a record's variant goes by in tables: its policy, and its encoding unless "library"."""
    encoding = _encoding(record)
    return record["policy"] if encoding in (ANY, "library") else f"{record['policy']}, {encoding}"


def run(job: AccuracyJob, out: Path, *, progress: Callable[[int], None] = lambda n: None) -> list[dict]:
    """Answers every item of `job` with every model and variant, appending records to `out`; returns all records.

    Records already in `out` (same model, item, order, policy and encoding) are not asked again.
    """
    from pc_cpu import PromptCache

    if job.library not in LIBRARIES:
        raise ValueError(f"library {job.library!r}: use one of {LIBRARIES}")
    items = questions(job.task, job.split, job.n, job.docs, job.per_document)
    records = read_records(out)
    done = _done(records)
    with out.open("a", encoding="utf-8") as sink:
        for model in job.models:
            with ExitStack() as stack:
                store = job.store or stack.enter_context(tempfile.TemporaryDirectory(prefix="pc_cpu_acc_"))
                pc = stack.enter_context(PromptCache(model, threads=job.threads, store=store, disk_bytes=STORE_BYTES))
                name = model or pc.model.path.name
                pc.ask("warm up", documents=[], system=items[0].system if items else None, max_tokens=1,
                       prefix="off")
                for number, block in enumerate(_blocks(items, job)):
                    if not any(_wanted(name, item, job, done) for item in block):
                        progress(len(block))  # answered by an earlier run: none of its documents is added
                        continue
                    library = _shuffled_library(pc, block, seed=number) if job.library == "shuffled" else None
                    for item in block:
                        for record in _answer(pc, name, item, job, done, library):
                            records.append(record)
                            sink.write(json.dumps(record) + "\n")
                            sink.flush()
                        progress(1)
    return records


def _blocks(items: list[Question], job: AccuracyJob) -> list[list[Question]]:
    """Returns the items in the groups whose documents are added together: `job.block` items each, or one group."""
    size = job.block if job.library == "shuffled" and job.block > 0 else max(1, len(items))
    return [items[start:start + size] for start in range(0, len(items), size)]


def _shuffled_library(pc, items: list[Question], *, seed: int = 0) -> dict[str, str]:
    """Returns the ids of every item's documents by text, after adding them all in a seeded random order.

    In blocks (AccuracyJob.block) the library grows block by block: a block's first documents are
    encoded after the last ones of the block before, as any document after the ones added before it.
    A resumed run adds only the blocks it has items left in, so it never pays again for the adds of
    answered items.
    """
    texts = list(dict.fromkeys((text, item.system) for item in items for text in item.documents))
    random.Random(seed).shuffle(texts)
    return {text: pc.add_document(text, system=system) for text, system in texts}


def _wanted(model: str, item: Question, job: AccuracyJob, done: set[tuple]) -> list[tuple[str, str, str]]:
    """Returns the (order, policy, encoding) answers of `item` that `done` does not hold yet."""
    task = task_label({"task": job.task, "per_document": job.per_document})
    return [(order, policy, encoding) for order in job.orders for policy in (FULL, *job.policies)
            for encoding in ((ANY,) if policy in (FULL, *REPEATED) else job.encodings)
            if (model, task, item.index, order, policy, encoding) not in done]


def _answer(pc, model: str, item: Question, job: AccuracyJob, done: set[tuple],
            library: dict[str, str] | None) -> Iterator[dict]:
    """Yields the records of one item not yet in `done`: a baseline per order, then each variant."""
    wanted = _wanted(model, item, job, done)
    if not wanted:
        return
    ids = ([library[text] for text in item.documents] if library is not None
           else [pc.add_document(text, system=item.system) for text in item.documents])
    try:
        for order, policy, encoding in wanted:
            pc.evict()  # restore from the RAM tier; never reuse the stream another variant left
            if policy in REPEATED:
                result = _asked_again(pc, item, ids, order, job.answer_tokens, from_ram=policy == EXACT_RAM)
            else:
                baseline = policy == FULL
                result = pc.ask(item.question, documents=ids, system=item.system, max_tokens=job.answer_tokens,
                                use_cache=not baseline, recompute=None if baseline else policy, order=order,
                                prefix="off", encoding="library" if baseline else encoding)
            yield {"model": model, "task": job.task, "index": item.index, "gold_index": item.gold_index,
                   "per_document": job.per_document, **({"block": job.block} if job.block else {}),
                   "order": order, "policy": policy, "encoding": encoding, "library": job.library,
                   "correct": correct(result.text, item.answers),
                   "text": result.text, "ttft_ms": result.ttft_ms, "uncached_tokens": result.uncached_tokens,
                   "prompt_tokens": result.prompt_tokens, "documents": result.modules}
    finally:
        if library is None:
            for doc_id in dict.fromkeys(ids):  # a library of one item at a time: the store stays small
                pc.remove_document(doc_id)


def _asked_again(pc, item: Question, ids: list[str], order: str, max_tokens: int, *, from_ram: bool = False):
    """Returns the Result of the item's question asked a second time: from the exact prefix the first left.

    The first asking, unrecorded, computes the exact prefix ("first"); its slot keeps it, so the
    second computes only the question, as a user asking again over the same documents does. The
    same question both times: "relevant-first" and "relevant-last" order the documents by it.
    """
    pc.ask(item.question, documents=ids, system=item.system, max_tokens=1, order=order, prefix="first")
    pc.wait_idle()
    if from_ram:
        pc.evict()  # the held stream goes: the prefix comes back from the RAM tier
    return pc.ask(item.question, documents=ids, system=item.system, max_tokens=max_tokens, order=order,
                  prefix="background")


@dataclass(frozen=True)
class Row:
    """One variant of one model against its full prefill, over the items both answered."""

    model: str
    task: str
    order: str
    policy: str
    n: int
    accuracy: float
    full_accuracy: float
    diff: float  # points, variant - full prefill
    low: float
    high: float
    gained: int  # right here, wrong in the full prefill
    lost: int
    ttft_ms: float  # median
    full_ttft_ms: float  # median
    speedup: float  # median over items of full TTFT / variant TTFT

    @property
    def meets_goal(self) -> bool:
        """Returns whether the 95% interval lies above -GOAL_PTS and the speedup is at least GOAL_SPEEDUP."""
        return self.low >= -GOAL_PTS and self.speedup >= GOAL_SPEEDUP


def summarize(records: list[dict]) -> list[Row]:
    """Returns a Row per (model, task, order, policy), paired with that order's full prefill on the same items."""
    full = {(r["model"], task_label(r), r["order"], r["index"]): r for r in records if r["policy"] == FULL}
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        if r["policy"] != FULL and (r["model"], task_label(r), r["order"], r["index"]) in full:
            groups.setdefault((r["model"], task_label(r), r["order"], variant(r)), []).append(r)
    rows = []
    for (model, task, order, policy), rs in groups.items():
        base = [full[(model, task, order, r["index"])] for r in rs]
        hits, base_hits = [r["correct"] for r in rs], [b["correct"] for b in base]
        d = paired_difference(hits, base_hits)
        gained, lost = discordant(hits, base_hits)
        rows.append(Row(model, task, order, policy, len(rs), statistics.fmean(hits), statistics.fmean(base_hits),
                        100 * d.estimate, 100 * d.low, 100 * d.high, gained, lost,
                        statistics.median(r["ttft_ms"] for r in rs), statistics.median(b["ttft_ms"] for b in base),
                        statistics.median(b["ttft_ms"] / r["ttft_ms"] for r, b in zip(rs, base))))
    return sorted(rows, key=lambda r: (r.model, r.task, r.order, r.policy))


def markdown(rows: list[Row]) -> str:
    """Returns the rows as a Markdown table: accuracy, the paired difference, TTFT and the goal's verdict."""
    lines = ["| model | task | order | recompute | n | cached | full prefill | cached − full (pts, 95%) | +/− "
             "| TTFT cached / full (ms, p50) | speedup | goal |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.model} | {r.task} | {r.order} | `{r.policy}` | {r.n} | {100 * r.accuracy:.1f}% "
                     f"| {100 * r.full_accuracy:.1f}% | {r.diff:+.1f} [{r.low:+.1f}, {r.high:+.1f}] "
                     f"| {r.gained}/{r.lost} | {r.ttft_ms:,.0f} / {r.full_ttft_ms:,.0f} | {r.speedup:.1f}× "
                     f"| {'met' if r.meets_goal else 'not met'} |")
    return "\n".join(lines)


def plot(rows: list[Row], path: Path) -> Path | None:
    """Writes the speed/accuracy plane (speedup vs points lost, with intervals) to `path`; None without matplotlib."""
    from pc_cpu.benchmarks.plots import _pyplot

    plt = _pyplot()
    if plt is None or not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for model in sorted({r.model for r in rows}):
        mine = [r for r in rows if r.model == model]
        ax.errorbar([r.speedup for r in mine], [r.diff for r in mine],
                    yerr=[[r.diff - r.low for r in mine], [r.high - r.diff for r in mine]],
                    fmt="o", capsize=3, label=model)
        for r in mine:
            ax.annotate(f"{r.task} {r.policy}" + ("" if r.order == "given" else f" {r.order}"),
                        (r.speedup, r.diff), fontsize=7, xytext=(4, 2), textcoords="offset points")
    ax.axhspan(-GOAL_PTS, GOAL_PTS, color="green", alpha=.08, label=f"±{GOAL_PTS} points")
    ax.axvline(GOAL_SPEEDUP, color="gray", ls=":", label=f"{GOAL_SPEEDUP:.0f}× TTFT")
    ax.set(xscale="log", xlabel="TTFT speedup over the full prefill (median per item)",
           ylabel="cached − full prefill (points, paired 95%)", title="Documents: accuracy against speed")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


BEGIN = "<!-- bench documents accuracy: begin -->"
END = "<!-- bench documents accuracy: end -->"


def write_results(results: Path, table: str, command: str, image: Path | None) -> None:
    """Puts the table (and the plot's link) between this bench's markers in `results`, replacing what was there."""
    section = [BEGIN, "## Documents against the full prefill (`pc-cpu bench documents accuracy`)", "",
               "Written by the command below; rerunning it replaces this section.", "", f"    {command}", "", table]
    if image is not None:
        section += ["", f"![accuracy against speed]({image.name})"]
    section.append(END)
    text = results.read_text(encoding="utf-8") if results.exists() else "# pc_cpu benchmarks: measured results\n"
    if BEGIN in text and END in text:
        head, _, rest = text.partition(BEGIN)
        _, _, tail = rest.partition(END)
        text = head + "\n".join(section) + tail
    else:
        text = text.rstrip("\n") + "\n\n" + "\n".join(section) + "\n"
    results.write_text(text, encoding="utf-8")
