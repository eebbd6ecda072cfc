"""Gives the layout of a question asked over documents: where each part's tokens go, and what each document's cells depend on.

A document prompt is one chat turn, built from the model's own role markup:

    [BOS] [system turn] [user prefix] | doc 1 | doc 2 | ... | question [user suffix] [assistant prefix]
    <-------------- preamble -------------->                  <------------------ tail ------------------>

The preamble is computed once per system message. Each document is encoded once
per preamble, and moved to wherever a prompt places it: documents follow each
other in the order the caller gives, with no gaps. Position independence is what
lets a library of any size be encoded once: a document's cells do not depend on
which documents come before it in a prompt, so asking over any combination or
order never re-encodes a document. Two encodings per document: right after the
preamble (its "home", the first position a document can take), which the first
document of a prompt uses because the full prefill computes it there; and after
the preamble and a few stand-ins (the documents the library added before it,
stand_in_places), which every other place uses, so that its cells are computed as a
document in a list is, not as the start of the user's message (encoding="library";
"preamble" uses the home encoding everywhere, as the paper's modules do).

Pure Python: the tokenizer and markup are passed in (pc_cpu.pml.tokenizer, roles).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Sequence

from pc_cpu.errors import DocumentError, PromptCacheError
from pc_cpu.pml.layout import Run
from pc_cpu.pml.recompute import RecomputePolicy, contiguous_runs, most_relevant
from pc_cpu.pml.roles import RoleMarkup
from pc_cpu.pml.segment import Segment
from pc_cpu.pml.text import check_utf8
from pc_cpu.pml.tokenizer import Tokenizer

# ask(encoding=...): what a document's cells are computed after, besides the preamble (stand_ins).
ENCODINGS = ("library", "preamble")
STAND_IN_DOCUMENTS = 4  # "library": a document is encoded after at most this many documents added before it
STAND_IN_TOKENS = 512  # ... and at most this many of their tokens (the last ones)
SEPARATOR = "\n\n"  # ends every document, so that the next one (or the question) starts a paragraph


def document_id(text: str) -> str:
    """Returns the id of a document's text: the same text always gets the same id.

    The first use of a document's text (add_document, document_tokens, ask): where text UTF-8
    cannot encode is refused (pc_cpu.pml.text.check_utf8).
    """
    return "doc-" + hashlib.sha256(check_utf8(text, "the document's text").encode("utf-8")).hexdigest()[:16]


NO_TEXT = "no printable character, only whitespace, NUL or other control characters"  # what has_text refuses


def has_text(text: str) -> bool:
    """Returns whether `text` gives a model something to read: a printable character that is not whitespace.

    Printable as Python's str.isprintable says: letters, marks, numbers, punctuation and symbols.
    Whitespace (spaces, newlines, tabs), NUL and the other control characters, format characters
    (a BOM, a zero-width space), private-use and unassigned code points are not: a document or a
    question made only of them is empty (a binary file read as text, say). Text that has some is
    kept whole, control characters included.
    """
    return any(c.isprintable() and not c.isspace() for c in text)


def check_question(question: str) -> str:
    """Returns `question` if it has text (has_text) UTF-8 can encode; raises PromptCacheError naming the fix."""
    if not isinstance(question, str) or not has_text(question):
        raise PromptCacheError(f"the question is empty: {NO_TEXT}; ask something")
    return check_utf8(question, "the question")


def document_tokens(text: str, tokenizer: Tokenizer) -> tuple[int, ...]:
    """Returns the tokens a document contributes to every prompt: its text (never markup) and the separator."""
    return tuple(tokenizer.tokenize(text, special=False)) + tuple(tokenizer.tokenize(SEPARATOR, special=False))


def preamble_tokens(system: str | None, tokenizer: Tokenizer, markup: RoleMarkup) -> tuple[int, ...]:
    """Returns BOS, the system turn (when `system` is given) and the user turn's prefix."""
    tokens = [tokenizer.bos_id] if tokenizer.bos_id is not None else []
    if system is not None:
        tokens += tokenizer.tokenize(markup.prefix["system"], special=True)
        tokens += tokenizer.tokenize(check_utf8(system, "the system message"), special=False)
        tokens += tokenizer.tokenize(markup.suffix["system"], special=True)
    tokens += tokenizer.tokenize(markup.prefix["user"], special=True)
    return tuple(tokens)


def tail_tokens(question: str, tokenizer: Tokenizer, markup: RoleMarkup) -> tuple[int, ...]:
    """Returns the question, the end of the user turn and the text that asks for the assistant's answer."""
    return (tuple(tokenizer.tokenize(question, special=False))
            + tuple(tokenizer.tokenize(markup.suffix["user"] + markup.generation_prompt, special=True)))


def check_encoding(encoding: str) -> str:
    """Returns `encoding` if it is one of ENCODINGS; raises DocumentError naming them."""
    if encoding not in ENCODINGS:
        raise DocumentError(f"encoding={encoding!r} is not a document encoding; use one of {', '.join(ENCODINGS)}")
    return encoding


def stand_in_places(index: int) -> range:
    """Returns the places in the library (oldest first) of the documents the one at `index` is encoded after.

    The library's first STAND_IN_DOCUMENTS documents are each encoded after the ones before them
    (a few files added in the order they are asked about are then encoded as a full prefill
    computes them); every later group of STAND_IN_DOCUMENTS documents after the group before
    it, so that one stand-in context serves the whole group and adding a document computes that
    context's tokens once per group, not once per document.
    """
    if index < STAND_IN_DOCUMENTS:
        return range(index)
    group = index - index % STAND_IN_DOCUMENTS
    return range(group - STAND_IN_DOCUMENTS, group)


def stand_ins(before: list[tuple[int, ...]], room: int) -> tuple[int, ...]:
    """Returns the tokens a document is encoded after, besides the preamble: the documents before it, as in a list.

    In a full prefill every document but the first is computed after other documents, and on a
    small model that changes its cells a lot: encoded after the preamble alone, a document's keys
    read as the start of the user's message and draw the question's attention from the
    document it asks about (bench/history/2026-12-04-documents-on-qwen.md, "Where the loss is"). Encoded after a few other
    documents of the same kind, they read as a document in a list. `before`: the documents at
    its stand_in_places (oldest first), of whose tokens the last STAND_IN_TOKENS count, and no
    more than `room` (the positions left in the context).
    """
    tokens = tuple(t for doc in before for t in doc)
    keep = max(0, min(STAND_IN_TOKENS, room, len(tokens)))
    return tokens[len(tokens) - keep:] if keep else ()


def document_segment(context: tuple[int, ...], tokens: tuple[int, ...], name: str) -> Segment:
    """Returns the segment that computes `tokens` at their home: right after `context`, from position 0.

    A document's context is the preamble (and its stand-ins); a preamble's is empty (it is its
    own home). Their keys: pc_cpu.pml.content_keys.preamble_content, .document_content.
    """
    return Segment(name, (Run(len(context), tuple(tokens)),), tuple(context))


# ask(prefix=...): when the exact prefix (a full prefill of the preamble and documents) is computed and reused.
PREFIXES = ("background", "first", "off")


def check_prefix(prefix: str) -> str:
    """Returns `prefix` if it is one of PREFIXES; raises DocumentError naming them.

    "background": a new prefix is answered from documents encoded apart, and its exact cells are
    computed when the scheduler is idle, for the next question over it; "first": the first
    question computes them itself; "off": never read or written.
    """
    if prefix not in PREFIXES:
        raise DocumentError(f"prefix={prefix!r} is not a prefix policy; use one of {', '.join(PREFIXES)}")
    return prefix


@dataclass(frozen=True)
class PlacedDocument:
    """One document of a prompt: its id, its tokens, and where the prompt puts them."""

    id: str
    tokens: tuple[int, ...]
    start: int
    # What its cells are computed after, besides the preamble (stand_ins): () for the first document,
    # which the prompt places at its home, where the full prefill computes it after the preamble alone.
    after: tuple[int, ...] = ()
    after_ids: tuple[str, ...] = ()  # the documents `after` was taken from, oldest first (they label its cells)

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)

    def context(self, preamble: tuple[int, ...]) -> tuple[int, ...]:
        """Returns the tokens its cells are computed after: the preamble, then its stand-ins."""
        return preamble + self.after


@dataclass(frozen=True)
class DocumentPrompt:
    """A question over documents, laid out: what the cached prompt restores and computes, and the baseline's tokens."""

    preamble: tuple[int, ...]  # at positions 0..home-1
    documents: tuple[PlacedDocument, ...]  # back to back from `home`, in the caller's order
    tail: tuple[int, ...]  # computed for every prompt, after the documents
    recomputed: tuple[tuple[int, int], ...] = ()  # document positions [start, end) computed again, in order
    # Share of the moved documents' tokens (every document but the first) that the engine computes
    # again besides `recomputed`: those whose early-layer K/V deviate most from a full prefill's
    # ("select:R"; pc_cpu.engine.prompts.document_cells picks them once the cells are assembled).
    select: float = 0.0

    @property
    def home(self) -> int:
        """Returns the position every document is encoded at: right after the preamble."""
        return len(self.preamble)

    @property
    def tail_start(self) -> int:
        return self.documents[-1].end if self.documents else self.home

    @property
    def end(self) -> int:
        """Returns one past the last prompt position: where generation continues."""
        return self.tail_start + len(self.tail)

    @property
    def tokens(self) -> tuple[int, ...]:
        """Returns every prompt token in position order: the input of the baseline prefill."""
        return self.preamble + tuple(t for d in self.documents for t in d.tokens) + self.tail

    @property
    def prefix_cuts(self) -> tuple[int, ...]:
        """Returns where the calls that compute the prefix (preamble and documents) at 0..tail_start-1 start, 0 first.

        The preamble is a call, then each document: the calls a document at its home was computed
        in (its preamble's encoding, then the document after it), so the baseline, the exact
        prefix and a prompt whose first document sits at its home give that document the same
        bits (llama.cpp's CPU kernels round a token by the shape of its call: Plan.calls).
        """
        return tuple(sorted({0, *(d.start for d in self.documents)} - {self.tail_start}))

    @property
    def cached_tokens(self) -> int:
        return len(self.preamble) + sum(len(d.tokens) for d in self.documents) - self.recomputed_tokens

    @property
    def recomputed_tokens(self) -> int:
        """Returns how many document tokens are computed again: the runs' and the selected ones."""
        return sum(end - start for start, end in self.recomputed) + self.selected_tokens

    @property
    def moved_start(self) -> int:
        """Returns the first position of the moved documents (all but the first): the tail's start if none."""
        return self.documents[1].start if len(self.documents) > 1 else self.tail_start

    @property
    def selected_tokens(self) -> int:
        """Returns how many tokens `select` picks: its share of the moved documents, at most those not in a run."""
        if not self.select:
            return 0
        in_runs = sum(min(end, self.tail_start) - max(start, self.moved_start) for start, end in self.recomputed
                      if end > self.moved_start)
        free = self.tail_start - self.moved_start - in_runs
        return min(free, round(self.select * (self.tail_start - self.moved_start)))


ORDERS = ("given", "relevant-first", "relevant-last")  # ask(order=...): where the question's document goes


def order_documents(documents: list[tuple[str, tuple[int, ...]]], question: tuple[int, ...],
                    order: str) -> list[tuple[str, tuple[int, ...]]]:
    """Returns `documents` ((id, tokens) pairs) in the order `order` asks for; the others keep theirs.

    "given" keeps the caller's order. "relevant-first" and "relevant-last" move the document
    most like the question (pc_cpu.pml.recompute.most_relevant) to the first or the last place.
    The first place is the one a cached prompt gets exactly (its home); the last sits next
    to the question. The baseline (use_cache=False) prefills the same order, so the two stay
    a like-for-like comparison.

    Raises:
        PromptCacheError: an order not in ORDERS.
    """
    if order not in ORDERS:
        raise PromptCacheError(f"order={order!r} is not an order; use one of {', '.join(ORDERS)}")
    if order == "given" or len(documents) < 2:
        return list(documents)
    ranked = most_relevant({str(i): tokens for i, (_, tokens) in enumerate(documents)}, question, 1)
    if not ranked:
        return list(documents)
    chosen = documents[int(ranked[0])]
    rest = [d for i, d in enumerate(documents) if i != int(ranked[0])]
    return [chosen, *rest] if order == "relevant-first" else [*rest, chosen]


@dataclass(frozen=True)
class DocumentToPlace:
    """A document a prompt places: its id, its tokens, and the documents it is encoded after (encoding="library").

    `before`: (id, tokens) of the library's documents at its stand_in_places, oldest first; empty:
    encoded after the preamble alone.
    """

    id: str
    tokens: tuple[int, ...]
    before: tuple[tuple[str, tuple[int, ...]], ...] = ()


def place_documents(preamble: tuple[int, ...], documents: Sequence[DocumentToPlace], tail: tuple[int, ...],
                    n_ctx: int) -> DocumentPrompt:
    """Returns the DocumentPrompt placing `documents` after the preamble, each encoded after its stand-ins.

    A document's stand-ins are the last tokens of the documents before it (stand_ins), no more
    than the context has room for beside the preamble, the document and one answer token.
    """
    after = {doc.id: stand_ins([tokens for _, tokens in doc.before], n_ctx - len(preamble) - len(doc.tokens) - 1)
             for doc in documents if doc.before}
    after_ids = {doc.id: tuple(doc_id for doc_id, _ in doc.before) for doc in documents if doc.before}
    return layout_documents(preamble, [(doc.id, doc.tokens) for doc in documents], tail, after, after_ids)


def layout_documents(preamble: tuple[int, ...], documents: list[tuple[str, tuple[int, ...]]],
                     tail: tuple[int, ...], after: dict[str, tuple[int, ...]] | None = None,
                     after_ids: dict[str, tuple[str, ...]] | None = None) -> DocumentPrompt:
    """Returns the DocumentPrompt that places `documents` ((id, tokens) pairs) back to back after the preamble.

    `after`: each document's stand-ins (stand_ins) by id, used by every document but the first;
    None or a missing id: encoded after the preamble alone. `after_ids`: the documents they came from.
    """
    placed, position = [], len(preamble)
    for i, (doc_id, tokens) in enumerate(documents):
        standing = (after or {}).get(doc_id, ()) if i else ()
        ids = (after_ids or {}).get(doc_id, ()) if standing else ()
        placed.append(PlacedDocument(doc_id, tokens, position, standing, ids))
        position += len(tokens)
    return DocumentPrompt(preamble, tuple(placed), tail)


def check_document_policy(policy: RecomputePolicy) -> RecomputePolicy:
    """Returns `policy` if a question over documents can use it; raises naming the ones it can.

    `select:R@module` refreshes a schema prompt's modules one after another; a question's runs are
    computed in one pass (pc_cpu.engine.recompute.recompute_pass), so documents take plain `select:R`.
    """
    if policy.select_by_module:
        raise PromptCacheError(f"recompute {str(policy)!r}: '@module' is for schema prompts; with documents use "
                               "select:R without it, head:K, tail:K, a fraction such as 10%, relevant:K, or all")
    return policy


def with_recompute(prompt: DocumentPrompt, policy: RecomputePolicy) -> DocumentPrompt:
    """Returns the prompt with the document positions `policy` computes again (pc_cpu.pml.recompute).

    Recomputed tokens attend to the documents before their own. Runs of them (maximal
    stretches of consecutive positions) are computed together in one pass
    (pc_cpu.engine.recompute.recompute_pass): a run sees the cached cells before it and its own new
    cells, not another run's new cells (EPIC's approximation); a single run sees exactly
    what a full prefill's tokens would. The first
    document is left out: it sits at its home, after the preamble it was encoded after, so
    its cells already are the full prefill's. `relevant:K` ranks every document against
    the question's tokens (a first document among the K adds nothing). `select:R` is left
    to the engine, which needs the assembled cells to choose (DocumentPrompt.select).

    Raises:
        PromptCacheError: a policy documents cannot use (check_document_policy).
    """
    check_document_policy(policy)
    chosen: set[int] = set()
    for doc in prompt.documents[1:]:
        chosen |= policy.choose(list(range(doc.start, doc.end)))
    ranked = most_relevant({str(i): doc.tokens for i, doc in enumerate(prompt.documents)}, prompt.tail,
                           policy.relevant)
    for i in ranked:
        if i != "0":
            doc = prompt.documents[int(i)]
            chosen |= set(range(doc.start, doc.end))
    runs = tuple(contiguous_runs(sorted(chosen)))
    return DocumentPrompt(prompt.preamble, prompt.documents, prompt.tail, runs, policy.select)


def with_runs(prompt: DocumentPrompt, positions: "set[int] | frozenset[int]") -> DocumentPrompt:
    """Returns the prompt recomputing `positions` besides its runs, as runs of its own, nothing left to select.

    The engine calls it once it has chosen the `select:` share (pc_cpu.engine.prompts.document_cells).
    """
    chosen = set(positions).union(*(range(start, end) for start, end in prompt.recomputed))
    return DocumentPrompt(prompt.preamble, prompt.documents, prompt.tail, tuple(contiguous_runs(sorted(chosen))))

