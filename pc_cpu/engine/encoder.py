"""Computes a schema's encodings (modules, and scaffolds jointly) into library sequences of the context.

How is chosen once per model (Encoder.__init__), not per call:
- where a module is computed: in a workspace stream from slot 0 (the same bytes in every
  process), or, for sliding-window models, which have none, in the library context;
- where it is placed: at its layout positions (in place), or, when the relocator can move
  this model's cells, computed at its home (pml.encoding.home_shift) and moved there
  (ModuleCache picks per encoding by its shift; a shift of 0 is in place).
"""

from __future__ import annotations

from typing import Callable

from dataclasses import dataclass

from pc_cpu.engine.context import Context
from pc_cpu.engine.relocate import apply_pending_shifts, move
from pc_cpu.engine.sequences import SequenceRoles
from pc_cpu.errors import EngineError
from pc_cpu.pml.encoding import (SCAFFOLD_PREFIX, EncodeJob, ScaffoldJob, encode_jobs, home_jobs, home_scaffold_job,
                                 scaffold_job)
from pc_cpu.pml.layout import Layout
from pc_cpu.kvstate import ops
from pc_cpu.store.resident import ResidentTier

OnComputed = Callable[[int], None]  # receives the number of an encoding's tokens one decode batch computed
LibraryOf = Callable[[str], "int | None"]  # an encoding's name -> the library sequence holding it, None: not resident


@dataclass(frozen=True)
class Workspace:
    """An empty stream of a non-unified context where encodings are computed from slot 0 (see Encoder)."""

    ctx: Context
    seq: int

    def compute(self, job: EncodeJob, n_stream: int, on_computed: OnComputed | None = None, *,
                context_cells: bytes | None = None) -> bytes:
        """Returns the state blob, in a layout of `n_stream` streams, of the job's run computed after its context.

        This is where every segment computed apart gets its cells: a schema's module runs, and a
        document's preamble and the document after it (pc_cpu.engine.document_cells). `context_cells`:
        the context's own cells (a one-stream blob, as computed here), restored instead of
        computed again: the same bytes, none of the time. The workspace is empty before and after.
        """
        run = job.run
        try:
            self._compute_after_context(job.context, job.first_position, run.tokens, run.start, on_computed,
                                        context_cells=context_cells)
            return bytes(ops.restream(self.ctx.state_get(self.seq), n_stream))
        finally:
            self.ctx.seq_rm(self.seq)

    def compute_scaffold(self, job: ScaffoldJob, n_stream: int, on_computed: OnComputed | None = None) -> list[bytes]:
        """Returns one state blob per run of the scaffold, computed jointly, each at its computed start.

        The runs are computed back to back after the context (job.computed_starts), as in the
        library, but from slot 0 of an empty stream: the same bytes whatever the library holds.
        Moving each run to its layout position is the caller's (the relocator's) work.
        """
        work, seq = self.ctx, self.seq
        try:
            self._compute_after_context(job.context, job.first_position, job.tokens, job.runs[0].start, on_computed)
            whole = work.state_get(seq)
            if len(job.runs) == 1:
                return [bytes(ops.restream(whole, n_stream))]
            blobs = []
            end = job.runs[0].start + job.n_tokens
            for run, computed in zip(job.runs, job.computed_starts()):
                # A state holds every cell of its sequence: keep only this run's, from the whole again.
                work.seq_rm(seq)
                work.state_set(seq, whole)
                work.seq_rm(seq, job.runs[0].start, computed)
                work.seq_rm(seq, computed + len(run.tokens), end)
                blobs.append(bytes(ops.restream(work.state_get(seq), n_stream)))
            return blobs
        finally:
            work.seq_rm(seq)

    def _compute_after_context(self, context: tuple[int, ...], first_position: int, tokens: tuple[int, ...],
                               start: int, on_computed: OnComputed | None, *,
                               context_cells: bytes | None = None) -> None:
        """Leaves the workspace holding `tokens`' cells alone, computed at [start, ...) after `context`."""
        work, seq = self.ctx, self.seq
        work.seq_rm(seq)
        # The context in a batch of its own, then the tokens: the batches a full prefill split at
        # their start computes, and those of the preamble's own encoding (kernels round by batch).
        if context and context_cells is not None:
            work.state_set(seq, ops.restream(context_cells, work.n_stream))
        elif context:
            work.decode(context, range(first_position, start), seq, logits_last=False)
        work.decode(tokens, range(start, start + len(tokens)), seq, logits_last=False,
                    after_chunk=None if on_computed is None else lambda lo, hi: on_computed(hi - lo))
        if context:
            work.seq_rm(seq, first_position, start)


class Encoder:
    """Computes encodings into library sequences of one context, the way its model allows; one per ModuleCache.

    Sequences it uses (pc_cpu.engine.sequences): the scratch, where runs are decoded; the pin,
    which shares every cell it keeps (pin_cells); the hold, where a run computed in the
    library is kept while it is read (compute_in_library).
    """

    def __init__(self, ctx: Context, roles: SequenceRoles, *, mode: str, workspace: Workspace | None,
                 rope) -> None:
        """Args:
            ctx: the library context.
            roles: its sequence ids.
            mode: the schema encoding mode (pml.encoding).
            workspace: where modules are computed from slot 0; None for sliding-window models, whose
                long runs a stream cannot give back whole (compute_in_library says why).
            rope: one RopeParams per KV cache, to move cells computed at their home; None: in place only.
        """
        self.ctx = ctx
        self.roles = roles
        self.mode = mode
        self.workspace = workspace
        self.rope = rope
        self._compute_at_home: Callable[[EncodeJob, OnComputed | None], list[bytes]] = (
            self._compute_in_workspace if workspace is not None else self.compute_in_library)

    # --- in place ---------------------------------------------------------------

    def encode(self, layout: Layout, key: str, library: int, library_of: LibraryOf,
               on_computed: OnComputed | None = None) -> None:
        """Computes encoding `key` (a module, or scaffold_key(name)) into `library` (and the pin) at its layout positions.

        on_computed(n), when given, is called after each llama_decode batch with the n tokens of
        the encoding it computed (not the context computed before them): the progress of long encodings.
        """
        if key.startswith(SCAFFOLD_PREFIX):
            job = scaffold_job(layout, key[len(SCAFFOLD_PREFIX):], self.mode)
            if job is not None:
                self._encode_scaffold(job, library, library_of, on_computed)
        else:
            self._encode_module(layout, key, library, library_of, on_computed)

    def _encode_module(self, layout: Layout, module: str, library: int, library_of: LibraryOf,
                       on_computed: OnComputed | None) -> None:
        """Computes `module`'s cells at its layout positions and shares them into `library` and the pin.

        With a workspace (models without a sliding window), a run that needs no neighbour's
        cells is computed there after its context, from slot 0 of an empty stream, exactly as a
        full prefill lays them out, and restored into the library: its cells then do not depend
        on where other cells sit in the library, so every process computes the same bytes. Why
        not share the context from the library: attention sums cells in slot order, and library
        cells sit wherever earlier encodings, evictions and restores left room, so the same run
        computed there could differ in its last bits from one history to another.

        Otherwise each run is decoded in the empty scratch sequence after its context: shared
        from resident modules when it lies right before the run, else computed there too (an
        empty sequence accepts any first position). Only the run's cells are kept, a batch at a
        time as they are computed (see pin_cells); emptying the scratch frees the rest.
        """
        ctx, scratch, pin = self.ctx, self.roles.scratch, self.roles.pin
        for job in encode_jobs(layout, module, self.mode):
            if self.workspace is not None and job.after is None:
                blob = self.workspace.compute(job, self.ctx.n_stream, on_computed)
                self.place(blob, job.run.start, job.run.end, library)
                continue
            ctx.seq_rm(scratch)

            def keep(a: int, b: int) -> None:
                ctx.seq_cp(scratch, library, a, b)
                ctx.seq_cp(scratch, pin, a, b)
                if on_computed is not None:
                    on_computed(b - a)

            try:
                self._decode_after_context(job.shared_context, job.context, job.run.tokens, job.run.start,
                                           library_of, keep, must_share=job.after is not None)
            finally:
                ctx.seq_rm(scratch)

    def _encode_scaffold(self, job: ScaffoldJob, library: int, library_of: LibraryOf,
                         on_computed: OnComputed | None) -> None:
        """Computes a scaffold's member runs jointly and shares them, at their layout positions, into `library`.

        Where it can (_scaffold_in_workspace), the runs are computed in the workspace and each
        moved to its position by the relocator. Otherwise they are decoded back to back in the
        empty scratch sequence after the
        first member's context (llama.cpp needs consecutive positions), pinned as they
        are computed, then each later run is moved forward to its layout position with
        seq_add. Only scratch and the pin hold those cells at that point, and a cell has
        one position, so the pin's hold moves with them and nobody else's cells move. The
        move re-rotates K lazily, at the next llama_decode; seq_cp shares cells rather
        than copying them, so the library gets the move too, and `apply_pending_shifts`
        forces it before this returns (state blobs read later must hold rotated K).
        If this raises, the pin may hold cells anywhere in the scaffold's span: the
        caller re-pins that span (`pin_cells`). on_computed(n) hears of each batch's n member tokens.
        """
        if self._scaffold_in_workspace(job):
            for blob, run in zip(self._compute_scaffold(job, on_computed), job.runs):
                self.place(blob, run.start, run.end, library)
            return
        ctx, scratch, pin = self.ctx, self.roles.scratch, self.roles.pin

        def keep(a: int, b: int) -> None:
            ctx.seq_cp(scratch, pin, a, b)
            if on_computed is not None:
                on_computed(b - a)

        ctx.seq_rm(scratch)
        moved = False
        try:
            self._decode_after_context(job.shared_context, job.context, job.tokens, job.runs[0].start, library_of,
                                       keep, must_share=job.after is not None)
            # Last run first: each moves forward onto positions no run still to move occupies.
            for run, computed in reversed(list(zip(job.runs, job.computed_starts()))):
                if run.start != computed:
                    ctx.seq_add(scratch, computed, computed + len(run.tokens), run.start - computed)
                    moved = True
            for run in job.runs:
                ctx.seq_cp(scratch, library, run.start, run.end)
        finally:
            ctx.seq_rm(scratch)
        if moved:
            apply_pending_shifts(ctx, scratch)

    def _decode_after_context(self, shared_context, context: tuple[int, ...], tokens: tuple[int, ...], start: int,
                              library_of: LibraryOf, keep: Callable[[int, int], None], *,
                              must_share: bool = False) -> None:
        """Computes `tokens` at [start, ...) in the empty scratch sequence, after their context.

        The context's cells are shared from resident encodings when `shared_context` names
        them all; otherwise the context tokens are computed right before `start`, unless
        `must_share` (a chain neighbour's cells are not what computing its tokens afresh
        gives). keep(a, b) receives the positions of the tokens' cells a batch at a time,
        as soon as they are computed.
        """
        ctx, scratch = self.ctx, self.roles.scratch
        sources = [(library_of(m), a, b) for m, a, b in shared_context]
        if must_share and any(seq is None for seq, _, _ in sources):
            missing = sorted({m for (m, _, _), (seq, _, _) in zip(shared_context, sources) if seq is None})
            raise EngineError(f"encodings {missing} must be resident before the module computed after them "
                              "(ModuleCache makes them so)")
        if sources and all(seq is not None for seq, _, _ in sources):
            for seq, a, b in sources:
                ctx.seq_cp(seq, scratch, a, b)
            ctx.decode(tokens, range(start, start + len(tokens)), scratch, logits_last=False,
                       after_chunk=lambda lo, hi: keep(start + lo, start + hi))
        else:
            first = start - len(context)

            def keep_tokens(lo: int, hi: int) -> None:  # chunk indices count the context first
                if hi > len(context):
                    keep(max(first + lo, start), first + hi)

            ctx.decode(context + tokens, range(first, start + len(tokens)), scratch, logits_last=False,
                       after_chunk=keep_tokens)

    # --- at home, then moved ------------------------------------------------------

    def encode_at_home(self, layout: Layout, key: str, shift: int, library: int,
                       on_computed: OnComputed | None = None) -> list[bytes]:
        """Returns the blobs of encoding `key` computed at its home (pml.encoding.home_shift), placed `shift` later.

        The blobs are what the byte tiers keep: a restore moves them by the same relocator,
        so cells placed from a store are the bytes placed right after encoding. A module's jobs
        are computed in the workspace, or, for sliding-window models (which have none), in
        the library context with the hold (compute_in_library); a scaffold's job likewise
        (_compute_scaffold).
        """
        if key.startswith(SCAFFOLD_PREFIX):
            job = home_scaffold_job(layout, key[len(SCAFFOLD_PREFIX):], self.mode)
            computed = [(self._compute_scaffold(job, on_computed), job.runs[0].start, job.runs[-1].end)]
        else:
            computed = [(self._compute_at_home(job, on_computed), job.run.start, job.run.end)
                        for job in home_jobs(layout, key, self.mode)]
        blobs = []
        for parts, start, end in computed:
            for blob in parts:
                self.place(self._moved(blob, shift), start + shift, end + shift, library)
            blobs += parts
        return blobs

    def _moved(self, blob, delta: int):
        """Returns `blob`'s cells, computed at their home, moved by `delta` (relocate.move, by the relocator).

        Only models whose RoPE the relocator knows compute at home (ModuleCache.at_home), so
        llama.cpp's way, which would need the scratch and the hold free, never runs here.
        """
        if self.rope is None and delta:
            raise EngineError("cells computed at their home need the relocator to move them, and it does not "
                              "know this model's RoPE; encode in place (ModuleCache.at_home is False)")
        return move(self.ctx, blob, delta, self.rope, seq=self.roles.scratch, empty=self.roles.hold)

    def place(self, blob, start: int, end: int, library: int) -> None:
        """Restores a blob's cells, which sit at positions [start, end), into `library` and the pin."""
        ctx, scratch = self.ctx, self.roles.scratch
        ctx.seq_rm(scratch)
        try:
            ctx.state_set(scratch, blob)
            ctx.seq_cp(scratch, library, start, end)
            ctx.seq_cp(scratch, self.roles.pin, start, end)
        finally:
            ctx.seq_rm(scratch)

    def _compute_in_workspace(self, job: EncodeJob, on_computed: OnComputed | None = None) -> list[bytes]:
        """Returns the one state blob of the job's run, computed after its context from slot 0 of the workspace."""
        return [self.workspace.compute(job, self.ctx.n_stream, on_computed)]

    def compute_in_library(self, job: EncodeJob, on_computed: OnComputed | None = None) -> list[bytes]:
        """Returns the state blobs of the job's run computed after its context, one per whole-state span.

        This is the home computation of sliding-window models. A workspace stream cannot give a
        long run back whole: a state of a sequence longer than the window leaves out its masked
        window-layer cells, and a stream has no second sequence to read a span through
        (llama.cpp copies between streams only whole sequences). Here the run is computed in
        the library context and held by the hold (_compute_held), then read span by span
        (Context.whole_state_spans).
        """
        try:
            self._compute_held(job.context, job.run.tokens, job.run.start, on_computed)
            return self._held_blobs(job.run.start, job.run.end)
        finally:
            self.ctx.seq_rm(self.roles.scratch)
            self.ctx.seq_rm(self.roles.hold)

    def _scaffold_in_workspace(self, job: ScaffoldJob) -> bool:
        """Returns whether the scaffold's runs can be computed in the workspace and moved to their positions.

        As for modules (_encode_module), cells computed there do not depend on where other cells
        sit in the library: without it, a scaffold restored from the store and the same
        scaffold computed afresh differed in their last bits whenever the library's slots did
        (measured with flash attention off). A chained scaffold needs its neighbour's library
        cells, and runs after the first need the relocator to reach their positions.
        """
        return (self.workspace is not None and job.after is None
                and (self.rope is not None or len(job.runs) == 1))

    def _compute_scaffold(self, job: ScaffoldJob, on_computed: OnComputed | None = None) -> list[bytes]:
        """Returns the state blobs of a scaffold's runs computed jointly, each moved to its own position in the job."""
        if not self._scaffold_in_workspace(job):
            return self.compute_scaffold_in_library(job, on_computed)
        blobs = self.workspace.compute_scaffold(job, self.ctx.n_stream, on_computed)
        return [self._moved(blob, run.start - computed)
                for blob, run, computed in zip(blobs, job.runs, job.computed_starts())]

    def compute_scaffold_in_library(self, job: ScaffoldJob, on_computed: OnComputed | None = None) -> list[bytes]:
        """Returns the state blobs of a scaffold's runs computed jointly, each moved to its own position in the job.

        The runs are computed back to back after the context and held (_compute_held), read
        back span by span, and each blob moved by the relocator from where its run was
        computed to where the job puts it. seq_add would move them too, but its K-shift is
        applied only by a decode, which could reuse the cells of a sliding-window model that
        the hold alone still holds.
        """
        try:
            self._compute_held(job.context, job.tokens, job.runs[0].start, on_computed)
            blobs = []
            for run, computed in zip(job.runs, job.computed_starts()):
                blobs += [self._moved(blob, run.start - computed)
                          for blob in self._held_blobs(computed, computed + len(run.tokens))]
            return blobs
        finally:
            self.ctx.seq_rm(self.roles.scratch)
            self.ctx.seq_rm(self.roles.hold)

    def _compute_held(self, context: tuple[int, ...], tokens: tuple[int, ...], start: int,
                      on_computed: OnComputed | None = None) -> None:
        """Computes `context` right before `start`, then `tokens` from `start`, leaving only the tokens, in the hold.

        Both sequences start empty. The context gets a batch of its own, as in
        Workspace.compute. The hold shares each batch of tokens as soon as it is computed: in
        the library context llama.cpp would otherwise reuse a window-layer cell held by one
        sequence once it lies a window behind (pin_cells). The pin cannot serve as the hold,
        since it holds library cells at these positions too, and a state must be read from
        a sequence holding these cells alone. The caller empties both sequences afterwards.
        """
        ctx, scratch, hold = self.ctx, self.roles.scratch, self.roles.hold

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
