"""Recomputes the cached tokens whose K/V deviate most from a full prefill (CacheBlend-style selection).

A prompt assembled from modules encoded apart has cells that never attended to
the other modules. With `recompute="select:R"` the engine, after sharing the
module cells in and before computing the prompt's own text:

1. runs the prompt through the probe (the model's first layers only) to get
   the K/V a full prefill would have at layer 1, and reads the cached cells'
   layer-1 K/V from the prompt's sequence;
2. picks the R share of module tokens with the largest squared K+V difference;
3. recomputes them all in one batch. llama.cpp accepts a batch for a sequence
   only when it continues that sequence's last position, so each run of
   adjacent chosen tokens gets its own idle sequence holding the prompt's
   cells before it (seq_cp shares them, no copy); its fresh cells then replace
   the cached ones in the prompt's sequence.

Chosen tokens see the cached (not yet refreshed) cells of other runs before
them within one batch; a later batch sees the earlier batches' fresh cells.
"select:R@module" makes one batch per module, in position order, so every
chosen token sees the fresh cells of the modules before its own, as the head
and tail policies do.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from pc_cpu.engine.cells.assembler import assemble, decode_at
from pc_cpu.engine.llama.context import Context
from pc_cpu.engine.cells.relocate import apply_pending_shifts
from pc_cpu.engine.recompute.probe import Probe, layer_values
from pc_cpu.engine.recompute.recompute_pass import decode_runs
from pc_cpu.errors import EngineError, PromptCacheError, StateBlobError
from pc_cpu.pml.layout import ROOT
from pc_cpu.pml.plan import CopyCells, DecodeTokens, Plan
from pc_cpu.pml.recompute import contiguous_runs

Run = tuple[int, int]  # positions [start, end)


class LazyBlender:
    """Owns the Blender of one context: loads the probe model on first use, hands the Blender out, closes it.

    The probe is a second model file and context (pc_cpu.engine.recompute.probe), so it is made only
    when a prompt first asks for `select:`. Call `get` holding the context's lock.
    """

    def __init__(self, ctx: Context, spare_seqs: Callable[[], list[int]], scratch: int):
        self.ctx = ctx
        self.spare_seqs = spare_seqs
        self.scratch = scratch
        self.loaded: Blender | None = None  # None until the first `get`

    def get(self) -> "Blender":
        """Returns the Blender, loading the probe model on first use."""
        if self.loaded is None:
            ctx = self.ctx
            probe = Probe(ctx.model, n_ctx=ctx.n_ctx, threads=ctx.threads, flash_attn=ctx.config.flash_attn)
            self.loaded = Blender(ctx, probe, self.spare_seqs, self.scratch)
        return self.loaded

    def close(self) -> None:
        """Frees the probe model, if it was loaded."""
        if self.loaded is not None:
            self.loaded.close()
            self.loaded = None


class Blender:
    """Selects and recomputes deviating cached tokens of prompts in one context."""

    def __init__(self, ctx: Context, probe: Probe, spare_seqs: Callable[[], list[int]], scratch: int):
        self.ctx = ctx
        self.probe = probe
        self.spare_seqs = spare_seqs  # sequences holding no cells right now, ours until we return
        self.scratch = scratch
        self.last_selected: tuple[int, ...] = ()  # positions recomputed by the last prompt (for tests, tools)

    def close(self) -> None:
        self.probe.close()

    def assemble(self, plan: Plan, seq: int, library_of: Callable[[str], int]) -> None:
        """Fills `seq` like assembler.assemble, recomputing plan.selected_tokens deviating cells on the way."""
        cut = _after_last_copy(plan)
        head = Plan(plan.schema, plan.ops[:cut], plan.modules)
        assemble(self.ctx, head, seq, library_of)
        self.last_selected = ()
        if plan.selected_tokens and cut:
            self.last_selected = self.refresh(head, seq, plan.selected_tokens, by_module=plan.select_by_module)
        last = len(plan.ops) - 1
        for i in range(cut, len(plan.ops)):
            decode_at(self.ctx, seq, plan.ops[i], want_logits=i == last)

    def refresh(self, head: Plan, seq: int, count: int, *, by_module: bool = False) -> tuple[int, ...]:
        """Recomputes the `count` module cells of `seq` that deviate most; returns their positions.

        by_module: refresh one module's cells at a time, in position order, so each module's
        chosen tokens attend to the fresh cells of the modules before it.
        """
        if any(isinstance(op, DecodeTokens) for op in head.ops):
            apply_pending_shifts(self.ctx, self.scratch)  # cached K must be rotated to its final place
        try:
            full = self.probe.kv(head)
            cached = layer_values(self.ctx, seq, self.probe.layer, self.scratch)
        except StateBlobError as exc:
            raise PromptCacheError(f"recompute 'select:…' cannot read this model's KV cache ({exc}); "
                                   "use head:K, tail:K or a fraction instead") from None
        candidates = np.array([p for op in head.ops if isinstance(op, CopyCells) and op.module != ROOT
                               for p in range(op.start, op.end)], dtype=np.int64)
        missing = np.setdiff1d(candidates, cached[0])
        if missing.size:  # the pin (encoder.pin_cells) keeps them; scores of absent cells would be garbage
            raise EngineError(f"recompute 'select:…': {missing.size} cached cells from position {int(missing[0])} "
                              "are missing from the KV cache; please report this")
        scores = deviation(cached, full, candidates)
        chosen = np.sort(candidates[np.argsort(-scores, kind="stable")[:count]])
        present = set(cached[0].tolist())
        runs = [r for r in contiguous_runs(chosen.tolist()) if r[0] == 0 or r[0] - 1 in present]
        token_at = {p: t for p, t in zip(head.positions, head.tokens)}
        spare = self.spare_seqs()
        for group in (runs_by_module(runs, head) if by_module else [runs]):
            recompute_runs(self.ctx, seq, group, token_at, spare)
        return tuple(p for a, b in runs for p in range(a, b))


def deviation(cached, full, positions: np.ndarray) -> np.ndarray:
    """Returns, for each position, the squared distance between cached and full-prefill K and V."""
    def by_position(kv):
        pos, k, v = kv
        order = np.argsort(pos)
        index = np.searchsorted(pos[order], positions)
        if index.max(initial=0) >= len(pos) or not np.array_equal(pos[order][index], positions):
            raise PromptCacheError("recompute 'select:…': the probe and the prompt disagree on positions")
        rows = order[index]
        return k[rows], v[rows]

    ck, cv = by_position(cached)
    fk, fv = by_position(full)
    return ((ck - fk) ** 2).sum(axis=1) + ((cv - fv) ** 2).sum(axis=1)


def runs_by_module(runs: list[Run], plan: Plan) -> list[list[Run]]:
    """Returns the runs cut at the plan's shared module stretches, one list per stretch holding any, in order."""
    groups = []
    for op in plan.ops:
        if isinstance(op, CopyCells) and op.module != ROOT:
            group = [(max(a, op.start), min(b, op.end)) for a, b in runs if a < op.end and b > op.start]
            if group:
                groups.append(group)
    return groups


def batches(runs: list[Run], seqs: int, n_batch: int) -> list[list[Run]]:
    """Returns the runs packed into batches of at most `seqs` runs and `n_batch` tokens, in position order.

    A run longer than what is left of a batch is cut; its rest starts the next batch, so
    it continues from cells the previous batch has already refreshed.
    """
    out: list[list[Run]] = [[]]
    room = n_batch
    for start, end in runs:
        while start < end:
            if len(out[-1]) == seqs or room == 0:
                out.append([])
                room = n_batch
            take = min(end - start, room)
            out[-1].append((start, start + take))
            room -= take
            start += take
    return [b for b in out if b]


def recompute_runs(ctx: Context, seq: int, runs: list[Run], token_at: dict[int, int], spare: list[int]) -> None:
    """Computes the tokens of `runs` again in `seq`, replacing their cells; `spare` are empty sequences."""
    if not runs:
        return
    if not spare:
        raise PromptCacheError("recompute 'select:…' needs an idle sequence; raise n_seq_max or unload a schema")
    for batch in batches(runs, len(spare), ctx.n_batch):
        decode_runs(ctx, seq, batch, spare, token_at)


def _after_last_copy(plan: Plan) -> int:
    """Returns the index of the first op after the plan's last CopyCells (0 when it shares nothing)."""
    copies = [i for i, op in enumerate(plan.ops) if isinstance(op, CopyCells)]
    return copies[-1] + 1 if copies else 0
