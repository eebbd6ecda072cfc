"""Accuracy of cached generation against the full-prefill baseline (paper Table 1) on NQ and KV retrieval.

Every item is answered greedily once per variant, on identical tokens:
- baseline: full prefill (use_cache=False);
- preamble / independent: cached, modules encoded in that mode (pc_cpu.pml.encoding);
- scaffold: cached, passages under one scaffold so the prompt gets their joint encoding.
Settings are kept apart: "single" (all passages in one module) and "modular" (one module each).
A gap run (modular, preamble) puts `gap` left-out modules before the imported passages.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Callable, Iterable, Iterator

from pc_cpu.benchmarks import prompts
from pc_cpu.benchmarks.evaldata import DocItem, KVItem
from pc_cpu.benchmarks.scoring import best_subspan_em

ENCODINGS = ("preamble", "independent")
SETTING_VARIANTS = {"single": ("baseline", "preamble", "independent"),
                    "modular": ("baseline", "preamble", "independent", "scaffold")}


@dataclass(frozen=True)
class Record:
    """One generated answer."""

    task: str  # "nq" or "kv"
    n: int  # passages (nq) or keys (kv) in the prompt
    setting: str  # "single" or "modular"
    variant: str  # "baseline", "preamble", "independent", "scaffold"
    gap: int  # left-out modules before the imported ones
    index: int  # the item's line in its data file
    gold_index: int
    em: bool
    same_as_baseline: bool  # greedy tokens identical to the baseline's on the same item
    text: str
    cached_tokens: int
    prompt_tokens: int


@dataclass(frozen=True)
class Task:
    """How to turn one item into schemas, prompts and gold answers."""

    name: str
    n: int
    schema: Callable[[str, object, str, tuple], str]  # (name, item, layout, gap passages) -> PML
    prompt: Callable[[str, object, str], str]  # (name, item, layout) -> PML
    answers: Callable[[object], tuple[str, ...]]


def nq_task(n_docs: int, *, chat: bool = True) -> Task:
    """NQ with n_docs passages; chat=False for base models (plain text, no chat template)."""
    return Task("nq", n_docs,
                lambda name, item, layout, gap: prompts.qa_schema(name, item, layout, gap=gap, chat=chat),
                lambda name, item, layout: prompts.qa_prompt(name, item, layout, chat=chat),
                lambda item: item.answers)


def kv_task(n_keys: int, chunk: int, *, chat: bool = True) -> Task:
    """KV retrieval with n_keys pairs, `chunk` pairs per module."""
    return Task("kv", n_keys,
                lambda name, item, layout, gap: prompts.kv_schema(name, item, layout, chunk=chunk, chat=chat),
                lambda name, item, layout: prompts.kv_prompt(name, item, layout, chunk=chunk, chat=chat),
                lambda item: (item.value,))


def _answer(cache, schema: str, prompt: str, *, use_cache: bool, max_tokens: int):
    """Returns (Result, plan tokens) for one prompt; the schema is loaded lazily and unloaded after."""
    from pc_cpu.pml.schema import parse_schema

    name = parse_schema(schema).name
    cache.load_schema(schema, encode=False)  # generate() encodes only what the prompt imports
    try:
        tokens = list(cache.plan(prompt).tokens)
        result = cache.generate(prompt, max_tokens=max_tokens, temperature=0.0, use_cache=use_cache)
    finally:
        cache.unload_schema(name)
    return result, tokens


def run_item(caches: dict, task: Task, item: DocItem | KVItem, *, settings: Iterable[str] = ("single", "modular"),
             gaps: Iterable[int] = (), gap_passages: tuple = (), max_tokens: int = 32) -> list[Record]:
    """Returns the records of every variant of every setting for one item.

    Args:
        caches: {"preamble": PromptCache, "independent": PromptCache}; the baseline runs on "preamble".
        gaps: gap sizes > 0 to run in the modular setting with preamble encoding (needs gap_passages and
            the modular setting).
    """
    answers = task.answers(item)
    records: list[Record] = []
    baseline_by_tokens: dict[tuple, object] = {}
    modular_base_ids: list[int] = []

    def record(setting, variant, gap, result, base_ids):
        records.append(Record(task.name, task.n, setting, variant, gap, item.index, item.gold_index,
                              best_subspan_em(result.text, answers), list(result.token_ids) == list(base_ids),
                              result.text, result.cached_tokens, result.prompt_tokens))

    for setting in settings:
        base = None
        for variant in SETTING_VARIANTS[setting]:
            layout = "scaffold" if variant == "scaffold" else setting
            name = f"{task.name}{item.index}_{layout}"
            schema, prompt = task.schema(name, item, layout, ()), task.prompt(name, item, layout)
            if variant == "baseline":
                cache = caches["preamble"]
                result, tokens = _answer(cache, schema, prompt, use_cache=False, max_tokens=max_tokens)
                # Both settings render the same tokens; if so the baseline is shared, not recomputed.
                base = baseline_by_tokens.setdefault(tuple(tokens), result)
            else:
                cache = caches["independent" if variant == "independent" else "preamble"]
                result, _ = _answer(cache, schema, prompt, use_cache=True, max_tokens=max_tokens)
            record(setting, variant, 0, result if variant != "baseline" else base, base.token_ids)
        if setting == "modular":
            modular_base_ids = base.token_ids
    for gap in gaps:
        name = f"{task.name}{item.index}_gap{gap}"
        schema = task.schema(name, item, "modular", tuple(gap_passages[:gap]))
        result, _ = _answer(caches["preamble"], schema, task.prompt(name, item, "modular"), use_cache=True,
                            max_tokens=max_tokens)
        record("modular", "preamble", gap, result, modular_base_ids)
    return records


def gap_fillers(items: list, i: int, count: int) -> tuple:
    """Returns the passages item i declares as left-out modules in a gap run: the next item's first `count`."""
    return tuple(getattr(items[(i + 1) % len(items)], "passages", ()))[:count]


def run(caches: dict, task: Task, items: list, *, settings=("single", "modular"), gaps=(), max_tokens: int = 32,
        out=None, progress: Callable[[int], None] | None = None, start: int = 0) -> Iterator[Record]:
    """Yields records item by item; appends each as a JSON line to `out` (an open text file) when given.

    Gap passages for item i are the first passages of item i+1 (other questions' passages).
    `start` skips the first items (to resume a cut-off run with the same fillers).
    """
    for i, item in enumerate(items):
        if i < start:
            continue
        filler = gap_fillers(items, i, max(gaps, default=0))
        for rec in run_item(caches, task, item, settings=settings, gaps=gaps, gap_passages=filler,
                            max_tokens=max_tokens):
            if out is not None:
                out.write(json.dumps(asdict(rec)) + "\n")
                out.flush()
            yield rec
        if progress:
            progress(1)


def read_records(path) -> list[Record]:
    """Returns the records of a JSONL file written by `run`."""
    with open(path, encoding="utf-8") as f:
        return [Record(**json.loads(line)) for line in f if line.strip()]
