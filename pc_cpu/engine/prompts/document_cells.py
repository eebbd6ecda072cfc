"""Encodes documents once, and assembles a prompt's documents into its stream by moving their saved cells.

Each document is computed once per context, right after it: the preamble alone
(its home), or the preamble and its stand-ins (pc_cpu.pml.document_layout). A context is
encoded like a preamble, once, and restored under each document computed after it;
all of it in the encoders' workspace stream, from slot 0: the same bytes in every
process. Its state blob goes to the byte tiers under its
content key, so a library larger than the context costs RAM and disk, never
context cells: nothing of it is resident until a prompt uses it.

A prompt is then assembled from bytes alone (`prefill`): the preamble's blob and
each document's, moved to the position the prompt gives it (positions rewritten,
K re-rotated) and joined into one blob in position order by one pass of the C
library (pc_state_assemble, pc_cpu.kvstate.native), then restored into the prompt's
empty stream with one state_set. The question is then computed there. A document used at its home
(the first one) is not moved at all, so its cells are exactly the encoded ones.
`pc-cpu bench documents relocation` measures this against llama.cpp's own seq_add on a private
copy; the bytes path was faster (bench/RESULTS.md). A sliding-window model's state
holds two caches whose layers use two RoPE bases; the relocator rewrites each with its
own (pc_cpu.engine.llama.model.cache_ropes). Where those bases are not known, each moved
document goes through llama.cpp's seq_add in the workspace stream instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from pc_cpu.engine.recompute.blend import deviation
from pc_cpu.engine.cells.cell_store import CellStore
from pc_cpu.engine.llama.context import Context
from pc_cpu.engine.cells.encoder import OnComputed, Workspace
from pc_cpu.engine.recompute.probe import Probe
from pc_cpu.engine.cells.relocate import cut, move, move_together
from pc_cpu.engine.recompute.recompute_pass import LibraryRoom, recompute_in_library
from pc_cpu.errors import DocumentError, PromptCacheError, StateBlobError
from pc_cpu.pml.content_keys import DOCUMENT_MODE, document_content, prefix_content, preamble_content
from pc_cpu.pml.document_layout import DocumentPrompt, document_segment, with_runs
from pc_cpu.pml.segment import Segment
from pc_cpu.result import PREAMBLE, Tier
from pc_cpu.kvstate import ops
from pc_cpu.store.document_library import document_label, prefix_label
from pc_cpu.store.keys import StoreKey
from pc_cpu.kvstate.rope import RopeParams
from pc_cpu.store.tiers import TieredStore


@dataclass(frozen=True)
class SavedCells:
    """One saved part of a prompt: its cells' bytes (one stream, at their home) and where they go."""

    blob: bytes
    delta: int  # positions to move the cells by: the prompt's start minus the home


class DocumentEncoder:
    """Finds or computes the cells of preambles and documents; assembles a prompt's stream from them."""

    def __init__(self, prompts: Context, workspace: int, store: TieredStore, ropes: tuple[RopeParams, ...] | None,
                 library: LibraryRoom | None = None, probe: Callable[[], Probe] | None = None):
        self.prompts = prompts
        self.library = library  # where several runs are recomputed in one pass (_recompute_in_library); None: never
        self.probe = probe  # the probe model, loaded on first call ("select:"); None: select is refused
        self.last_selected: tuple[int, ...] = ()  # positions "select:" chose for the last prompt (tests, tools)
        self.workspace = workspace  # an empty stream of `prompts` where encodings are computed
        self.computer = Workspace(prompts, workspace)
        self.store = store
        self.cells = CellStore(prompts, store)
        self.ropes = ropes  # one per KV cache of a saved state, for the relocator; None: llama.cpp's seq_add moves cells
        self.model_id = prompts.cells_id
        self.encoded = 0  # preambles and documents this instance computed
        self._buffer = bytearray()  # the last prompt's assembled cells (assembled), grown to the largest

    def check_supported(self) -> None:
        """Raises DocumentError when this model's cells cannot be moved (so documents cannot be placed)."""
        if self.ropes is None and not self.prompts.can_shift:
            raise DocumentError(
                "documents need their cells moved to other positions, which this model's KV cache does not "
                "allow; use a PML schema with this model, or another model (pc-cpu models)")

    # --- keys -----------------------------------------------------------------------

    def preamble_key(self, preamble: tuple[int, ...], label: str | None = None) -> StoreKey:
        """Returns the key of a preamble's cells; `label`: for a stand-in context, the documents it holds (stand_ins_label)."""
        return StoreKey(self.model_id, preamble_content(preamble), DOCUMENT_MODE, label=label or "document preamble")

    def document_key(self, preamble: tuple[int, ...], doc_id: str, tokens: tuple[int, ...]) -> StoreKey:
        return StoreKey(self.model_id, document_content(preamble, tokens), DOCUMENT_MODE,
                        label=document_label(doc_id))

    def prefix_key(self, prompt: DocumentPrompt) -> StoreKey:
        """Returns the key of the prompt's exact prefix: its preamble and documents, in order, computed together."""
        return StoreKey(self.model_id, prefix_content(prompt.tokens[:prompt.tail_start], prompt.prefix_cuts), DOCUMENT_MODE,
                        label=prefix_label(doc.id for doc in prompt.documents))

    # --- encodings ------------------------------------------------------------------

    def preamble_blob(self, preamble: tuple[int, ...], key: StoreKey | None = None) -> tuple[bytes, Tier]:
        """Returns the preamble's cells (positions 0..n-1) and the tier that served them (`key`: its key, if known)."""
        key = key or self.preamble_key(preamble)
        stored = self._stored(key, (0, len(preamble)))
        if stored is not None:
            return stored
        return self._computed(key, document_segment((), preamble, key.label)), Tier.ENCODED

    def document_blob(self, preamble: tuple[int, ...], doc_id: str, tokens: tuple[int, ...],
                      key: StoreKey | None = None, on_computed: OnComputed | None = None,
                      served: dict[str, Tier] | None = None, context_label: str | None = None) -> tuple[bytes, Tier]:
        """Returns a document's cells, computed after `preamble` at its home, and the tier that served them.

        on_computed(n) hears of each decode batch of n document tokens; a document a tier holds
        is not computed, and it hears nothing. `served` gets the preamble's tier under PREAMBLE
        when the document is computed (only then are the preamble's cells needed).
        `context_label`: the store label of `preamble` when it holds other documents (stand_ins_label).
        """
        home = len(preamble)
        key = key or self.document_key(preamble, doc_id, tokens)
        stored = self._stored(key, (home, home + len(tokens)))
        if stored is not None:
            return stored
        preamble_cells, preamble_tier = self.preamble_blob(preamble, self.preamble_key(preamble, context_label))
        if served is not None:
            served[PREAMBLE] = preamble_tier
        segment = document_segment(preamble, tokens, key.label)
        return self._computed(key, segment, on_computed, context_cells=preamble_cells), Tier.ENCODED

    def prefix_blob(self, key: StoreKey, n_tokens: int) -> tuple[bytes, Tier] | None:
        """Returns the stored exact prefix of `n_tokens` cells (positions 0..n-1) and its tier, or None."""
        return self._stored(key, (0, n_tokens))

    def save_prefix(self, key: StoreKey, slot: int, n_tokens: int) -> bytes:
        """Returns the cells of stream `slot`, which holds exactly a prefix of `n_tokens`, after storing them under `key`.

        Not counted in `encoded`: a prefix is no preamble or document (a warm store still encodes none).
        """
        return self.cells.put(key, slot, n_tokens, (0, n_tokens))

    def _stored(self, key: StoreKey, positions: tuple[int, int]) -> tuple[bytes, Tier] | None:
        """Returns the stored cells of `key` and their tier, or None (a damaged entry is dropped: it misses)."""
        return self.cells.get(key, positions)

    def _computed(self, key: StoreKey, segment: Segment, on_computed: OnComputed | None = None, *,
                  context_cells: bytes | None = None) -> bytes:
        """Returns the segment's one run computed after its context (Workspace.compute), after storing it under `key`."""
        (blob,) = self.computer.compute(segment, 1, on_computed, context_cells=context_cells)
        blob = bytes(ops.with_sequence(blob, 0))  # as CellStore.put saves a stream: the bytes of any stream
        self.cells.put_blobs(key, [blob], segment.n_tokens, (segment.start, segment.end))
        self.encoded += 1
        return blob

    # --- assembly -------------------------------------------------------------------

    def prefill(self, prompt: DocumentPrompt, pieces: list[SavedCells], slot: int) -> int:
        """Restores the prompt's moved cells into the empty stream `slot`, computes the tail; returns its end.

        The last tail token's logits are then ready to sample from.
        """
        self.prompts.seq_rm(slot)
        if prompt.select:
            self.last_selected = self._select(prompt, pieces, slot)
            prompt = with_runs(prompt, self.last_selected)
        if self.ropes is not None and not prompt.recomputed:
            self.prompts.state_set(slot, self.assembled(pieces))
        elif not (prompt.recomputed and self._recompute_in_library(prompt, pieces, slot)):
            moved = [self.move(piece, slot) for piece in pieces]
            if prompt.recomputed:
                moved = self._recompute(prompt, moved, slot)
            self.prompts.state_set(slot, ops.restore_blob(moved, self.prompts.n_stream))
        return self._tail(prompt, slot)

    def prefill_exact(self, prompt: DocumentPrompt, blob: bytes, slot: int) -> int:
        """Restores the prompt's exact prefix (`blob`, from prefix_blob) into the empty stream `slot`, computes the tail; returns its end.

        One piece at its own positions: nothing is moved, and no recompute policy applies (every
        cell already is the full prefill's).
        """
        self.prompts.seq_rm(slot)
        # Into the buffer kept across prompts (assembled), not a fresh one: mapping ~100 MB of new pages
        # for every question cost more than the copy.
        self.prompts.state_set(slot, self.assembled([SavedCells(blob, 0)]))
        return self._tail(prompt, slot)

    def compute_prefix(self, prompt: DocumentPrompt, slot: int, key: StoreKey | None = None) -> int:
        """Computes the prompt in the empty stream `slot` as a full prefill, prefix then tail; returns its end.

        The prefix (preamble and documents) is decoded from position 0 in the calls
        DocumentPrompt.prefix_cuts gives (the preamble, then each document), and the tail in a
        call of its own: the baseline, a prefix computed by its first question, one computed
        while the scheduler is idle (in the same calls) and a first document at its home all
        decode the same batches, and llama.cpp's CPU kernels give bits by batch shape, so a
        question restoring the stored prefix answers as the baseline does, token for token.
        `key`: the prefix is stored under it before the tail is computed (None: not stored, the baseline).
        """
        n = prompt.tail_start
        self.prompts.seq_rm(slot)
        edges = (*prompt.prefix_cuts, n)
        for lo, hi in zip(edges, edges[1:]):
            self.prompts.decode(prompt.tokens[lo:hi], range(lo, hi), slot, logits_last=False)
        if key is not None:
            self.save_prefix(key, slot, n)
        return self._tail(prompt, slot)

    def _tail(self, prompt: DocumentPrompt, slot: int) -> int:
        """Computes the prompt's tail after the cells stream `slot` holds; returns its end (the last logits ready)."""
        start = prompt.tail_start
        if prompt.tail:  # a conversation's documents (pc_cpu.engine.prompts.chat_prompt) have none: the turn computes it
            self.prompts.decode(prompt.tail, range(start, prompt.end), slot)
        return prompt.end

    def assembled(self, pieces: list[SavedCells], n_stream: int | None = None) -> memoryview:
        """Returns the restore blob of the pieces moved into place, in a buffer reused by the next prompt.

        One pass of the C library (pc_state_assemble): each piece is copied once, its K turned on
        the way. A buffer kept across prompts, not a fresh one: mapping ~10-100 MB of new pages
        cost more than the copy (bench/RESULTS.md, "Moving saved cells into a prompt").
        """
        blobs, deltas = [p.blob for p in pieces], [p.delta for p in pieces]
        n_stream = n_stream or self.prompts.n_stream  # the library context's is 1 (_recompute_in_library)
        try:
            return move_together(self.prompts, blobs, deltas, self.ropes, n_stream, self._buffer, seq=self.workspace,
                                 empty=self.workspace)
        except BufferError:  # a view of the last prompt's bytes outlived it (a traceback holds one): start afresh
            self._buffer = bytearray()
            return move_together(self.prompts, blobs, deltas, self.ropes, n_stream, self._buffer, seq=self.workspace,
                                 empty=self.workspace)

    def _select(self, prompt: DocumentPrompt, pieces: list[SavedCells], empty: int) -> tuple[int, ...]:
        """Returns the positions of the prompt's `selected_tokens` moved-document cells that deviate most, sorted.

        CacheBlend's criterion, as schema prompts have it (pc_cpu.engine.recompute.blend): the probe (the
        model's first layers, pc_cpu.engine.recompute.probe) computes the full prefill's K/V at its last layer,
        the assembled cells give the cached ones at that layer, and the tokens whose K/V moved
        furthest are computed again. Tokens already in a run are not candidates. `empty`: a free
        stream of the prompt context (where llama.cpp moves cells when the relocator cannot).
        """
        count = prompt.selected_tokens
        if not count:
            return ()
        if self.probe is None:
            raise PromptCacheError("recompute 'select:…' needs the probe model, which this document encoder "
                                   "was not given; use head:K, tail:K, a fraction such as 10%, or relevant:K")
        probe = self.probe()
        full = probe.kv_of_tokens(prompt.tokens[:prompt.tail_start])
        section, index = probe.layer
        try:
            if self.ropes is not None:
                view = self.assembled(pieces, 1)
                try:
                    cached = ops.layer_kv(view, index, section=section)
                finally:
                    view.release()  # the buffer is reused by the assembly that follows
            else:
                moved = ops.restore_blob([self.move(piece, empty) for piece in pieces], 1)
                cached = ops.layer_kv(moved, index, section=section)
        except StateBlobError as exc:
            raise PromptCacheError(f"recompute 'select:…' cannot read this model's KV cache ({exc}); "
                                   "use head:K, tail:K, a fraction such as 10%, or relevant:K instead") from None
        in_runs = {p for start, end in prompt.recomputed for p in range(start, end)}
        candidates = np.array([p for p in range(prompt.moved_start, prompt.tail_start) if p not in in_runs],
                              dtype=np.int64)
        scores = deviation(cached, full, candidates)
        return tuple(sorted(candidates[np.argsort(-scores, kind="stable")[:count]].tolist()))

    def _recompute_in_library(self, prompt: DocumentPrompt, pieces: list[SavedCells], slot: int) -> bool:
        """Fills the empty stream `slot` with the prompt's cells before its tail, its runs computed in one pass.

        Returns False (nothing done) when it does not apply.

        Several runs: pc_cpu.engine.recompute.recompute_pass computes them all in one decode in the library
        context, each after the cached cells before it (not after the other runs' new cells).
        One run, no library, no idle library sequence or no room there: False, nothing changed,
        and `_recompute` computes the runs in this context's workspace stream. One run goes
        there on purpose: its stream holds exactly the cells before it, in position order, so
        its cells are those a full prefill computes in the same batches (recompute="all" is
        one run, and stays exact), whatever the library holds.
        """
        if self.library is None or len(prompt.recomputed) < 2:
            return False
        if self.ropes is not None:  # moved and joined in one pass of the C library, for the library's one stream
            cached = self.assembled(pieces, self.library.ctx.n_stream)
        else:
            cached = ops.restore_blob([self.move(piece, slot) for piece in pieces], self.library.ctx.n_stream)
        try:
            return recompute_in_library(self.library, cached, prompt.recomputed, prompt.tokens[:prompt.tail_start],
                                        self.prompts, slot)
        finally:
            if isinstance(cached, memoryview):
                cached.release()  # the buffer is reused by the next prompt

    def _recompute(self, prompt: DocumentPrompt, moved: list, empty: int) -> list:
        """Returns blobs holding the prompt's cells before its tail, with `prompt.recomputed` computed again.

        `moved` are the preamble's and documents' cells at their prompt positions. Each run is
        decoded in the workspace stream after every cell before it, cached or computed by an
        earlier run, as a full prefill would compute it. llama.cpp decodes a sequence only at
        the position after its last cell, so the cells before a run are restored alone and the
        cached cells after it are cut from their piece (in `empty`, a free stream). This is the
        path of a prompt with one run, and of several when the library cannot take them
        (_recompute_in_library): one decode and one state read per run.
        """
        spans = [(0, prompt.home)] + [(doc.start, doc.end) for doc in prompt.documents]
        tokens = prompt.tokens
        ws = self.workspace

        def cached(lo: int, hi: int) -> list:
            return [blob if lo <= s and e <= hi else self.cut(blob, max(s, lo), min(e, hi), empty)
                    for blob, (s, e) in zip(moved, spans) if s < hi and e > lo]

        parts, cursor = [], 0
        try:
            for start, end in prompt.recomputed:
                parts += cached(cursor, start)
                self.prompts.state_set(ws, ops.restore_blob(parts, self.prompts.n_stream))
                self.prompts.decode(tokens[start:end], range(start, end), ws, logits_last=False)
                parts, cursor = [ops.restream(self.prompts.state_get(ws), 1)], end
        finally:
            self.prompts.seq_rm(ws)
        return parts + cached(cursor, prompt.tail_start)

    def cut(self, blob, lo: int, hi: int, empty: int) -> bytearray:
        """Returns the cells of `blob` at positions [lo, hi), cut by llama.cpp in the free stream `empty`."""
        return cut(self.prompts, blob, lo, hi, seq=empty)

    def move(self, piece: SavedCells, empty: int) -> bytes | bytearray:
        """Returns the piece's cells moved into place: by the relocator, else by llama.cpp (`empty`: a free stream)."""
        return move(self.prompts, piece.blob, piece.delta, self.ropes, seq=self.workspace, empty=empty)
