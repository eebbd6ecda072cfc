"""Keeps a schema's encodings in the context (tier 0), backed by the byte tiers (RAM, disk).

For each encoding a prompt needs (a module, or a scaffold's joint encoding):
resident in the context → use it; else in a byte tier → restore its state blob;
else → encode it, and write the new state through to every byte tier, so that a
later process (or a later prompt, after eviction) gets it back without computing.
When the context runs out of cells, the least recently used encodings are
evicted from it; their bytes stay in the tiers below.

The tiers say which one served each encoding (a pc_cpu.result.Tier): what
Result.tiers reports.

A prompt that needs only stored encodings may skip the library: `stored_cells` reads their
blobs and `restore_stored` moves and joins them straight into the prompt's stream
(pc_cpu.engine.prompts.schema_prompt says when).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Iterable

from pc_cpu.engine.cells.cell_store import CellStore
from pc_cpu.engine.llama.context import Context
from pc_cpu.engine.cells.relocate import move, move_together
from pc_cpu.engine.llama.sequences import SequenceRoles
from pc_cpu.engine.cells.encoder import Encoder, Workspace
from pc_cpu.errors import ContextOverflowError, EngineError, StateBlobError
from pc_cpu.pml.encoding import (SCAFFOLD_PREFIX, encoded_after, encode_cells, encoding_content, encoding_keys,
                                 encoding_runs, home_segments, home_shift)
from pc_cpu.pml.layout import ROOT, Layout, Run
from pc_cpu.result import Tier
from pc_cpu.kvstate import ops
from pc_cpu.store.keys import StoreKey
from pc_cpu.store.resident import ResidentTier
from pc_cpu.kvstate.rope import RopeParams
from pc_cpu.store.tiers import TieredStore

log = logging.getLogger(__name__)

@dataclass
class StoredCells:
    """The stored blobs of a prompt's encodings, each with the shift that puts it in place, and the tier of each."""

    keys: frozenset[str]  # the encodings
    blobs: list[bytes] = field(default_factory=list)  # at their homes
    shifts: list[int] = field(default_factory=list)  # one per blob
    tiers: dict[str, Tier] = field(default_factory=dict)  # the byte tier that served each encoding


@dataclass(frozen=True)
class Placed:
    """The resident key of an encoding whose cells sit `shift` positions after its home.

    One content key (its home cells) may be resident at other positions for other schemas:
    each placement is its own set of cells. An encoding at its home is resident under its
    content key itself.
    """

    key: StoreKey
    shift: int

    @property
    def label(self) -> str:  # names it in ResidentTier's errors
        return self.key.label


class ModuleCache:
    """Makes encodings resident on demand; one instance per context."""

    def __init__(self, ctx: Context, resident: ResidentTier, store: TieredStore | None, roles: SequenceRoles, *,
                 mode: str, workspace: Workspace | None = None, rope: tuple[RopeParams, ...] | None = None):
        self.ctx = ctx
        self.roles = roles  # the scratch reads and restores states; the pin holds every resident cell too
        self.resident = resident
        self.store = store
        self.cells = None if store is None else CellStore(ctx, store)
        self.mode = mode
        self.rope = rope  # one per KV cache, to move cells for prompts that place modules elsewhere; None: seq_add
        self.encoder = Encoder(ctx, roles, mode=mode, workspace=workspace, rope=rope)
        # Encodings are computed at their home and moved into place (pml.encoding.home_shift) when the
        # relocator can move this model's cells; otherwise in place, and editing a module's length
        # re-encodes the encodings after it.
        self.at_home = rope is not None
        self.model_id = ctx.cells_id
        self._moved_buffer = bytearray()  # the last restored blob moved into place (_restore), grown to the largest
        self.encoded = 0  # encodings this instance computed (a warm store keeps this at 0)
        self.evictions = 0  # calls to evict: work queued to make encodings resident gives way to a later one
        self._keys: dict[tuple[str, str], tuple[Layout, StoreKey]] = {}  # (schema, encoding) -> its content key
        self._shifts: dict[tuple[str, str], tuple[Layout, int]] = {}  # (schema, encoding) -> home_shift
        self._used_by: dict[str, set[StoreKey]] = {}  # schema -> the keys it made resident

    def key_of(self, layout: Layout, key: str) -> StoreKey:
        """Returns the content-addressed key of encoding `key` of `layout` (pc_cpu.store.keys)."""
        memo = self._keys.get((layout.schema, key))
        if memo is not None and memo[0] is layout:
            return memo[1]
        store_key = StoreKey(self.model_id, encoding_content(layout, key, self.mode, at_home=self.at_home), self.mode,
                             label=f"{layout.schema}/{key}")
        self._keys[(layout.schema, key)] = (layout, store_key)
        return store_key

    def shift_of(self, layout: Layout, key: str) -> int:
        """Returns how far encoding `key`'s cells are moved from where they are computed (0: computed in place)."""
        if not self.at_home:
            return 0
        memo = self._shifts.get((layout.schema, key))
        if memo is not None and memo[0] is layout:
            return memo[1]
        shift = home_shift(layout, key, self.mode)
        self._shifts[(layout.schema, key)] = (layout, shift)
        return shift

    def resident_key_of(self, layout: Layout, key: str) -> StoreKey | Placed:
        """Returns the key under which encoding `key`'s cells, at `layout`'s positions, are resident."""
        shift = self.shift_of(layout, key)
        store_key = self.key_of(layout, key)
        return store_key if shift == 0 else Placed(store_key, shift)

    def sequence_of(self, layout: Layout, key: str) -> int | None:
        """Returns the library sequence holding encoding `key` of `layout`, or None when it is not resident."""
        return self.resident.get(self.resident_key_of(layout, key))

    def ensure(self, layout: Layout, keys: Iterable[str], *, reserve: int = 0, pinned: Iterable[StoreKey] = (),
               on_computed: Callable[[str, int], None] | None = None) -> dict[str, Tier]:
        """Makes every encoding in `keys` resident, leaving `reserve` cells free; returns the tier of each.

        Encodings in `pinned` (keys that running prompts read) are never evicted.
        on_computed(key, n) hears of each decode batch of n tokens computed for an encoding in `keys`.

        Raises:
            ContextOverflowError: the encodings and the reserve do not fit in the context together.
        """
        wanted = set(keys)
        ordered = [key for key in encoding_keys(layout, self.mode) if key in wanted]
        keep = {self.resident_key_of(layout, key) for key in ordered} | set(pinned)
        self._used_by.setdefault(layout.schema, set()).update(keep)
        served = {key: self._ensure_one(layout, key, keep, on_computed) for key in ordered}
        self._make_room(reserve, keep)
        return served

    def stored_cells(self, layout: Layout, keys: Iterable[str]) -> StoredCells | None:
        """Returns the stored blobs of every encoding in `keys`, each with the shift that puts it in place; or None.

        For a prompt that restores them straight into its stream (`restore_stored`) instead of
        into the library: one copy of the cells instead of three (into the library, out of it,
        into the stream). None when one of them is resident or not stored (`ensure` then serves
        the prompt), or when the relocator does not know this model's one KV cache (a sliding
        window's second cache is restored through the library).
        """
        if self.cells is None or self.rope is None or len(self.rope) != 1:
            return None
        wanted = set(keys)
        stored = StoredCells(keys=frozenset(wanted))
        for key in (key for key in encoding_keys(layout, self.mode) if key in wanted):
            if self.resident.contains(self.resident_key_of(layout, key)):
                return None
            runs, shift = encoding_runs(layout, key, self.mode), self.shift_of(layout, key)
            found = self._lookup(layout, key, self.key_of(layout, key), runs, shift)
            if found is None:
                return None
            stored.blobs.extend(found[0])
            stored.shifts.extend([shift] * len(found[0]))
            stored.tiers[key] = found[1]
        return stored if len(stored.tiers) == len(wanted) else None

    def restore_stored(self, stored: StoredCells, prompts: Context, slot: int) -> None:
        """Restores `stored` (from stored_cells), moved into place and in position order, into the empty stream `slot`.

        Raises:
            StateBlobError: the cells cannot be joined (they overlap), or llama.cpp's EngineError: it refused them.
        """
        try:
            view = move_together(prompts, stored.blobs, stored.shifts, self.rope, prompts.n_stream,
                                 self._moved_buffer, seq=slot, empty=slot)
        except BufferError:  # a view of the last restore outlived it (a traceback holds one): start afresh
            self._moved_buffer = bytearray()
            view = move_together(prompts, stored.blobs, stored.shifts, self.rope, prompts.n_stream,
                                 self._moved_buffer, seq=slot, empty=slot)
        try:
            ops.order_in_place(view)  # encodings join in schema order; an encoding read out of the library in slot order
            prompts.state_set(slot, view)
        finally:
            view.release()

    def precompute(self, layout: Layout, key: str, workspace: Workspace,
                   on_computed: Callable[[int], None] | None = None) -> bool:
        """Computes encoding `key` at its home in `workspace` and stores it; returns False when it leaves it to `ensure`.

        Touches nothing but `workspace` until the blobs are stored, so its caller may let other
        work use the context between two batches (PromptCache._encode gives way to running
        prompts); `ensure` then restores the encoding from the RAM tier. Left to `ensure`:
        an encoding already resident or stored, a scaffold or chain link (computed against
        cells in the library), and a model whose cells cannot be moved (computed in place).
        """
        if self.store is None or not self.at_home or key.startswith(SCAFFOLD_PREFIX):
            return False
        if self.resident.contains(self.resident_key_of(layout, key)):
            return False
        store_key = self.key_of(layout, key)
        segments = home_segments(layout, key, self.mode)
        # Existence only: `ensure` reads and checks the entry when it restores it (a damaged one is then computed).
        if any(segment.after is not None for segment in segments) or self.cells.contains(store_key):
            return False
        runs, shift = encoding_runs(layout, key, self.mode), self.shift_of(layout, key)
        blobs = [blob for segment in segments for blob in workspace.compute(segment, self.ctx.n_stream, on_computed)]
        self.encoded += 1
        self._save_blobs(store_key, blobs, runs, shift)
        return True

    def _ensure_one(self, layout: Layout, key: str, keep: set,
                    on_computed: Callable[[str, int], None] | None = None) -> Tier:
        store_key = self.key_of(layout, key)
        resident_key = self.resident_key_of(layout, key)
        if self.resident.contains(resident_key):
            self.resident.touch(resident_key)
            return Tier.CONTEXT
        runs = encoding_runs(layout, key, self.mode)
        shift = self.shift_of(layout, key)
        stored = self._lookup(layout, key, store_key, runs, shift)
        if stored is not None and self._restore_or_forget(resident_key, store_key, stored[0], runs, shift, keep):
            return stored[1]
        keep = keep | self._make_neighbours_resident(layout, key, keep)
        self._make_room(encode_cells(layout, key, self.mode), keep)
        library = self._place(resident_key, runs, keep)
        notify = None if on_computed is None else lambda n: on_computed(key, n)
        try:
            if shift:
                blobs = self.encoder.encode_at_home(layout, key, shift, library, notify)
            else:
                self.encoder.encode(layout, key, library, lambda other: self.sequence_of(layout, other), notify)
            self.encoded += 1
        except Exception:
            self._drop(resident_key)
            raise
        if not shift:
            blobs = self._states_of(library, runs)
        self._save_blobs(store_key, blobs, runs, shift)
        return Tier.ENCODED

    def _restore_or_forget(self, resident_key, store_key: StoreKey, blobs: list[bytes], runs: tuple[Run, ...],
                           shift: int, keep: set) -> bool:
        """Makes stored cells resident; returns False, and removes them from the store, when they cannot be restored."""
        self._make_room(sum(len(run.tokens) for run in runs), keep)
        library = self._place(resident_key, runs, keep)
        try:
            refusal = self._restore(blobs, runs, library, shift)
        except Exception:
            self._drop(resident_key)
            raise
        if refusal is None:
            return True
        self._drop(resident_key)
        self.cells.drop(store_key, f"they cannot be restored into this context: {refusal}")
        return False

    def _make_neighbours_resident(self, layout: Layout, key: str, keep: set) -> set:
        """Makes resident what encoding `key` is computed after (chain mode: preamble and chain); returns their keys.

        The chain is followed back to the first neighbour that is resident or stored
        (a stored state needs no neighbour to restore), then made resident from there on,
        so each link is computed after its own neighbour, exactly as when the whole
        schema is loaded in order.
        """
        neighbour = encoded_after(layout, key, self.mode)
        if neighbour is None:
            return set()
        needed = set()
        if layout.cached_runs(ROOT):  # every link shares the preamble's cells too
            self._ensure_one(layout, ROOT, keep)
            needed.add(self.resident_key_of(layout, ROOT))
        chain: list[str] = []
        while neighbour is not None and not self.resident.contains(self.resident_key_of(layout, neighbour)):
            chain.append(neighbour)
            if self.cells is not None and self.cells.contains(self.key_of(layout, neighbour)):
                break  # existence only: _ensure_one reads it (a damaged file then walks on from there)
            neighbour = encoded_after(layout, neighbour, self.mode)
        needed |= {self.resident_key_of(layout, name) for name in chain}
        if neighbour is not None:
            needed.add(self.resident_key_of(layout, neighbour))
        for name in reversed(chain):
            self._ensure_one(layout, name, keep | needed)
        return needed

    def evict(self, schema: str | None = None) -> int:
        """Frees the context cells of resident encodings (those one schema used, when given); returns cells freed.

        Their bytes stay in the byte tiers, so the next prompt restores instead of encoding.
        An encoding two schemas share is one set of cells: evicting either schema frees it.
        """
        before = self.resident.cells
        self.evictions += 1
        used = None if schema is None else self._used_by.pop(schema, set())
        for key in self.resident.keys():
            if used is None or key in used:
                self._drop(key)
        if schema is None:
            self._used_by.clear()
        return before - self.resident.cells

    def _drop(self, key) -> None:
        """Frees a resident encoding's cells (its library's and the pin's) and forgets it."""
        seq, intervals = self.resident.remove(key)
        for start, end in intervals:
            self.ctx.seq_rm(seq, start, end)
        if intervals:  # the whole span: a failed scaffold may have pinned cells between its runs
            self.encoder.pin_cells(self.resident, intervals[0][0], intervals[-1][1])

    def _lookup(self, layout: Layout, key: str, store_key: StoreKey, runs: tuple[Run, ...], shift: int
                ) -> tuple[list[bytes], Tier] | None:
        """Returns the stored blobs of encoding `key` (at its home, `shift` before `runs`) and their tier, or None.

        A damaged entry misses (CellStore drops it). A union member brings its siblings into RAM
        with it: prompts pick one member of a union per call, so the next prompt likely wants a
        sibling (paper §3.2.3), and reading them together turns later disk reads into RAM hits.
        """
        if self.cells is None or not runs:
            return None
        module = layout.modules.get(key)
        served = {}
        if module is not None and module.union is not None:
            served = self.store.prefetch([self.key_of(layout, m) for m in layout.unions[module.union].members])
        found = self.cells.get_blobs(store_key, (runs[0].start - shift, runs[-1].end - shift),
                                     sum(len(run.tokens) for run in runs), whole_windows=True)
        if found is not None and served.get(store_key):
            return found[0], Tier(served[store_key])  # where the prefetch found it, not the RAM it brought it to
        return found

    def _place(self, key: StoreKey, runs: tuple[Run, ...], keep: set) -> int:
        """Returns the library sequence for `key`'s runs, evicting least recently used encodings to free one.

        Modules that share positions (union members, a folded schema's modules) each need a
        sequence of their own, and a context has a fixed number of them.
        """
        intervals = tuple((run.start, run.end) for run in runs)
        for victim in self.resident.least_recent():
            if self.resident.fits(intervals):
                break
            if victim not in keep:
                self._drop(victim)
        return self.resident.put(key, intervals)

    def _make_room(self, cells: int, keep: set) -> None:
        """Evicts least recently used encodings (not in `keep`) until `cells` KV cells are free."""
        for victim in self.resident.least_recent():
            if self.ctx.n_ctx - self.resident.cells >= cells:
                return
            if victim not in keep:
                self._drop(victim)
        if self.ctx.n_ctx - self.resident.cells < cells:
            raise ContextOverflowError(
                f"this prompt needs {cells} free KV cells beside its modules, but only "
                f"{self.ctx.n_ctx - self.resident.cells} of {self.ctx.n_ctx} are free after evicting every "
                "module it does not use; raise n_ctx or import fewer modules")

    # --- bytes in and out -----------------------------------------------------

    def _states_of(self, library: int, runs: tuple[Run, ...]) -> list[bytes]:
        """Returns the state blobs of the encoding's cells in `library`, one per whole-state span."""
        if self.cells is None or not runs:
            return []
        return [self._state_of(library, runs, a, b) for a, b in self._save_spans(runs)]

    def resident_cells(self, layout: Layout, key: str, library: int) -> bytes:
        """Returns one state blob of encoding `key`'s cells in `library`, at `layout`'s positions."""
        runs = encoding_runs(layout, key, self.mode)
        return self._state_of(library, runs, runs[0].start, runs[-1].end)

    def _save_blobs(self, store_key: StoreKey, blobs: list, runs: tuple[Run, ...], shift: int) -> None:
        """Writes an encoding's blobs, holding the cells of `runs` at their home (`shift` before), to every byte tier."""
        if self.cells is None or not runs:
            return
        self.cells.put_blobs(store_key, blobs, sum(len(r.tokens) for r in runs),
                             (runs[0].start - shift, runs[-1].end - shift))

    def _save_spans(self, runs: tuple[Run, ...]) -> list[tuple[int, int]]:
        """Returns the position spans to save one blob each, so that every blob holds its cells whole."""
        spans = self.ctx.whole_state_spans(runs[0].start, runs[-1].end)
        return [(a, b) for a, b in spans if any(run.start < b and a < run.end for run in runs)]

    def _state_of(self, library: int, runs: tuple[Run, ...], start: int, end: int) -> bytes:
        """Returns the state bytes of the encoding's cells in positions [start, end)."""
        try:
            for run in runs:
                if run.start < end and start < run.end:
                    self.ctx.seq_cp(library, self.roles.scratch, max(run.start, start), min(run.end, end))
            return self.ctx.state_get(self.roles.scratch)
        finally:
            self.ctx.seq_rm(self.roles.scratch)

    def _restore(self, blobs: list[bytes], runs: tuple[Run, ...], library: int, shift: int = 0) -> str | None:
        """Loads checked blobs (CellStore.get_blobs) into `library` (and the pin); returns why not when they cannot be.

        The blobs hold the cells at their home, `shift` positions before `runs`; they are moved into place.
        """
        infos = [ops.scan(blob) for blob in blobs]
        try:
            for blob, info in zip(blobs, infos):
                # Moved into one reused buffer and placed at once: a fresh copy per blob costs more to map than to move.
                moved = move(self.ctx, blob, shift, self.rope, seq=self.roles.scratch, empty=self.roles.hold,
                             out=self._moved_buffer)
                try:
                    self.encoder.place(moved, info.pos_min + shift, info.pos_max + 1 + shift, library)
                finally:
                    if isinstance(moved, memoryview):
                        moved.release()  # the buffer is resized by the next move
        except (StateBlobError, EngineError) as exc:
            for run in runs:  # the parts restored before the refusal
                self.ctx.seq_rm(library, run.start, run.end)
            self.encoder.pin_cells(self.resident, runs[0].start, runs[-1].end)
            if isinstance(exc, StateBlobError):
                return f"its cells cannot be moved into place ({exc})"
            return f"llama.cpp refused it ({exc}; saved with other settings, e.g. flash attention on/off?)"
        return None
