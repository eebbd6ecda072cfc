"""Gives the options of one generation as one typed value, shared by `generate`, `stream`, `ask` and `stream_ask`.

Each of those methods still takes the options as keywords (`max_tokens=64`), as every caller
written so far does; they collect them here once instead of repeating eight parameters four
times. A caller that passes the same options to many calls can build one GenerationOptions and
hand it over (`pc.generate(prompt, options)`), keywords then override its fields.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from pc_cpu.engine.llama.sampler import SamplingParams
from pc_cpu.errors import PromptCacheError
from pc_cpu.pml.recompute import RecomputePolicy


@dataclass(frozen=True)
class GenerationOptions:
    """How to generate one answer: its length, sampling, stop texts, and what the cache may reuse."""

    max_tokens: int = 256
    temperature: float = 0.0  # 0 is greedy
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    seed: int = 0
    stop: tuple[str, ...] = ()  # stop when one of these texts appears; it is not part of the answer
    use_cache: bool = True  # False is the baseline: a full prefill of the identical tokens
    # Cached tokens to compute again, e.g. "tail:32" or "10%" (pc_cpu.pml.recompute); None keeps every cell.
    recompute: "str | float | RecomputePolicy | None" = None

    def sampling(self) -> SamplingParams:
        """Returns the sampler's parameters of these options, checked (before the prompt is queued)."""
        sampling = SamplingParams(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, seed=self.seed)
        sampling.validate()
        return sampling

    def __post_init__(self) -> None:
        # A caller's list of stop texts becomes a tuple, so options stay hashable and cannot change under a prompt.
        object.__setattr__(self, "stop", _stop_texts(self.stop))
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            raise PromptCacheError(f"max_tokens={self.max_tokens!r}: must be at least 1")

    @classmethod
    def of(cls, options: "GenerationOptions | None", overrides: Mapping[str, Any], *,
           method: str) -> "GenerationOptions":
        """Returns `options` (default: GenerationOptions()) with the keyword `overrides` of a call to `method`.

        Raises:
            TypeError: a keyword that is not an option, as Python raises for an unknown keyword argument.
        """
        unknown = sorted(set(overrides) - _FIELDS)
        if unknown:
            raise TypeError(f"{method}() got an unexpected keyword argument {unknown[0]!r}; the generation options "
                            f"are {', '.join(sorted(_FIELDS))} (pc_cpu.options.GenerationOptions)")
        base = options if options is not None else cls()
        if not isinstance(base, GenerationOptions):
            raise TypeError(f"{method}(): options must be a GenerationOptions, not {type(base).__name__}")
        return dataclasses.replace(base, **overrides) if overrides else base


def _stop_texts(stop: Sequence[str] | str | None) -> tuple[str, ...]:
    """Returns the stop texts as a tuple; one string is one stop text, not one per character."""
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    return tuple(stop)


_FIELDS = frozenset(field.name for field in dataclasses.fields(GenerationOptions))
