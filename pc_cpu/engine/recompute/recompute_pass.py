"""Recomputes a document prompt's runs in one pass: every run in the same llama_decode, in the library context.

A recompute policy (head:K, tail:K, 10%, relevant:K) names runs of document positions to
compute again. llama.cpp decodes a batch for a sequence only at the position after its last
cell, with that sequence's positions consecutive, so one sequence cannot take several runs
at once. The prompt context cannot help: its sequences are streams of their own, and a
stream's cells cannot be shared with another. The library context can: its KV cache is
unified, and there `seq_cp(src, dst, 0, start)` shares a range of cells without copying.
So (DESIGN.md section 2):

1. the prompt's cached cells [0, tail_start), already moved to their prompt positions, are
   restored into its slot's staging sequence (the one a schema prompt is assembled in);
2. each run borrows an idle library sequence that shares the staging cells before it;
3. every run's tokens are decoded together, each with its run's sequence (one llama_decode
   per n_batch tokens: Context.decode cuts the batch, a run cut there continues in the next);
4. in the staging sequence the cached cells at the run positions are dropped and each run's
   new cells shared in; the borrowed sequences are emptied;
5. the staging sequence is moved into the prompt's stream, sorted by position
   (streams.move_to_stream), where the question is computed as before.

No state is read back per run and nothing is cut by round trips: one restore, one read.

What a recomputed token sees: the cached cells before it, the cached (not the recomputed)
cells of earlier runs included. Each run is thus computed as if it were the only one: EPIC's
and LegoLink's approximation, where computing the runs one after another would let a run see
the earlier runs' new cells. When the idle sequences are fewer than the runs, the runs go in
groups of consecutive runs, one decode per group, last group first: a group's new cells then
replace cached ones only after every run before them has been computed, so what a run sees
does not depend on the budget.

Bits: attention sums a sequence's cells in KV-slot order, and in the library they sit where
its free cells were (between resident modules' cells when a schema is loaded). With flash
attention, only their order counts: a library that holds no module (a documents-only cache)
gives the same layout every time, so the same bits; with modules resident, the recomputed cells
can differ in their last bits with the library's history, as a schema prompt's recomputed cells
do. Without it (pc_cpu's default on models without a sliding window,
pc_cpu.engine.llama.context.default_flash_attn), the slots themselves count, and a run's new cells sit
after every staging cell where a stream would put them right after the cells before them: each
run's cells then differ from the run computed alone in their last bits (at most 4.3e-6 of a K
row's largest value on F32 weights, tests/engine/test_recompute_pass.py). A prompt with one run does not come here
(pc_cpu.engine.prompts.document_cells takes it through its own stream, exactly as before: `recompute="all"`
stays the full prefill, bit for bit).

Borrowed sequences are the library's idle ones (ResidentTier.idle_seqs, as the select: blender
borrows): they hold no module. Each is checked in range and empty before use, and every one,
the staging sequence too, is emptied in a `finally`, so a failure leaves no cell behind. When
none is idle, or the library has no room for the prompt's cells, `recompute_in_library`
returns False having changed nothing, and the caller recomputes in its own stream.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from pc_cpu.engine.llama.context import Context
from pc_cpu.engine.cells.streams import move_to_stream
from pc_cpu.errors import ContextOverflowError, EngineError

log = logging.getLogger(__name__)

Run = tuple[int, int]  # positions [start, end)


@dataclass(frozen=True)
class LibraryRoom:
    """What a DocumentEncoder may borrow from its PromptCache's library context, under the context lock."""

    ctx: Context  # the library context (unified KV cache)
    staging: tuple[int, ...]  # the prompt slots: slot s assembles in library sequence s (SequenceRoles.slots)
    idle: Callable[[], list[int]]  # library sequences holding no module right now (ResidentTier.idle_seqs)
    # Most runs decoded in one batch (None: as many as idle sequences). 1 on sliding-window models: there,
    # runs of several sequences decoded together got other cells than each run alone (Gemma 3,
    # tests/engine/test_recompute_pass.py; the cause in llama.cpp's SWA masking was not found), one at a
    # time they match.
    together: int | None = None

    def borrow(self, staging: int) -> list[int]:
        """Returns the idle sequences that are valid, empty and not `staging`, each once, in order."""
        ctx, seen, out = self.ctx, {staging}, []
        for seq in self.idle():
            if isinstance(seq, int) and 0 <= seq < ctx.n_seq_max and seq not in seen and ctx.seq_pos_max(seq) < 0:
                seen.add(seq)
                out.append(seq)
        return out


def groups(runs: Sequence[Run], seqs: int) -> list[list[Run]]:
    """Returns the runs (sorted, disjoint) in groups of at most `seqs` consecutive runs, in position order."""
    if seqs < 1:
        raise EngineError("recompute needs at least one idle sequence")
    return [list(runs[i:i + seqs]) for i in range(0, len(runs), seqs)]


def recompute_in_library(room: LibraryRoom, cached: bytes | bytearray | memoryview, runs: Sequence[Run],
                         tokens: Sequence[int], prompts: Context, slot: int) -> bool:
    """Fills the empty stream `slot` of `prompts` with `cached` (a one-stream blob), `runs` of `tokens` computed again.

    `cached` holds the prompt's cells before its tail, at their prompt positions, one per
    position from 0; `runs` are sorted, disjoint ranges inside them. Returns False, with
    nothing changed, when the library has no idle sequence or no room for the cells.
    """
    lib = room.ctx
    if slot not in room.staging:
        raise EngineError(f"prompt slot {slot} has no staging sequence in the library ({room.staging})")
    _check_runs(runs, len(tokens))
    spare = room.borrow(slot)
    if not spare:
        return False
    done = False
    lib.seq_rm(slot)
    try:
        try:
            lib.state_set(slot, cached)
        except EngineError as exc:  # no room: the library is full of resident modules
            log.info("one-pass recompute: the library has no room (%s); recomputing in the prompt's stream", exc)
            return False
        try:
            # Last group first: a group's new cells go into the staging sequence only once
            # every run before them has shared its cached cells (see the module docstring).
            for group in reversed(groups(runs, min(len(spare), room.together or len(spare)))):
                decode_runs(lib, slot, group, spare, tokens)
        except ContextOverflowError as exc:
            log.info("one-pass recompute: no free library cells (%s); recomputing in the prompt's stream", exc)
            return False
        move_to_stream(lib, slot, prompts, slot)
        done = True
        return True
    finally:
        for seq in spare:
            lib.seq_rm(seq)
        lib.seq_rm(slot)
        if not done:
            prompts.seq_rm(slot)


def decode_runs(ctx: Context, seq: int, group: Sequence[Run], spare: Sequence[int],
                token_at: Sequence[int] | Mapping[int, int]) -> None:
    """Computes the runs of `group` in one decode, one borrowed sequence each; their cells replace `seq`'s.

    Each run's sequence first shares the cells of `seq` before the run (seq_cp: no copy), so
    the run is computed after them; `token_at[p]` is the token at position p. The borrowed
    sequences are emptied whatever happens. Also the selection of pc_cpu.engine.recompute.blend.
    """
    batch_tokens: list[int] = []
    positions: list[int] = []
    seqs: list[int] = []
    for (start, end), borrowed in zip(group, spare):
        ctx.seq_cp(seq, borrowed, 0, start)  # the cells before the run: shared, not copied
        batch_tokens += [token_at[p] for p in range(start, end)]
        positions += range(start, end)
        seqs += [borrowed] * (end - start)
    try:
        ctx.decode(batch_tokens, positions, seqs, logits_last=False)
        for (start, end), borrowed in zip(group, spare):
            ctx.seq_rm(seq, start, end)
            ctx.seq_cp(borrowed, seq, start, end)
    finally:
        for borrowed in spare[:len(group)]:
            ctx.seq_rm(borrowed)


def _check_runs(runs: Sequence[Run], n: int) -> None:
    """Raises EngineError unless `runs` are non-empty, sorted, disjoint ranges of [0, n)."""
    last = 0
    for start, end in runs:
        if not last <= start < end <= n:
            raise EngineError(f"recompute runs must be sorted, disjoint and inside [0, {n}): got {list(runs)}")
        last = end
