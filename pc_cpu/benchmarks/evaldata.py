"""Reads the third-party evaluation sets in place and draws the benchmark items from them, deterministically.

The files live in ../shared/evaldata (see SOURCES.md there); they are never copied into the repository.
$PC_CPU_EVALDATA overrides the directory.
"""

from __future__ import annotations

import gzip
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

from pc_cpu.errors import DataMissingError

NQ_FILE = "nq-open-oracle.jsonl.gz"
KV_FILE = "kv-retrieval-75_keys.jsonl.gz"
SOURCES_HINT = "SOURCES.md in ../shared/evaldata"


@dataclass(frozen=True)
class Passage:
    title: str
    text: str


@dataclass(frozen=True)
class NQQuestion:
    question: str
    answers: tuple[str, ...]
    gold: Passage


@dataclass(frozen=True)
class DocItem:
    """One N-document question: `passages[gold_index]` is the gold passage, the rest distractors."""

    index: int  # the question's line in the NQ file
    question: str
    answers: tuple[str, ...]
    passages: tuple[Passage, ...]
    gold_index: int


@dataclass(frozen=True)
class KVItem:
    """One key-value retrieval item: `pairs[gold_index] == (key, value)`."""

    index: int  # the record's line in the KV file
    pairs: tuple[tuple[str, str], ...]
    key: str
    value: str
    gold_index: int


def evaldata_dir() -> Path:
    """Returns $PC_CPU_EVALDATA, else ../shared/evaldata next to the repository."""
    env = os.environ.get("PC_CPU_EVALDATA")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[3] / "shared" / "evaldata"


def _read_jsonl_gz(path: Path) -> list[dict]:
    """Returns the JSON records of a gzipped JSON-lines file.

    Raises:
        DataMissingError: the file is missing or unreadable; the message says where it is looked for.
    """
    if not path.is_file():
        raise DataMissingError(f"evaluation file {path} is missing; put the evaluation sets (see "
                               f"{SOURCES_HINT}) in that directory or set $PC_CPU_EVALDATA to where they are")
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, EOFError, ValueError) as exc:  # unreadable, truncated gzip, or not JSON lines
        raise DataMissingError(f"evaluation file {path} cannot be read ({exc}); copy it again from its source "
                               f"(see {SOURCES_HINT})") from exc


def load_nq(path: Path | None = None) -> list[NQQuestion]:
    """Returns the NQ-open oracle questions, each with its one gold passage."""
    records = _read_jsonl_gz(path or evaldata_dir() / NQ_FILE)
    return [NQQuestion(r["question"], tuple(r["answers"]), Passage(r["ctxs"][0]["title"], r["ctxs"][0]["text"]))
            for r in records]


def load_kv(path: Path | None = None) -> list[dict]:
    """Returns the raw 75-key retrieval records."""
    return _read_jsonl_gz(path or evaldata_dir() / KV_FILE)


def run_items(task: str, n_docs: int, count: int) -> list[DocItem] | list[KVItem]:
    """Returns the `count` items of a `bench recompute` run: NQ ("nq") or key-value ("kv") items.

    A run's items are drawn together (NQ distractors come from one generator after the questions),
    so items 93..146 of a 200-item run are not those of a 147-item run: a run is split or resumed by
    slicing this list, never by asking for fewer items.
    """
    if not count:
        return []
    if task == "kv":
        return kv_items(load_kv(), n_docs, count)
    return doc_items(load_nq(), n_docs, count, seed=0)


def doc_items(questions: list[NQQuestion], n_docs: int, count: int, *, seed: int = 0) -> list[DocItem]:
    """Returns `count` N-document items; item i puts the gold passage at position i % n_docs.

    Distractors are other questions' gold passages with a different title, drawn with `seed`; the same
    (seed, count) always gives the same items, so variants are paired on identical prompts.
    """
    if n_docs < 1 or count > len(questions):
        raise ValueError(f"n_docs={n_docs}, count={count}: need n_docs >= 1 and count <= {len(questions)}")
    rng = random.Random(seed)
    chosen = rng.sample(range(len(questions)), count)
    items = []
    for i, qi in enumerate(chosen):
        q = questions[qi]
        distractors: list[Passage] = []
        while len(distractors) < n_docs - 1:
            other = questions[rng.randrange(len(questions))].gold
            if other.title != q.gold.title and other not in distractors:
                distractors.append(other)
        gold_index = i % n_docs
        passages = distractors[:gold_index] + [q.gold] + distractors[gold_index:]
        items.append(DocItem(qi, q.question, q.answers, tuple(passages), gold_index))
    return items


def kv_items(records: list[dict], n_keys: int, count: int, *, seed: int = 0) -> list[KVItem]:
    """Returns `count` retrieval items cut down to `n_keys` pairs; item i puts the queried pair at i % n_keys.

    The other pairs are drawn (with `seed`) from the record's own 74 distractor pairs, kept in file order.
    """
    if not 1 <= n_keys <= 75 or count > len(records):
        raise ValueError(f"n_keys={n_keys}, count={count}: need 1 <= n_keys <= 75 and count <= {len(records)}")
    rng = random.Random(seed)
    items = []
    for i in range(count):
        r = records[i]
        others = [tuple(p) for p in r["ordered_kv_records"] if p[0] != r["key"]]
        keep = sorted(rng.sample(range(len(others)), n_keys - 1))
        pairs = [others[j] for j in keep]
        gold_index = i % n_keys
        pairs.insert(gold_index, (r["key"], r["value"]))
        items.append(KVItem(i, tuple(pairs), r["key"], r["value"], gold_index))
    return items
