"""The RoPE facts that moving saved cells needs: which pairs of a K head turn, and by what angle.

llama.cpp rotates each K head by its cell's position when it computes the cell; moving a cell
by delta positions (pc_cpu.kvstate.ops.relocate) turns its K again by the angle of delta. These
are the parameters of that turn, as the C library takes them (pc_rope_params, native/pc_state.h).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class RopeMode(IntEnum):
    """RoPE variants, with llama.cpp's values (LLAMA_ROPE_TYPE_NORM / _NEOX)."""

    NORMAL = 0  # rotates pairs (2i, 2i+1) of each head
    NEOX = 2    # rotates pairs (i, i + n_rot/2) of each head


@dataclass(frozen=True)
class RopeParams:
    """The RoPE of a model's K cache (YaRN and frequency factors are not supported).

    Pair i of a head turns by ``pos * freq_base**(-2i/n_rot) * freq_scale``.
    """

    n_rot: int        # rotated dimensions per head: even, 0 < n_rot <= head_dim
    mode: RopeMode
    n_head_kv: int    # K heads per cell
    head_dim: int     # elements per K head (n_embd_head_k)
    freq_base: float
    freq_scale: float = 1.0
