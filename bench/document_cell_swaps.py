"""Where cached documents lose the answer: the gold answer's log-probability with cells swapped in from the full prefill.

    python bench/document_cell_swaps.py --model qwen2.5-coder-0.5b --task kv --n 12 \
        --variant exact --variant cached --variant layers:8-23 --variant others --variant others:k

For each question over 5 documents (the items of `pc-cpu bench documents accuracy`, even lines),
the cells before the question are built two ways from the same tokens: `exact` (a full prefill)
and `cached` (the preamble and each document as encoded apart, moved into place, as `ask`
assembles them). A variant is `cached` with some of `exact`'s cells grafted in
(pc_cpu.kvstate.state_blob.graft_cells), then the question and the gold answer are computed
after them (teacher forcing) and the answer's summed log-probability is recorded. A variant
that brings the log-probability back to `exact`'s names the cells whose deviation costs the answer.

Variants:
    exact, cached                 the two builds
(--deviation also prints how far the cached K is from the exact K, by layer and offset in a document.)
    layers:A-B                    exact cells in layers A..B (every position)
    gold, others                  exact cells of the gold document / of every other one
    others:k, others:v            only K (or only V) of the other documents
    head:N, tail:N                exact cells of the first / last N tokens of documents 2..5
    recompute-gold                the gold document computed again after the cached cells before it
    standin:nq, standin:kv        documents 2..5 encoded after a fixed stand-in passage instead of
                                  right after the preamble (a "document in a list")
    others-before:N               documents 2..5 encoded after N documents of another question
                                  (real documents of the same kind, not this prompt's)
    all-before:N                  the same for every document, the first one too
    place-before                  document k (k = 2..5) encoded after k - 1 documents of another question,
                                  as many as the full prefill computes it after
    nq-before:N                   documents 2..5 encoded after N NQ passages (another kind of text)
    mixed-before:N                each of documents 2..5 after N documents of a question of its own (as
                                  the library's stand-ins: another group of documents for each)
(--answers also answers greedily after each variant's cells, as the accuracy runs do, and counts the right answers.)

The machinery is driven by hand: built as a PromptCache builds it (tests/engine/machinery.py Engine).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' Engine, run from anywhere
from pc_cpu.benchmarks.document_accuracy import questions  # noqa: E402
from pc_cpu.benchmarks.documents import correct  # noqa: E402
from pc_cpu.engine.prompts.document_cells import SavedCells  # noqa: E402
from pc_cpu.kvstate import ops  # noqa: E402
from pc_cpu.kvstate.state_blob import graft_cells, layer_kv, section_layers  # noqa: E402
from tests.engine.machinery import Engine  # noqa: E402

STANDINS = {
    "nq": ("The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. It is named "
           "after the engineer Gustave Eiffel, whose company designed and built the tower from 1887 to 1889.\n\n"),
    "kv": '"3f2a9c1e-5b7d-4e8a-9c0f-1d2e3f4a5b6c": "7e8f9a0b-1c2d-4e3f-8a5b-6c7d8e9f0a1b"\n\n',
}



def in_a_list(documents) -> str:
    """Returns documents' texts as stand-ins give them: each followed by a blank line."""
    return "".join(d + "\n\n" for d in documents)


def ordered(blob) -> bytearray:
    """Returns a copy of `blob` with each KV cache's cells in position order."""
    out = bytearray(blob)
    ops.order_in_place(out)
    return out

class Item:
    """One question's two builds of the cells before its tail, and what the variants need of them."""

    def __init__(self, pc: Engine, question, others=()):
        self.others = list(others)  # other questions, whose documents stand in for the ones before
        self.neighbour = self.others[0] if self.others else None
        self.pc, self.ctx, self.enc = pc, pc.prompts, pc.encoder
        self.slot, self.workspace = pc.roles.slots[0], pc.roles.workspace
        self.prompt = pc.texts_prompt(question.question, list(question.documents), system=question.system)
        self.gold = self.prompt.documents[question.gold_index]
        p = self.prompt
        self.ctx.seq_rm(self.slot)
        try:
            self.ctx.decode(p.tokens[:p.tail_start], range(p.tail_start), self.slot, logits_last=False)
            self.exact = ordered(self.ctx.state_get(self.slot))
        finally:
            self.ctx.seq_rm(self.slot)
        preamble = self.enc.preamble_blob(p.preamble)[0]
        self.pieces = [SavedCells(preamble, 0)] + [
            SavedCells(self.enc.document_blob(p.preamble, d.id, d.tokens)[0], d.start - p.home) for d in p.documents]
        self.cached = self._joined([self.enc.move(piece, self.slot) for piece in self.pieces])
        self.n_layer = section_layers(self.cached)[0]

    def _joined(self, blobs) -> bytearray:
        return ordered(ops.restore_blob(blobs, 1))

    def positions(self, which: str) -> set[int]:
        """Returns the positions of the gold document, or of every other one (preamble excluded)."""
        gold = set(range(self.gold.start, self.gold.end))
        return gold if which == "gold" else set(range(self.prompt.home, self.prompt.tail_start)) - gold

    def variant(self, name: str) -> bytearray:
        """Returns the cells before the tail that variant `name` (module docstring) gives."""
        kind, _, arg = name.partition(":")
        everything, later = range(self.n_layer), self.prompt.documents[1:]
        if kind == "exact":
            return self.exact
        if kind == "cached":
            return self.cached
        if kind == "layers":
            low, high = map(int, arg.split("-"))
            return graft_cells(self.cached, self.exact, range(low, high + 1), range(self.prompt.tail_start))
        if kind in ("gold", "others"):
            return graft_cells(self.cached, self.exact, everything, sorted(self.positions(kind)), parts=arg or "kv")
        if kind in ("head", "tail"):
            n = int(arg)
            spans = [(d.start, d.start + n) if kind == "head" else (d.end - n, d.end) for d in later]
            return graft_cells(self.cached, self.exact, everything, [p for lo, hi in spans for p in range(lo, hi)])
        if kind == "recompute-gold":
            return self._recomputed_gold()
        if kind == "standin":
            return self._after_standin(STANDINS[arg])
        if kind in ("others-before", "all-before"):
            return self._after_standin(in_a_list(self.neighbour.documents[:int(arg)]),
                                       first_too=kind == "all-before")
        if kind == "mixed-before":
            return self._after_texts({place: in_a_list(self.others[place].documents[:int(arg)])
                                      for place in range(1, len(self.prompt.documents))})
        if kind == "place-before":
            return self._after_standin_by_place()
        if kind == "nq-before":
            passages = questions("nq", "odd", 1, 5)[0].documents
            return self._after_standin(in_a_list(passages[:int(arg)]))
        raise SystemExit(f"unknown variant {name!r}; see the module docstring")

    def _recomputed_gold(self) -> bytearray:
        """Returns the cached cells with the gold document computed again after the cached cells before it."""
        ctx, ws, gold = self.ctx, self.workspace, self.gold
        ctx.seq_rm(ws)
        try:
            ctx.state_set(ws, ops.restream(self.cached, ctx.n_stream))
            ctx.seq_rm(ws, gold.start, -1)
            ctx.decode(gold.tokens, range(gold.start, gold.end), ws, logits_last=False)
            before = ordered(ctx.state_get(ws))
            ctx.state_set(ws, ops.restream(self.cached, ctx.n_stream))
            ctx.seq_rm(ws, 0, gold.end)
            after = ctx.state_get(ws)
        finally:
            ctx.seq_rm(ws)
        return self._joined([before, after] if self.gold.end < self.prompt.tail_start else [before])

    def _after_standin(self, text: str, first_too: bool = False) -> bytearray:
        """Returns the cells with documents 2..5 (or all) computed after the preamble and `text`, then moved into place."""
        return self._after_texts({place: text for place in range(0 if first_too else 1, len(self.prompt.documents))})

    def _after_texts(self, texts: dict[int, str]) -> bytearray:
        """Returns the cells with the document at each place of `texts` computed after the preamble and its text, then moved."""
        ctx, ws, p = self.ctx, self.workspace, self.prompt
        blobs = [self.pieces[0].blob] + [self.pieces[1 + place].blob for place in range(min(texts))]
        for place in sorted(texts):
            doc = p.documents[place]
            standin = tuple(self.pc.model.tokenize(texts[place], special=False))
            ctx.seq_rm(ws)
            try:
                ctx.state_set(ws, ops.restream(self.pieces[0].blob, ctx.n_stream))
                tokens = standin + doc.tokens
                ctx.decode(tokens, range(p.home, p.home + len(tokens)), ws, logits_last=False)
                ctx.seq_rm(ws, 0, p.home + len(standin))
                cells = bytes(ops.restream(ctx.state_get(ws), 1))
            finally:
                ctx.seq_rm(ws)
            blobs.append(self.enc.move(SavedCells(cells, doc.start - p.home - len(standin)), self.slot))
        return self._joined(blobs)

    def _after_standin_by_place(self) -> bytearray:
        """Returns the cells with document k (k = 2..5) computed after k - 1 documents of another question."""
        return self._after_texts({place: in_a_list(self.neighbour.documents[:place])
                                  for place in range(1, len(self.prompt.documents))})

    def score(self, cells: bytearray, answer: tuple[int, ...]) -> float:
        """Returns the answer's summed log-probability after `cells` and the tail (teacher forcing)."""
        ctx, p = self.ctx, self.prompt
        tokens = list(p.tail) + list(answer)
        ctx.seq_rm(self.slot)
        try:
            ctx.state_set(self.slot, ops.restream(cells, ctx.n_stream))
            ctx.decode_each(tokens, range(p.tail_start, p.tail_start + len(tokens)), [self.slot] * len(tokens))
            logprob = 0.0
            for j, token in enumerate(answer):
                logits = ctx.logits(len(p.tail) - 1 + j).astype(np.float64)
                top = logits.max()
                logprob += logits[token] - top - math.log(np.exp(logits - top).sum())
        finally:
            ctx.seq_rm(self.slot)
        return logprob

    def answers(self, cells: bytearray, gold: list[str], n_tokens: int = 128) -> bool:
        """Returns whether a greedy answer after `cells` and the tail holds `gold` (the accuracy runs' check)."""
        ctx, p, model = self.ctx, self.prompt, self.pc.model
        end = p.tail_start + len(p.tail)
        ctx.seq_rm(self.slot)
        out: list[int] = []
        try:
            ctx.state_set(self.slot, ops.restream(cells, ctx.n_stream))
            ctx.decode(list(p.tail), range(p.tail_start, end), self.slot)
            for i in range(n_tokens):
                token = int(np.argmax(ctx.logits(-1)))
                if model.is_end_of_generation(token):
                    break
                out.append(token)
                ctx.decode([token], [end + i], self.slot)
        finally:
            ctx.seq_rm(self.slot)
        return correct(model.detokenize(out), gold)


def deviation(item: Item) -> list[str]:
    """Returns table rows: per layer, the cached K's relative distance from the exact K over documents 2..5, by offset."""
    bins = ((0, 4), (4, 16), (16, 32), (32, 10_000))
    rows = []
    for layer in range(item.n_layer):
        _, exact, _ = layer_kv(item.exact, layer)
        _, cached, _ = layer_kv(item.cached, layer)
        rel = np.linalg.norm(cached - exact, axis=1) / np.maximum(np.linalg.norm(exact, axis=1), 1e-9)
        cells = [[rel[d.start + o] for d in item.prompt.documents[1:] for o in range(lo, min(hi, len(d.tokens)))]
                 for lo, hi in bins]
        rows.append(f"| {layer} | " + " | ".join(f"{np.mean(c):.2f}" if c else "–" for c in cells) + " |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--task", choices=("nq", "kv"), default="kv")
    parser.add_argument("--n", type=int, default=12)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--variant", action="append", default=None)
    parser.add_argument("--deviation", action="store_true",
                        help="Also print, for the first item, how far the cached K is from the exact K by layer and offset.")
    parser.add_argument("--answers", action="store_true",
                        help="Also answer greedily after each variant's cells and count the answers that hold the gold one.")
    args = parser.parse_args()
    variants = args.variant or ["exact", "cached"]
    scores: dict[str, list[float]] = {v: [] for v in variants}
    right: dict[str, list[bool]] = {v: [] for v in variants}
    with Engine(args.model, threads=args.threads, n_ctx=4096) as pc:
        asked = questions(args.task, "even", args.n + 5, 5)  # the 5 after each item lend it their documents
        for i, question in enumerate(asked[:args.n]):
            item = Item(pc, question, asked[i + 1:i + 6])
            if args.deviation and not any(scores.values()):
                print("| layer | K rel. distance, tokens 0-3 of a document | 4-15 | 16-31 | 32- |\n|---|---|---|---|---|")
                print("\n".join(deviation(item)), flush=True)
            gold = question.answers[0] if args.task == "kv" else " " + question.answers[0]
            answer = tuple(pc.model.tokenize(gold, special=False))
            for v in variants:
                cells = item.variant(v)
                scores[v].append(item.score(cells, answer))
                if args.answers:
                    right[v].append(item.answers(cells, question.answers))
            print(question.index, " ".join(f"{v}={scores[v][-1]:.2f}" + (f"{'+' if right[v][-1] else '-'}" if args.answers else "")
                                           for v in variants), flush=True)
    # Not greedy exact match: the answer as the data writes it, which the model may phrase otherwise.
    print("\n| variant | n | gold answer log-prob, mean | median |" + (" right (greedy) |" if args.answers else ""))
    print("|---|---|---|---|" + ("---|" if args.answers else ""))
    for v in variants:
        print(f"| `{v}` | {len(scores[v])} | {statistics.mean(scores[v]):.2f} | {statistics.median(scores[v]):.2f} |"
              + (f" {sum(right[v])} |" if args.answers else ""))


if __name__ == "__main__":
    main()
