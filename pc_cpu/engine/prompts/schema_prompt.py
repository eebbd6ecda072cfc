"""A PML prompt as the scheduler runs it: assembled from a schema's encodings, finished in its own stream.

The plan is cut once (streams.split_tail) where its shared cells end. The part before is
assembled in the library context's staging sequence of the prompt's slot, where module
cells are shared (plus arguments, recomputed tokens, and with `select:` the cells the
Blender picks), then moved into the prompt's stream in position order
(streams.move_to_stream); the prompt's own text is computed there. The baseline
(use_cache=False) is a full prefill of the identical tokens in the stream, in the calls the
cached prompt computed its cells in (Plan.calls).

A prompt that copies whole encodings, none of them resident and all of them stored, skips
the library: their blobs are moved into place and restored straight into its stream
(ModuleCache.restore_stored), the same cells in the same order for one copy instead of
three, and the library gets them back once the scheduler is idle (`idle_task`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from pc_cpu.engine.cells.assembler import assemble, decode_at
from pc_cpu.engine.recompute.blend import Blender
from pc_cpu.engine.llama.context import Context
from pc_cpu.engine.prompts.schema_cells import ModuleCache, StoredCells
from pc_cpu.engine.runtime.prompt_work import Answer, Counts, Head, IdleTask, same_head
from pc_cpu.engine.cells.relocate import apply_pending_shifts, copy_moved
from pc_cpu.engine.cells.streams import SplitPlan, full_prefill, move_to_stream, split_tail
from pc_cpu.errors import ContextOverflowError, EngineError, StateBlobError
from pc_cpu.pml.encoding import encoding_runs
from pc_cpu.pml.layout import ROOT, Layout
from pc_cpu.pml.plan import CopyCells, DecodeTokens, Plan
from pc_cpu.result import Tier

# The library restores a stream-served prompt's encodings this long after its answer at the
# earliest: a prompt sent at once (a script) goes first instead of waiting for the restore.
RESIDENT_DELAY_S = 0.25


@dataclass
class SchemaPrompt:
    """A PML prompt: its plan against a loaded layout, assembled from the ModuleCache's encodings (a PromptWork)."""

    plan: Plan
    layout: Layout
    use_cache: bool
    prompts: Context  # one stream per prompt slot
    modules: ModuleCache  # of the library context
    blender: Callable[[], Blender]  # the Blender of `select:` plans (LazyBlender.get); only they call it
    split: SplitPlan = field(init=False)  # cut once: preparing, prefilling and the head each need it
    _stored: StoredCells | None = field(default=None, init=False)  # prepare's blobs, until prefill restores them
    _restored: frozenset[str] = field(default=frozenset(), init=False)  # encodings restored past the library

    def __post_init__(self) -> None:
        self.split = split_tail(self.plan)

    def positions(self) -> int:
        return self.plan.end if self.use_cache else len(self.plan.tokens)

    def prepare(self) -> dict[str, Tier]:
        if not self.use_cache:
            return self.modules.ensure(self.layout, frozenset(), reserve=0)
        self._stored = self._stored_cells()
        if self._stored is not None:
            return self._stored.tiers  # the dict the Result reports: prefill corrects it if llama.cpp refuses them
        return self._ensure_in_library()

    def _ensure_in_library(self) -> dict[str, Tier]:
        """Makes the prompt's encodings resident in the library; returns the tier that served each."""
        # Library cells the assembly computes beside the shared ones: arguments, recomputed tokens.
        staged = self.split.staged
        moved = sum(len(op.tokens) for op in staged.ops if isinstance(op, CopyCells) and op.moved)
        new_cells = staged.uncached_tokens + staged.selected_tokens + moved + 1
        return self.modules.ensure(self.layout, self.plan.encodings, reserve=new_cells)

    def prefill(self, slot: int) -> int:
        """Builds the prompt's KV cache in the empty stream `slot`; returns the position generation continues at."""
        if not self.use_cache:
            return full_prefill(self.prompts, self.plan.tokens, slot, calls=self.plan.calls)
        self.prompts.seq_rm(slot)
        if self._stored is not None:
            self._restore_stored(slot)
        elif self.split.staged.ops:
            self._stage(slot)
        tail = self.split.tail
        for i, op in enumerate(tail):
            decode_at(self.prompts, slot, op, want_logits=i == len(tail) - 1)
        return self.plan.end

    def _stored_cells(self) -> StoredCells | None:
        """Returns the stored blobs of the encodings this prompt copies whole and in place, or None.

        None when the staged part does anything but copy cells where they were encoded
        (arguments, moved or selected cells), copies part of an encoding, or when an encoding
        is resident or not stored: the library assembles those.
        """
        staged, mode = self.split.staged, self.modules.mode
        if self.plan.select or not staged.ops:
            return None
        copied: dict[str, set[int]] = {}
        for op in staged.ops:
            if not isinstance(op, CopyCells) or op.moved:
                return None
            copied.setdefault(op.encoding, set()).update(range(op.start, op.end))
        if set(copied) != set(self.plan.encodings):
            return None
        for key, positions in copied.items():
            if positions != {p for run in encoding_runs(self.layout, key, mode) for p in range(run.start, run.end)}:
                return None
        return self.modules.stored_cells(self.layout, copied)

    def _restore_stored(self, slot: int) -> None:
        """Restores the stored encodings into stream `slot`; through the library when llama.cpp refuses them."""
        stored, self._stored = self._stored, None
        try:
            self.modules.restore_stored(stored, self.prompts, slot)
        except (StateBlobError, EngineError):
            # ensure restores them again, finds out why, drops the entry and computes it; the
            # Result's tiers (this dict, returned by prepare) then say so.
            self.prompts.seq_rm(slot)
            stored.tiers.update(self._ensure_in_library())
            self._stage(slot)
            return
        self._restored = stored.keys

    def _stage(self, slot: int) -> None:
        """Assembles the shared part in the library's staging sequence `slot`, then moves it into stream `slot`."""
        modules, ctx, staged = self.modules, self.modules.ctx, self.split.staged
        library_of = lambda key: modules.sequence_of(self.layout, key)  # noqa: E731
        try:
            if staged.selected_tokens:
                self.blender().assemble(staged, slot, library_of)
            else:
                def place_moved(op: CopyCells, seq: int) -> None:
                    copy_moved(ctx, modules.roles, library_of(op.encoding), op.encoded_at,
                               op.encoded_at + len(op.tokens), op.start - op.encoded_at, seq, modules.rope)

                assemble(ctx, staged, slot, library_of, logits=False, place_moved=place_moved)
            # Cells moved by seq_add (a parameter after a gap) hold K unrotated until a decode
            # applies it; a state read must hold the rotated K.
            if any(isinstance(op, DecodeTokens) for op in staged.ops):
                apply_pending_shifts(ctx, modules.roles.scratch)
        except BaseException:
            ctx.seq_rm(slot)
            raise
        move_to_stream(ctx, slot, self.prompts, slot)

    def head(self) -> Head | None:
        # The shared cells, and the schema text computed after them in batches of their own (every
        # op but the last, the prompt's own text): what any prompt with this head computes alike.
        staged, tail = self.split
        if not self.use_cache or self.plan.select or not staged.ops or not all(
                isinstance(op, CopyCells) for op in staged.ops):
            return None  # select: recomputes some shared cells, so they are not what the keys say
        copies = tuple((self.modules.key_of(self.layout, op.encoding), op.start, op.encoded_at, len(op.tokens))
                       for op in staged.ops)
        computed = tuple((op.tokens, op.start) for op in tail[:-1])
        return Head(copies + computed, tail[-1].start if tail else staged.end)

    def held_tiers(self) -> dict[str, Tier]:
        return dict.fromkeys(sorted(self.plan.encodings), Tier.CONTEXT)

    def reusable(self, held: Head) -> int:
        return same_head(self, held)

    def kept_head(self, answer: Answer) -> Head | None:
        return None if answer.finish_reason == "cancelled" else self.head()

    def idle_task(self, answer: Answer) -> IdleTask | None:
        """Returns the restore into the library of the encodings this prompt restored past it, or None.

        The next prompt with other text after them then assembles from resident cells. An
        eviction meanwhile cancels it: the caller asked for those cells back.
        """
        if not self._restored:
            return None
        modules, layout, keys, evictions = self.modules, self.layout, self._restored, self.modules.evictions

        def make_resident(_slot: None) -> None:
            try:
                modules.ensure(layout, keys)
            except ContextOverflowError:  # other encodings fill the library: these stay in the byte tiers
                pass

        def skip() -> bool:
            return modules.evictions != evictions or all(modules.sequence_of(layout, key) is not None for key in keys)

        return IdleTask(("resident", layout.schema, keys), (), make_resident, skip=skip, delay=RESIDENT_DELAY_S)

    def prefill_tail(self, slot: int, held: Head) -> int:
        last = self.split.tail[-1]
        self.prompts.seq_rm(slot, last.start, -1)
        decode_at(self.prompts, slot, last, want_logits=True)
        return self.plan.end

    def counts(self) -> Counts:
        plan = self.plan
        modules = tuple(m for m in plan.modules if m != ROOT)
        if self.use_cache:
            return Counts(plan.cached_tokens, plan.uncached_tokens, modules)
        return Counts(0, len(plan.tokens), modules)
