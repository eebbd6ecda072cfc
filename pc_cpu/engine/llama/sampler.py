"""Gives a llama.cpp sampler chain: greedy, or temperature with top-k / top-p and a seed."""

from __future__ import annotations

import math
from dataclasses import dataclass

import llama_cpp

from pc_cpu.errors import PromptCacheError


TOP_K_MAX = 2**31 - 1  # llama_sampler_init_top_k takes an int32_t: ctypes would keep the low bits of more
SEED_MAX = 2**32 - 2  # a uint32_t, and 0xFFFFFFFF is LLAMA_DEFAULT_SEED, "pick a random seed"
TEMPERATURE_MAX = 3.4e38  # about FLT_MAX: llama.cpp takes a C float, and beyond it a temperature is infinity


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    seed: int = 0

    def validate(self) -> None:
        """Returns None when every option is in range; raises PromptCacheError naming the first that is not.

        NaN and infinity are refused: NaN passes every `<` test, and llama.cpp would sample from garbage.
        Integers are refused beyond the C types llama.cpp takes, which would silently keep their low bits.
        """
        if not (_is_number(self.temperature) and 0 <= self.temperature <= TEMPERATURE_MAX):
            raise PromptCacheError(f"temperature={self.temperature!r}: must be a finite number >= 0 and "
                                   f"<= {TEMPERATURE_MAX:g}, a C float (0 is greedy)")
        if not _is_integer_in(self.top_k, TOP_K_MAX):
            raise PromptCacheError(f"top_k={self.top_k!r}: must be an integer in 0..{TOP_K_MAX} (0 turns it off)")
        if not (_is_number(self.top_p) and 0 < self.top_p <= 1):
            raise PromptCacheError(f"top_p={self.top_p!r}: must be a number in (0, 1] (1 turns it off)")
        if not _is_integer_in(self.seed, SEED_MAX):
            raise PromptCacheError(f"seed={self.seed!r}: must be an integer in 0..{SEED_MAX} "
                                   f"({SEED_MAX + 1} is llama.cpp's 'random seed')")


def _is_number(value) -> bool:
    """Returns whether `value` is a finite int or float (not a bool, not NaN)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_integer_in(value, maximum: int) -> bool:
    """Returns whether `value` is an int (not a bool) in [0, maximum]."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= maximum


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
        self._add(llama_cpp.llama_sampler_init_dist(params.seed))  # in 0..SEED_MAX: validate() checked

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
