"""A question over documents as the scheduler runs it: assembled from saved cells by the DocumentEncoder.

prepare() finds or computes the preamble's and each document's cells (pc_cpu.engine.prompts.document_cells)
and keeps them until prefill() moves them into the prompt's stream; the question is
computed there. The baseline (use_cache=False) is a full prefill of the identical tokens.

Exact when it can be: the prompt's prefix (its preamble and documents, in order) computed
together from position 0, as the baseline computes it, is stored under its own key. A question
whose prefix is stored restores it and computes its tail as the baseline does, so it answers as
the baseline, token for token. `prefix` says when that prefix is computed: "background" (after
the first question, which answers from documents encoded apart, while the scheduler is idle),
"first" (by the first question itself), or "off" (never: every question is assembled from
documents encoded apart). Recomputing every moved document (recompute="all") computes it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from pc_cpu.engine.prompts.document_cells import DocumentEncoder, SavedCells
from pc_cpu.engine.runtime.prompt_work import Answer, Counts, Head, IdleTask, same_head
from pc_cpu.pml.document_layout import DocumentPrompt
from pc_cpu.result import PREAMBLE, Tier
from pc_cpu.store.document_library import stand_ins_label
from pc_cpu.store.keys import StoreKey

# The exact prefix waits this long after an answer before it is computed in the background: a
# question sent at once (a script, an app asking several) goes first instead of waiting for the
# n_batch chunk in flight (~2 s on SmolLM2, bench/back_to_back.py); a person leaves far more time.
PREFIX_DELAY_S = 0.25


# How a prompt's exact prefix was had (DocumentWork._exact): restored from a byte tier, found in a
# free slot's stream, or computed by this prompt.
STORED, HELD, COMPUTED = "stored", "held", "computed"


def exact_head(key: StoreKey, end: int) -> Head:
    """Returns the Head of a stream holding the exact prefix stored under `key` (`end` tokens)."""
    return Head(("exact-prefix", key.content), end)


@dataclass
class DocumentWork:
    """A question over documents (a pc_cpu.engine.runtime.prompt_work.PromptWork)."""

    prompt: DocumentPrompt
    encoder: DocumentEncoder
    use_cache: bool
    prefix: str = "off"  # pc_cpu.pml.document_layout.PREFIXES: when the exact prefix is computed and used
    _pieces: list[SavedCells] | None = None  # prepare's cells, until prefill restores them
    _exact: str | None = None  # STORED, HELD or COMPUTED once the exact prefix serves this prompt
    _exact_blob: bytes | None = None  # a STORED prefix's cells, until prefill restores them

    @property
    def pieces(self) -> list[SavedCells] | None:
        """The saved cells `prepare` found or computed (the preamble's, then each document's), until prefill restores them."""
        return self._pieces

    def positions(self) -> int:
        return self.prompt.end

    def prepare(self) -> dict[str, Tier]:
        if not self.use_cache:
            return {}
        if self._wants_exact:
            return self._prepare_exact()
        prompt, encoder = self.prompt, self.encoder
        preamble_key, *doc_keys = self._keys
        blob, tier = encoder.preamble_blob(prompt.preamble, preamble_key)
        pieces, tiers = [SavedCells(blob, 0)], {PREAMBLE: tier}
        for doc, key in zip(prompt.documents, doc_keys):
            context = doc.context(prompt.preamble)
            label = stand_ins_label(doc.after_ids) if doc.after else None
            blob, tier = encoder.document_blob(context, doc.id, doc.tokens, key, context_label=label)
            pieces.append(SavedCells(blob, doc.start - len(context)))
            tiers.setdefault(doc.id, tier)
        self._pieces = pieces
        return tiers

    def _prepare_exact(self) -> dict[str, Tier]:
        """Returns the tiers of the exact prefix: the one that stored it, else `encoded` (prefill computes it)."""
        stored = self.encoder.prefix_blob(self._prefix_key, self.prompt.tail_start)
        if stored is None:  # "first", recompute all, or a "background" prefix lost since head(): computed now
            self._exact = COMPUTED
            return self._every_part(Tier.ENCODED)
        self._exact_blob, tier = stored
        self._exact = STORED
        return self._every_part(tier)

    def prefill(self, slot: int) -> int:
        encoder = self.encoder
        if not self.use_cache:  # the baseline: never reads or writes the store
            return encoder.compute_prefix(self.prompt, slot)
        if self._exact == COMPUTED:
            return encoder.compute_prefix(self.prompt, slot, self._prefix_key)
        if self._exact == STORED:
            blob, self._exact_blob = self._exact_blob, None  # the bytes are not needed once restored
            return encoder.prefill_exact(self.prompt, blob, slot)
        pieces, self._pieces = self._pieces, None
        return encoder.prefill(self.prompt, pieces, slot)

    def head(self) -> Head | None:
        if not self.use_cache:
            return None
        if self._wants_exact:
            return exact_head(self._prefix_key, self.prompt.tail_start)
        if self.prompt.recomputed or self.prompt.select:  # recomputed cells: not what the keys say
            return None
        starts = (0,) + tuple(doc.start for doc in self.prompt.documents)
        return Head(tuple(zip(self._keys, starts)), self.prompt.tail_start)

    @cached_property
    def _wants_exact(self) -> bool:
        """Returns whether this prompt uses its exact prefix (found or computed), decided once for head and prepare.

        "background" uses one only when a tier holds it already; "first" always; recomputing every
        moved document computes no fewer tokens than the prefix, so it computes the prefix too.
        """
        if not self.use_cache or self.prefix == "off":
            return False
        return self.prefix == "first" or self._recomputes_all or self.encoder.cells.contains(self._prefix_key)

    @property
    def _recomputes_all(self) -> bool:
        """Returns whether every document after the first is recomputed (the first is exact at its home)."""
        docs = self.prompt.documents
        return len(docs) > 1 and self.prompt.recomputed == ((docs[1].start, self.prompt.tail_start),)

    @cached_property
    def _keys(self) -> tuple[StoreKey, ...]:
        """The preamble's key, then each document's: hashed once per prompt (head and prepare both need them)."""
        prompt, encoder = self.prompt, self.encoder
        return (encoder.preamble_key(prompt.preamble),) + tuple(
            encoder.document_key(doc.context(prompt.preamble), doc.id, doc.tokens) for doc in prompt.documents)

    @cached_property
    def _prefix_key(self) -> StoreKey:
        return self.encoder.prefix_key(self.prompt)

    def _every_part(self, tier: Tier) -> dict[str, Tier]:
        """Returns Result.tiers saying that `tier` served the preamble and every document."""
        return {PREAMBLE: tier, **{doc.id: tier for doc in self.prompt.documents}}

    @property
    def exact(self) -> bool:
        """Returns whether the prompt's cells are the full prefill's (its exact prefix served it), once prefilled."""
        return self._exact is not None

    def held_tiers(self) -> dict[str, Tier]:
        if self._wants_exact:
            self._exact = HELD
        return self._every_part(Tier.CONTEXT)

    def reusable(self, held: Head) -> int:
        return same_head(self, held)

    def kept_head(self, answer: Answer) -> Head | None:
        return None if answer.finish_reason == "cancelled" else self.head()

    def prefill_tail(self, slot: int, held: Head) -> int:
        prompts, prompt = self.encoder.prompts, self.prompt
        prompts.seq_rm(slot, prompt.tail_start, -1)
        if self._exact == HELD and not self.encoder.cells.contains(self._prefix_key):
            # A slot kept the exact prefix that the tiers lost (evicted, or its documents removed and
            # added again): stored again, so that a later "background" question, which looks for it
            # there, finds it.
            self.encoder.save_prefix(self._prefix_key, slot, prompt.tail_start)
        prompts.decode(prompt.tail, range(prompt.tail_start, prompt.end), slot)
        return prompt.end

    def counts(self) -> Counts:
        ids = tuple(doc.id for doc in self.prompt.documents)
        prompt = self.prompt
        if not self.use_cache or self._exact == COMPUTED:
            return Counts(0, len(prompt.tokens), ids)
        if self._exact is not None:
            return Counts(prompt.tail_start, len(prompt.tail), ids)
        return Counts(prompt.cached_tokens, len(prompt.tail) + prompt.recomputed_tokens, ids)

    def idle_task(self, answer: Answer) -> IdleTask | None:
        """Returns the computation of the exact prefix, for the next question over it ("background"), or None."""
        if not self.use_cache or self.prefix != "background" or self._exact is not None:
            return None
        key, n, store = self._prefix_key, self.prompt.tail_start, self.encoder.store
        if store.contains(key):
            return None
        documents = self._keys[1:]

        def removed() -> bool:
            # A document removed since (remove_document drops its encodings) must not come back in a prefix.
            return not all(store.contains(doc) for doc in documents)

        def save(slot: int) -> Head | None:
            if removed():
                return None
            self.encoder.save_prefix(key, slot, n)
            return exact_head(key, n)

        return IdleTask(key, self.prompt.tokens[:n], save, skip=lambda: store.contains(key) or removed(),
                        calls=self.prompt.prefix_cuts[1:], delay=PREFIX_DELAY_S)
