"""Executes a Plan: builds a prompt's KV cache in its sequence from shared module cells."""

from __future__ import annotations

from typing import Callable

from pc_cpu.engine.cells.relocate import shift_live
from pc_cpu.engine.llama.context import Context
from pc_cpu.errors import EngineError
from pc_cpu.pml.plan import CopyCells, DecodeTokens, Plan


def assemble(ctx: Context, plan: Plan, seq: int, library_of: Callable[[str], int], *, logits: bool = True,
             place_moved: Callable[[CopyCells, int], None] | None = None) -> None:
    """Fills the empty sequence `seq` with the plan's cells; the last op's logits are then ready (if `logits`).

    `library_of` maps an encoding name (a module, or "scaffold:<name>") to the sequence holding it.
    Cells the plan moves (CopyCells.moved) are placed by `place_moved(op, seq)` (a private, moved
    copy: pc_cpu.engine.cells.relocate), the others shared where they were encoded.
    """
    ctx.seq_rm(seq)
    last = len(plan.ops) - 1
    for i, op in enumerate(plan.ops):
        if isinstance(op, CopyCells) and op.moved:
            if place_moved is None:
                raise EngineError(f"module {op.module!r} is moved by the plan but no relocation was given")
            place_moved(op, seq)
        elif isinstance(op, CopyCells):
            ctx.seq_cp(library_of(op.encoding), seq, op.start, op.end)
        else:
            decode_at(ctx, seq, op, want_logits=logits and i == last)


def decode_at(ctx: Context, seq: int, op: DecodeTokens, *, want_logits: bool) -> None:
    """Computes op.tokens at positions [op.start, op.end) of `seq`.

    llama.cpp only accepts a batch that continues a sequence's last position. When
    the plan leaves a gap before op.start (an argument shorter than its param, a
    module left out before a param), the tokens are computed right after the last
    cell and then moved to their slot; the move re-rotates K, so the cells end up
    exactly where the layout puts them.
    """
    next_free = ctx.seq_pos_max(seq) + 1
    if next_free == 0 or next_free == op.start:
        ctx.decode(op.tokens, range(op.start, op.end), seq, logits_last=want_logits)
        return
    if next_free > op.start:
        raise EngineError(f"plan goes backwards at {op.what}: position {op.start} but the sequence "
                          f"already reaches {next_free - 1}")
    ctx.decode(op.tokens, range(next_free, next_free + len(op.tokens)), seq, logits_last=want_logits)
    shift_live(ctx, seq, next_free, next_free + len(op.tokens), op.start - next_free)
