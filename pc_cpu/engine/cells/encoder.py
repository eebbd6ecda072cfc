"""Computes segments' cells (pml.segment): a schema's encodings into library sequences, a document's in a workspace.

Every segment pc_cpu caches is computed here, whatever placed it: Workspace.compute (apart, from
slot 0 of an empty stream), Encoder.compute_apart (there, or held in the library context), and
Encoder's scratch path (in place, in the library, after resident cells).

How a schema's encoding is computed is chosen once per model (Encoder.__init__), not per call:
- where: in a workspace stream from slot 0 (the same bytes in every process), or, for
  sliding-window models, which have none, in the library context;
- where it is placed: at its layout positions (in place), or, when the relocator can move
  this model's cells, computed at its home (pml.encoding.home_shift) and moved there
  (ModuleCache picks per encoding by its shift; a shift of 0 is in place).
"""

from __future__ import annotations

from typing import Callable

from dataclasses import dataclass

from pc_cpu.engine.llama.context import Context
from pc_cpu.engine.cells.relocate import apply_pending_shifts, move, shift_live
from pc_cpu.engine.llama.sequences import SequenceRoles
from pc_cpu.errors import EngineError
from pc_cpu.pml.encoding import home_segments, segments_of
from pc_cpu.pml.layout import Layout
from pc_cpu.pml.segment import Segment
from pc_cpu.kvstate import ops
from pc_cpu.store.resident import ResidentTier

OnComputed = Callable[[int], None]  # receives the number of an encoding's tokens one decode batch computed
LibraryOf = Callable[[str], "int | None"]  # an encoding's name -> the library sequence holding it, None: not resident


@dataclass(frozen=True)
class Workspace:
    """An empty stream of a non-unified context where encodings are computed from slot 0 (see Encoder)."""

    ctx: Context
    seq: int

    def compute(self, segment: Segment, n_stream: int, on_computed: OnComputed | None = None, *,
                context_cells: bytes | None = None) -> list[bytes]:
        """Returns one state blob per run of the segment, in a layout of `n_stream` streams, each at its computed start.

        This is where every segment computed apart from the library gets its cells: a schema's
        module runs and scaffolds, and a document's preamble and the document after it
        (pc_cpu.engine.prompts.document_cells). The runs are computed back to back after the context
        (Segment.computed_starts), from slot 0 of an empty stream: the same bytes whatever the
        library holds. Moving a run to its own start is the caller's work (Encoder.compute_apart).
        `context_cells`: the context's own cells (a one-stream blob, as computed here), restored
        instead of computed again: the same bytes, none of the time. The workspace is empty
        before and after.
        """
        work, seq = self.ctx, self.seq
        try:
            self._compute_after_context(segment, on_computed, context_cells)
            whole = work.state_get(seq)
            if len(segment.runs) == 1:
                return [bytes(ops.restream(whole, n_stream))]
            blobs = []
            end = segment.start + segment.n_tokens
            for run, computed in zip(segment.runs, segment.computed_starts()):
                # A state holds every cell of its sequence: keep only this run's, from the whole again.
                work.seq_rm(seq)
                work.state_set(seq, whole)
                work.seq_rm(seq, segment.start, computed)
                work.seq_rm(seq, computed + len(run.tokens), end)
                blobs.append(bytes(ops.restream(work.state_get(seq), n_stream)))
            return blobs
        finally:
            work.seq_rm(seq)

    def _compute_after_context(self, segment: Segment, on_computed: OnComputed | None,
                               context_cells: bytes | None) -> None:
        """Leaves the workspace holding the segment's runs' cells alone, computed back to back after its context."""
        work, seq = self.ctx, self.seq
        context, start, tokens = segment.context, segment.start, segment.tokens
        work.seq_rm(seq)
        # The context in a batch of its own, then the tokens: the batches a full prefill split at
        # their start computes, and those of the preamble's own encoding (kernels round by batch).
        if context and context_cells is not None:
            work.state_set(seq, ops.restream(context_cells, work.n_stream))
        elif context:
            work.decode(context, range(segment.first_position, start), seq, logits_last=False)
        work.decode(tokens, range(start, start + len(tokens)), seq, logits_last=False,
                    after_chunk=None if on_computed is None else lambda lo, hi: on_computed(hi - lo))
        if context:
            work.seq_rm(seq, segment.first_position, start)


class Encoder:
    """Computes encodings into library sequences of one context, the way its model allows; one per ModuleCache.

    Sequences it uses (pc_cpu.engine.llama.sequences): the scratch, where runs are decoded; the pin,
    which shares every cell it keeps (pin_cells); the hold, where a run computed in the
    library is kept while it is read (compute_apart).
    """

    def __init__(self, ctx: Context, roles: SequenceRoles, *, mode: str, workspace: Workspace | None,
                 rope) -> None:
        """Args:
            ctx: the library context.
            roles: its sequence ids.
            mode: the schema encoding mode (pml.encoding).
            workspace: where modules are computed from slot 0; None for sliding-window models, whose
                long runs a stream cannot give back whole (compute_apart says why).
            rope: one RopeParams per KV cache, to move cells computed at their home; None: in place only.
        """
        self.ctx = ctx
        self.roles = roles
        self.mode = mode
        self.workspace = workspace
        self.rope = rope

    # --- in place ---------------------------------------------------------------

    def encode(self, layout: Layout, key: str, library: int, library_of: LibraryOf,
               on_computed: OnComputed | None = None) -> None:
        """Computes encoding `key` (a module, or scaffold_key(name)) into `library` (and the pin) at its layout positions.

        With a workspace (models without a sliding window), a segment that needs no neighbour's
        cells is computed there after its context, from slot 0 of an empty stream, exactly as a
        full prefill lays it out, and restored into the library (compute_apart): its cells then
        do not depend on where other cells sit in the library, so every process computes the
        same bytes. Why not share the context from the library: attention sums cells in slot
        order, and library cells sit wherever earlier encodings, evictions and restores left
        room, so the same run computed there could differ in its last bits from one history to
        another (measured on scaffolds with flash attention off). A scaffold's later runs need
        the relocator to reach their positions from where they are computed.
        Otherwise the segment is computed in the library's scratch sequence (_compute_in_scratch).

        on_computed(n), when given, is called after each llama_decode batch with the n tokens of
        the encoding it computed (not the context computed before them): the progress of long encodings.
        """
        for segment in segments_of(layout, key, self.mode):
            if self.workspace is not None and segment.after is None and (
                    self.rope is not None or len(segment.runs) == 1):
                for blob in self.compute_apart(segment, on_computed):
                    self.place(blob, segment.start, segment.end, library)
            else:
                self._compute_in_scratch(segment, library, library_of, on_computed)

    def _compute_in_scratch(self, segment: Segment, library: int, library_of: LibraryOf,
                            on_computed: OnComputed | None) -> None:
        """Computes the segment's runs in the empty scratch sequence and shares them, at their positions, into `library`.

        The runs are decoded back to back after the context (llama.cpp needs consecutive
        positions), shared from resident encodings when it lies right before them, else computed
        there too (an empty sequence accepts any first position). Each batch of run cells is
        pinned as soon as it is computed (see pin_cells), then each later run is moved forward
        to its layout position with seq_add. Only scratch and the pin hold those cells at that
        point, and a cell has one position, so the pin's hold moves with them and nobody else's
        cells move. The move re-rotates K lazily, at the next llama_decode; seq_cp shares cells
        rather than copying them, so the library gets the move too, and `apply_pending_shifts`
        forces it before this returns (state blobs read later must hold rotated K). Emptying
        the scratch frees the context's cells. If this raises, the pin may hold cells anywhere
        in the segment's span: the caller re-pins that span (`pin_cells`).
        """
        ctx, scratch, pin = self.ctx, self.roles.scratch, self.roles.pin

        def keep(a: int, b: int) -> None:
            ctx.seq_cp(scratch, pin, a, b)
            if on_computed is not None:
                on_computed(b - a)

        ctx.seq_rm(scratch)
        moved = False
        try:
            self._decode_after_context(segment, library_of, keep)
            # Last run first: each moves forward onto positions no run still to move occupies.
            for run, computed in reversed(list(zip(segment.runs, segment.computed_starts()))):
                if run.start != computed:
                    shift_live(ctx, scratch, computed, computed + len(run.tokens), run.start - computed)
                    moved = True
            for run in segment.runs:
                ctx.seq_cp(scratch, library, run.start, run.end)
        finally:
            ctx.seq_rm(scratch)
        if moved:
            apply_pending_shifts(ctx, scratch)

    def _decode_after_context(self, segment: Segment, library_of: LibraryOf, keep: Callable[[int, int], None]) -> None:
        """Computes the segment's tokens from its start in the empty scratch sequence, after its context.

        The context's cells are shared from resident encodings when `shared_context` names
        them all; otherwise the context tokens are computed right before the start, unless the
        segment is a chain link (a neighbour's cells are not what computing its tokens afresh
        gives). keep(a, b) receives the positions of the tokens' cells a batch at a time, as
        soon as they are computed.
        """
        ctx, scratch = self.ctx, self.roles.scratch
        context, tokens, start = segment.context, segment.tokens, segment.start
        sources = [(library_of(m), a, b) for m, a, b in segment.shared_context]
        if segment.after is not None and any(seq is None for seq, _, _ in sources):
            missing = sorted({m for (m, _, _), (seq, _, _) in zip(segment.shared_context, sources) if seq is None})
            raise EngineError(f"encodings {missing} must be resident before the module computed after them "
                              "(ModuleCache makes them so)")
        if sources and all(seq is not None for seq, _, _ in sources):
            for seq, a, b in sources:
                ctx.seq_cp(seq, scratch, a, b)
            ctx.decode(tokens, range(start, start + len(tokens)), scratch, logits_last=False,
                       after_chunk=lambda lo, hi: keep(start + lo, start + hi))
        else:
            first = segment.first_position

            def keep_tokens(lo: int, hi: int) -> None:  # chunk indices count the context first
                if hi > len(context):
                    keep(max(first + lo, start), first + hi)

            ctx.decode(context + tokens, range(first, start + len(tokens)), scratch, logits_last=False,
                       after_chunk=keep_tokens)

    # --- apart, then placed -------------------------------------------------------

    def encode_at_home(self, layout: Layout, key: str, shift: int, library: int,
                       on_computed: OnComputed | None = None) -> list[bytes]:
        """Returns the blobs of encoding `key` computed at its home (pml.encoding.home_shift), placed `shift` later.

        The blobs are what the byte tiers keep: a restore moves them by the same relocator,
        so cells placed from a store are the bytes placed right after encoding.
        """
        blobs = []
        for segment in home_segments(layout, key, self.mode):
            computed = self.compute_apart(segment, on_computed)
            for blob in computed:
                self.place(self._moved(blob, shift), segment.start + shift, segment.end + shift, library)
            blobs += computed
        return blobs

    def compute_apart(self, segment: Segment, on_computed: OnComputed | None = None) -> list[bytes]:
        """Returns the state blobs of the segment's runs, computed apart from the library's cells, each at its run's start.

        In the workspace (Workspace.compute) where there is one. Sliding-window models have
        none: a workspace stream cannot give a long run back whole (a state of a sequence longer
        than the window leaves out its masked window-layer cells, and a stream has no second
        sequence to read a span through: llama.cpp copies between streams only whole sequences).
        There the runs are computed in the library context and held by the hold (_compute_held),
        then read span by span (Context.whole_state_spans), one blob per span. A run computed
        elsewhere than its start is moved there by the relocator (seq_add would move it too, but
        its K-shift is applied only by a decode, which could reuse the cells of a sliding-window
        model that the hold alone still holds).
        """
        deltas = [run.start - computed for run, computed in zip(segment.runs, segment.computed_starts())]
        if self.workspace is not None:
            blobs = self.workspace.compute(segment, self.ctx.n_stream, on_computed)
            return [self._moved(blob, delta) for blob, delta in zip(blobs, deltas)]
        try:
            self._compute_held(segment, on_computed)
            return [self._moved(blob, delta)
                    for run, computed, delta in zip(segment.runs, segment.computed_starts(), deltas)
                    for blob in self._held_blobs(computed, computed + len(run.tokens))]
        finally:
            self.ctx.seq_rm(self.roles.scratch)
            self.ctx.seq_rm(self.roles.hold)

    def _moved(self, blob, delta: int):
        """Returns `blob`'s cells moved by `delta` (relocate.move, by the relocator).

        Only models whose RoPE the relocator knows compute at home (ModuleCache.at_home) or
        move a scaffold's runs apart (encode), so llama.cpp's way, which would need the scratch
        and the hold free, never runs here.
        """
        if self.rope is None and delta:
            raise EngineError("cells computed apart need the relocator to move them, and it does not "
                              "know this model's RoPE; encode in place (ModuleCache.at_home is False)")
        return move(self.ctx, blob, delta, self.rope, seq=self.roles.scratch, empty=self.roles.hold)

    def place(self, blob, start: int, end: int, library: int) -> None:
        """Restores a blob's cells, which sit within positions [start, end), into `library` and the pin."""
        ctx, scratch = self.ctx, self.roles.scratch
        ctx.seq_rm(scratch)
        try:
            ctx.state_set(scratch, blob)
            ctx.seq_cp(scratch, library, start, end)
            ctx.seq_cp(scratch, self.roles.pin, start, end)
        finally:
            ctx.seq_rm(scratch)

    def _compute_held(self, segment: Segment, on_computed: OnComputed | None = None) -> None:
        """Computes the segment's context, then its runs back to back, leaving only the runs' cells, in the hold.

        Both sequences start empty. The context gets a batch of its own, as in
        Workspace.compute. The hold shares each batch of tokens as soon as it is computed: in
        the library context llama.cpp would otherwise reuse a window-layer cell held by one
        sequence once it lies a window behind (pin_cells). The pin cannot serve as the hold,
        since it holds library cells at these positions too, and a state must be read from
        a sequence holding these cells alone. The caller empties both sequences afterwards.
        """
        ctx, scratch, hold = self.ctx, self.roles.scratch, self.roles.hold
        context, tokens, start = segment.context, segment.tokens, segment.start

        def keep(lo: int, hi: int) -> None:
            ctx.seq_cp(scratch, hold, start + lo, start + hi)
            if on_computed is not None:
                on_computed(hi - lo)

        ctx.seq_rm(scratch)
        ctx.seq_rm(hold)
        if context:
            ctx.decode(context, range(start - len(context), start), scratch, logits_last=False)
        ctx.decode(tokens, range(start, start + len(tokens)), scratch, logits_last=False, after_chunk=keep)
        ctx.seq_rm(scratch)

    def _held_blobs(self, start: int, end: int) -> list[bytes]:
        """Returns the state blobs of the hold's cells in [start, end), one per whole-state span, read through the scratch."""
        ctx, scratch = self.ctx, self.roles.scratch
        blobs = []
        for a, b in ctx.whole_state_spans(start, end):
            ctx.seq_cp(self.roles.hold, scratch, a, b)
            blobs.append(ctx.state_get(scratch))
            ctx.seq_rm(scratch)
        return blobs

    # --- the pin ----------------------------------------------------------------

    def pin_cells(self, resident: ResidentTier, start: int, end: int) -> None:
        """Makes the pin sequence hold exactly the resident encodings' cells in positions [start, end).

        Why a pin: llama.cpp's sliding-window cache counts a cell held by a single
        sequence as free once it lies a window behind that sequence's end, and reusing
        it purges the sequence's earlier positions (llama_kv_cache::find_slot,
        apply_ubatch). A library's cells are read by prompts at any position, so each
        is also held by the pin, which is never decoded into: a cell held by two
        sequences is never reused. Cells being computed are pinned batch by batch
        (Context.decode's after_chunk), since a long run would otherwise reuse its own
        first cells. The pin may hold several cells at one position (union members).
        """
        pin = self.roles.pin
        self.ctx.seq_rm(pin, start, end)
        for seq, a, b in resident.held_within(start, end):
            self.ctx.seq_cp(seq, pin, a, b)
