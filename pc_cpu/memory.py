"""Gives the defaults that size a PromptCache's memory, and where its memory goes, in bytes (docs/memory.md).

A PromptCache's resident memory is a few large allocations, each fixed when it opens or
bounded by a budget; nothing else grows with the hours it runs (bench/soak.py holds it to this):

- the model's weights: the GGUF file, mapped and read once it is loaded;
- KV caches: the library context's n_ctx cells, and the prompt context's (parallel + 2) streams
  of n_ctx cells each (a stream per prompt slot, the encoders' workspace, add_document's stream).
  llama.cpp zeroes them when the contexts open, so they are resident from the start;
- llama.cpp's compute and output buffers, one set per context: sized for a full batch over a
  full stream, their pages are touched the first time a prompt that long runs;
- state buffers kept for reuse: up to one full stream's state each in the two contexts, in the
  module cache and in the two document encoders, plus two in flight while a prompt is moved;
- the RAM tier, up to its budget;
- the interpreter and its libraries (Python, numpy, llama.cpp, and the server's), measured when
  the process starts.

Freed blobs of cells go back to the OS rather than to malloc's arenas (pc_cpu.allocator).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from pc_cpu.store.ram import RamStore

if TYPE_CHECKING:  # names for the signature only: this module sizes a cache, it opens nothing
    from pc_cpu.engine.llama.context import Context
    from pc_cpu.engine.llama.model import Model
    from pc_cpu.store.tiers import TieredStore

DEFAULT_PARALLEL = 4  # prompt slots; each holds a stream of n_ctx cells
DEFAULT_RAM_BYTES = 1 << 30  # the RAM tier: a laptop's share; the disk tier and the OS page cache keep the rest
DEFAULT_DISK_BYTES = 16 << 30
STATE_BUFFERS = 7  # full-stream states held at most outside llama.cpp (see the module docstring)


@dataclass(frozen=True)
class MemoryUse:
    """A PromptCache's large allocations, in bytes (PromptCache.memory); `bound` is what its resident set stays under."""

    weights: int  # the GGUF file
    kv: int  # both contexts' KV caches: (parallel + 3) x n_ctx cells
    compute: int  # both contexts' compute and output buffers, as llama.cpp reports them
    state_buffers: int  # STATE_BUFFERS full-stream states
    ram_tier: int  # the RAM tier's budget
    kv_cell: int  # bytes of one cell in one KV cache: K and V of every layer
    streams: int  # KV streams of n_ctx cells: the library's, and the prompt context's

    @property
    def bound(self) -> int:
        """Returns the bytes these allocations reach at most; add the interpreter's (process start) for the process."""
        return self.weights + self.kv + self.compute + self.state_buffers + self.ram_tier

    def to_dict(self) -> dict:
        """Returns the fields and the bound as plain JSON-ready values."""
        return {**asdict(self), "bound": self.bound}


def memory_use(model: "Model", library: "Context", prompts: "Context", store: "TieredStore") -> MemoryUse:
    """Returns a PromptCache's large allocations: llama.cpp's buffer sizes as it reported them when the contexts opened."""
    contexts = (library, prompts)
    kv = sum(c.buffers.kv for c in contexts)
    streams = 1 + prompts.n_stream
    kv_cell = kv // (streams * library.n_ctx)
    ram = next((tier.budget_bytes for tier in store.tiers if isinstance(tier, RamStore)), 0)
    return MemoryUse(weights=model.path.stat().st_size, kv=kv,
                     compute=sum(c.buffers.compute + c.buffers.output for c in contexts),
                     state_buffers=STATE_BUFFERS * kv_cell * library.n_ctx, ram_tier=ram, kv_cell=kv_cell,
                     streams=streams)
