"""A question over documents as the scheduler runs it: assembled from saved cells by the DocumentEncoder.

prepare() finds or computes the preamble's and each document's cells (pc_cpu.engine.documents)
and keeps them until prefill() moves them into the prompt's stream; the question is
computed there. The baseline (use_cache=False) is a full prefill of the identical tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from pc_cpu.engine.documents import DocumentEncoder, Piece
from pc_cpu.engine.prompt_work import Counts, Head
from pc_cpu.engine.streams import full_prefill
from pc_cpu.pml.documents import DocumentPrompt
from pc_cpu.result import Tier
from pc_cpu.store.keys import StoreKey

PREAMBLE = "#preamble"  # the key of the preamble in a Result's tiers


@dataclass
class DocumentWork:
    """A question over documents (a pc_cpu.engine.prompt_work.PromptWork)."""

    prompt: DocumentPrompt
    encoder: DocumentEncoder
    use_cache: bool
    _pieces: list[Piece] | None = None  # prepare's cells, until prefill restores them

    def positions(self) -> int:
        return self.prompt.end

    def prepare(self) -> dict[str, Tier]:
        if not self.use_cache:
            return {}
        prompt, encoder = self.prompt, self.encoder
        preamble_key, *doc_keys = self._keys
        blob, tier = encoder.preamble_blob(prompt.preamble, preamble_key)
        pieces, tiers = [Piece(blob, 0)], {PREAMBLE: tier}
        for doc, key in zip(prompt.documents, doc_keys):
            blob, tier = encoder.document_blob(prompt.preamble, doc.id, doc.tokens, key)
            pieces.append(Piece(blob, doc.start - prompt.home))
            tiers.setdefault(doc.id, tier)
        self._pieces = pieces
        return tiers

    def prefill(self, slot: int) -> int:
        if not self.use_cache:
            return full_prefill(self.encoder.prompts, self.prompt.tokens, slot)
        pieces, self._pieces = self._pieces, None  # the bytes are not needed once restored
        return self.encoder.prefill(self.prompt, pieces, slot)

    def head(self) -> Head | None:
        if not self.use_cache or self.prompt.recomputed:  # recomputed cells: not what the keys say
            return None
        starts = (0,) + tuple(doc.start for doc in self.prompt.documents)
        return Head(tuple(zip(self._keys, starts)), self.prompt.tail_start)

    @cached_property
    def _keys(self) -> tuple[StoreKey, ...]:
        """The preamble's key, then each document's: hashed once per prompt (head and prepare both need them)."""
        prompt, encoder = self.prompt, self.encoder
        return (encoder.preamble_key(prompt.preamble),) + tuple(
            encoder.document_key(prompt.preamble, doc.id, doc.tokens) for doc in prompt.documents)

    def held_tiers(self) -> dict[str, Tier]:
        return {PREAMBLE: Tier.CONTEXT, **{doc.id: Tier.CONTEXT for doc in self.prompt.documents}}

    def prefill_tail(self, slot: int) -> int:
        prompts, prompt = self.encoder.prompts, self.prompt
        prompts.seq_rm(slot, prompt.tail_start, -1)
        prompts.decode(prompt.tail, range(prompt.tail_start, prompt.end), slot)
        return prompt.end

    def counts(self) -> Counts:
        ids = tuple(doc.id for doc in self.prompt.documents)
        if self.use_cache:
            return Counts(self.prompt.cached_tokens, len(self.prompt.tail) + self.prompt.recomputed_tokens, ids)
        return Counts(0, len(self.prompt.tokens), ids)
