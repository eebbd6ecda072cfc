"""Moves an assembled prompt into its own stream, in position order, where it is finished and generated.

Why: attention sums a sequence's cells in KV-slot order. In the library context
(one unified pool) a prompt's shared module cells sit wherever they were encoded
or restored, between other modules' cells, so the same tokens summed in another
order gave other logits (up to 0.6 apart on SmolLM2) and, at near-ties, other
answers depending on which tier had served a module and what else was resident.

So prompts run in a second context whose KV cache is not unified: every prompt
slot is a stream of its own, filled from slot 0. A prompt's shared cells are
assembled in the library context as before (sharing, parameters, recomputation),
then read out as one state blob, sorted by position and restored into the
prompt's empty stream. Its own text is then computed there, after them, and its
tokens generated there. The stream holds exactly the prompt's cells in position
order, as a fresh prefill of the same tokens would (the full prefill runs in the
same kind of stream), so:

- the same cells give the same answer whichever tier served them;
- a module that a full prefill would compute identically (a prefix) gives
  bit-identical logits, whatever else is resident;
- a prompt's decode attends to its own cells only, however large the library.

The library context keeps what prompts share; each stream holds one private copy
of what its prompt uses (copying 95 MB costs milliseconds).
"""

from __future__ import annotations

import struct
from dataclasses import replace
from typing import NamedTuple, Sequence

from pc_cpu.engine.llama.context import Context
from pc_cpu.pml.plan import CopyCells, DecodeTokens, Plan
from pc_cpu.kvstate import ops
from pc_cpu.kvstate.state_blob import STREAM_COUNT_OFFSET


class SplitPlan(NamedTuple):
    """A plan cut after its last shared cells: what the library context assembles, and what the stream computes."""

    staged: Plan  # the ops up to the last CopyCells: assembled where module cells can be shared
    tail: tuple[DecodeTokens, ...]  # the decodes after them (the prompt's own text): computed in its stream


def split_tail(plan: Plan) -> SplitPlan:
    """Returns the plan up to its last shared cells, and the decodes after them (the prompt's own text).

    A plan that shares nothing is all tail.
    """
    copies = [i for i, op in enumerate(plan.ops) if isinstance(op, CopyCells)]
    cut = copies[-1] + 1 if copies else 0
    staged = Plan(plan.schema, plan.ops[:cut], plan.modules, plan.select, plan.select_by_module)
    return SplitPlan(staged, tuple(plan.ops[cut:]))


def move_to_stream(library: Context, staging: int, prompts: Context, slot: int) -> None:
    """Moves the cells of `library`'s sequence `staging` into `prompts`' empty stream `slot`, sorted by position.

    Cells moved with seq_add must have had their K rotation applied first (apply_pending_shifts):
    a state read from llama.cpp holds K as it is. The staging sequence is emptied; the cells it
    shared stay with their libraries.
    """
    other_streams = 4 * (prompts.n_stream - 1)  # an empty stream is its cell count, 0
    try:
        view = library.state_get_reusing(staging, room_after=other_streams)
    finally:
        library.seq_rm(staging)
    prompts.seq_rm(slot)
    blob = view[:len(view) - other_streams]
    try:
        info = ops.scan(blob)
        ops.order_in_place(blob)  # in the reused buffer: a new one of this size costs more to map than the sort
        if info.n_section == 1 and info.n_stream == 1:
            # The common case, without a copy: the cells are all in the first stream, so only
            # the stream count changes; the empty streams follow (zeroed room).
            struct.pack_into("<I", view, STREAM_COUNT_OFFSET, prompts.n_stream)
            prompts.state_set(slot, view)
        else:
            prompts.state_set(slot, ops.restream(blob, prompts.n_stream))  # a copy
    finally:
        blob.release()
        view.release()


def full_prefill(prompts: Context, tokens: Sequence[int], slot: int, batch_starts: Sequence[int] = (), *,
                 calls: Sequence[tuple[int, int]] = ()) -> int:
    """Computes `tokens` at positions 0..n-1 of the empty stream `slot` (the baseline); returns n.

    calls: the llama_decode calls to make, [lo, hi) token indices in order (Plan.calls: those a
    cached prompt computed its cells in); a call starting before the stream's end first drops
    the cells from its start, which it computes again. None given: one call split at
    `batch_starts` (token indices where a new call starts). Each call is decoded in n_batch
    chunks from its start.
    """
    n = len(tokens)
    if not calls:
        edges = sorted({0, *batch_starts, n})
        calls = list(zip(edges, edges[1:]))
    prompts.seq_rm(slot)
    end = 0
    for i, (lo, hi) in enumerate(calls):
        if lo < end:
            prompts.seq_rm(slot, lo, -1)
        prompts.decode(tokens[lo:hi], range(lo, hi), slot, logits_last=i == len(calls) - 1)
        end = hi
    return n


def open_prompt_streams(library: Context, streams: int) -> Context:
    """Returns a context like `library` whose `streams` sequences each own a stream of library.n_ctx cells."""
    return Context(library.model, replace(library.config, n_ctx=library.n_ctx, n_seq_max=streams, kv_unified=False))
