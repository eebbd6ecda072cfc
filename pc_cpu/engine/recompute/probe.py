"""Gives a prompt's early-layer K/V as a full prefill would compute them, at a small fraction of its cost.

CacheBlend-style selection (pc_cpu.engine.recompute.blend) needs, for every cached module
token, how far its cached K/V are from what the prompt's full prefill would have
computed. Those differences already show in the first layers, so the probe runs
the prompt through a copy of the model cut down to its first PROBE_LAYERS blocks
(a GGUF written once with the `gguf` package and kept in a cache directory):
about PROBE_LAYERS / n_layer of a full prefill's work.

Sliding-window models (Gemma 3) keep two KV caches, full-attention layers and
sliding-window ones, each listing its layers in model order. The probe's first
layers are the model's first layers, so the probe's last layer of a cache is the
same model layer as the cached state's layer at that index of that cache.
llama.cpp saves only the cells inside a sequence's window from a sliding-window
cache, so `layer_values` reads a long sequence span by span (Context.whole_state_spans).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from pc_cpu.engine.cells.assembler import assemble
from pc_cpu.engine.llama.context import Context, ContextConfig
from pc_cpu.engine.cells.relocate import apply_pending_shifts
from pc_cpu.engine.llama.model import Model
from pc_cpu.errors import EngineError
from pc_cpu.pml.plan import CopyCells, DecodeTokens, Plan
from pc_cpu.kvstate import ops
from pc_cpu.store.disk import cache_dir

PROBE_LAYERS = 2  # layer 0's K/V depend only on the token and its position; layer 1 is the first that differs
_PROBE_SEQ, _SHIFT_SEQ = 0, 1


def probe_dir(environ=None) -> Path:
    """Returns where cut-down models are kept: $PC_CPU_PROBE_DIR, else <user cache dir>/pc_cpu/probe."""
    return cache_dir("probe", "PC_CPU_PROBE_DIR", environ)


def truncated_model(model: Model, n_layers: int, directory: Path) -> Path:
    """Returns the path of `model` cut down to its first `n_layers` blocks, writing it on first use."""
    dest = directory / f"{model.info.fingerprint[:16]}-{n_layers}layers.gguf"
    if dest.is_file():
        return dest
    import gguf  # only needed the first time a model is cut down

    reader = gguf.GGUFReader(str(model.path))
    arch = reader.fields["general.architecture"].contents()
    count_key = f"{arch}.block_count"
    n_block = int(reader.fields[count_key].contents())
    if not 1 <= n_layers < n_block:
        raise EngineError(f"cannot cut {model.path.name} ({n_block} blocks) down to {n_layers}")
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, suffix=".part")
    os.close(fd)
    try:
        writer = gguf.GGUFWriter(tmp, arch)
        for field in reader.fields.values():
            if field.name == "general.architecture" or field.name.startswith("GGUF."):
                continue
            value = field.contents()
            kind = field.types[0]
            sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
            if field.name == count_key:
                value = n_layers
            elif kind == gguf.GGUFValueType.ARRAY and field.name.startswith(arch + ".") and len(value) == n_block:
                value = value[:n_layers]  # per-layer hyperparameters
            writer.add_key_value(field.name, value, kind, sub_type=sub)
        kept = [t for t in reader.tensors if not _block_at_or_after(t.name, n_layers)]
        for t in kept:
            writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for t in kept:
            writer.write_tensor_data(t.data)
        writer.close()
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return dest


def _block_at_or_after(name: str, n_layers: int) -> bool:
    parts = name.split(".")
    return parts[0] == "blk" and int(parts[1]) >= n_layers


class Probe:
    """A cut-down copy of the model in its own small context; `kv(plan)` runs a prompt through it."""

    def __init__(self, model: Model, *, n_ctx: int, threads: int, flash_attn: bool | None,
                 directory: Path | None = None):
        # A model no deeper than the probe is its own probe.
        path = (model.path if model.info.n_layer <= PROBE_LAYERS
                else truncated_model(model, PROBE_LAYERS, directory or probe_dir()))
        self.model = Model(path)
        # (KV cache, index in it) of the layer kv() returns; fixed by the model, found by the first kv().
        self.layer: tuple[int, int] | None = None
        try:
            self.ctx = Context(self.model, ContextConfig(n_ctx=n_ctx, n_seq_max=2, threads=threads,
                                                         flash_attn=flash_attn))
        except Exception:
            self.model.close()
            raise

    def close(self) -> None:
        self.ctx.close()
        self.model.close()

    def kv(self, plan: Plan) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Returns (positions, K, V) of the probe's last layer after a full prefill of `plan`'s tokens.

        The tokens go where the plan puts them (gaps included), so K is comparable
        with the cached cells position by position. `self.layer` says where that
        layer is in a state blob of the full model.
        """
        decodes = tuple(DecodeTokens(op.start, op.tokens, f"module {op.module}") if isinstance(op, CopyCells) else op
                        for op in plan.ops)
        try:
            assemble(self.ctx, Plan(plan.schema, decodes, plan.modules), _PROBE_SEQ, lambda key: None)
            apply_pending_shifts(self.ctx, _SHIFT_SEQ)
            return self._last_layer()
        finally:
            self.ctx.seq_rm(_PROBE_SEQ)

    def kv_of_tokens(self, tokens: tuple[int, ...] | list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Returns (positions, K, V) of the probe's last layer after a full prefill of `tokens` at 0..n-1.

        A question over documents (pc_cpu.engine.prompts.document_cells) has no plan: its tokens sit back to back.
        """
        try:
            self.ctx.decode(tokens, range(len(tokens)), _PROBE_SEQ, logits_last=False)
            return self._last_layer()
        finally:
            self.ctx.seq_rm(_PROBE_SEQ)

    def _last_layer(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Returns the probe sequence's (positions, K, V) at the probe's last layer, finding that layer once."""
        if self.layer is None:
            counts = ops.section_layers(self.ctx.state_get(_PROBE_SEQ))
            section = max(i for i, n in enumerate(counts) if n)  # any cache with probe layers does
            self.layer = (section, counts[section] - 1)
        return layer_values(self.ctx, _PROBE_SEQ, self.layer, _SHIFT_SEQ)


def layer_values(ctx: Context, seq: int, layer: tuple[int, int], scratch: int) -> tuple[np.ndarray, ...]:
    """Returns (positions, K, V) of every cell of `seq` at `layer` = (KV cache, index in it).

    A sliding-window model's state leaves out the cells more than a window behind
    the sequence's end, so a long sequence is read span by span
    (Context.whole_state_spans), each shared into the empty `scratch` sequence.
    """
    section, index = layer
    spans = ctx.whole_state_spans(ctx.seq_pos_min(seq), ctx.seq_pos_max(seq) + 1)
    if len(spans) <= 1:
        return ops.layer_kv(ctx.state_get(seq), index, section=section)
    parts = []
    for start, end in spans:
        try:
            ctx.seq_cp(seq, scratch, start, end)
            parts.append(ops.layer_kv(ctx.state_get(scratch), index, section=section))
        finally:
            ctx.seq_rm(scratch)
    return tuple(np.concatenate(column) for column in zip(*parts))
