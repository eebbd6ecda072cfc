"""Gives a llama.cpp sampler chain: greedy, or temperature with top-k / top-p and a seed."""

from __future__ import annotations

import math
from dataclasses import dataclass

import llama_cpp

from pc_cpu.errors import PromptCacheError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    seed: int = 0

    def validate(self) -> None:
        """Returns None when every option is in range; raises PromptCacheError naming the first that is not.

        NaN and infinity are refused: NaN passes every `<` test, and llama.cpp would sample from garbage.
        """
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise PromptCacheError(f"temperature={self.temperature}: must be a finite number >= 0 (0 is greedy)")
        if self.top_k < 0:
            raise PromptCacheError(f"top_k={self.top_k}: must be >= 0 (0 turns it off)")
        if not (math.isfinite(self.top_p) and 0 < self.top_p <= 1):
            raise PromptCacheError(f"top_p={self.top_p}: must be a number in (0, 1] (1 turns it off)")


class Sampler:
    """Owns one llama_sampler chain."""

    def __init__(self, params: SamplingParams):
        params.validate()
        self._chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        if params.temperature == 0:
            self._add(llama_cpp.llama_sampler_init_greedy())
            return
        if params.top_k > 0:
            self._add(llama_cpp.llama_sampler_init_top_k(params.top_k))
        if params.top_p < 1:
            self._add(llama_cpp.llama_sampler_init_top_p(params.top_p, 1))
        self._add(llama_cpp.llama_sampler_init_temp(params.temperature))
        self._add(llama_cpp.llama_sampler_init_dist(params.seed & 0xFFFFFFFF))

    def _add(self, sampler) -> None:
        # The chain takes ownership of `sampler`: freeing the chain frees it.
        llama_cpp.llama_sampler_chain_add(self._chain, sampler)

    def sample(self, ctx_handle, index: int = -1) -> int:
        """Returns the next token from output `index` of the last decode (and records it in the chain)."""
        return int(llama_cpp.llama_sampler_sample(self._chain, ctx_handle, index))

    def close(self) -> None:
        if getattr(self, "_chain", None):
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None

    def __del__(self) -> None:
        self.close()
