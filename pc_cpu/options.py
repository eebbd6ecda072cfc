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

from pc_cpu.engine.llama.grammar import response_grammar
from pc_cpu.engine.llama.sampler import Sampler, SamplingParams
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
    min_p: float = 0.0  # 0: off
    repeat_penalty: float = 1.0  # 1: off
    frequency_penalty: float = 0.0  # 0: off
    presence_penalty: float = 0.0  # 0: off
    # OpenAI's shape: {"type": "json_object"} or {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}};
    # the answer is then held to it by a grammar (pc_cpu.engine.llama.grammar). None: free text.
    response_format: Mapping[str, Any] | None = None
    logit_bias: Mapping[Any, float] | None = None  # {token id (an int, or its digits as OpenAI sends them): bias}
    logprobs: int | None = None  # None: off; k: Result.logprobs, each token's and the k likeliest (0..20)

    def sampling(self, model=None) -> SamplingParams:
        """Returns the sampler's parameters of these options, checked (before the prompt is queued).

        `model`: the Model a grammar and biases are checked against, so that one llama.cpp refuses is the
        caller's error here rather than the prompt's failure later.
        """
        sampling = SamplingParams(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, seed=self.seed,
                                  min_p=self.min_p, repeat_penalty=self.repeat_penalty,
                                  frequency_penalty=self.frequency_penalty, presence_penalty=self.presence_penalty,
                                  grammar=response_grammar(self.response_format),
                                  logit_bias=_biases(self.logit_bias), logprobs=self.logprobs)
        sampling.validate()
        if model is not None and (sampling.grammar is not None or sampling.logit_bias):  # refused here, not mid-run
            Sampler(sampling, model).close()
        return sampling

    def __post_init__(self) -> None:
        # A caller's list of stop texts becomes a tuple, so they cannot change under a prompt; response_format and
        # logit_bias are read once, into the sampler's parameters, when the prompt is queued (sampling()).
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


def _biases(logit_bias: Mapping[Any, float] | None) -> tuple[tuple[int, float], ...]:
    """Returns {token: bias} as (token id, bias) pairs; a key that is not a token id is refused, naming it."""
    if not logit_bias:
        return ()
    if not isinstance(logit_bias, Mapping):
        raise PromptCacheError(f"logit_bias must map token ids to biases, e.g. {{\"50256\": -100}}, not "
                               f"{type(logit_bias).__name__}")
    pairs = []
    for key, bias in logit_bias.items():
        token = key if isinstance(key, int) and not isinstance(key, bool) else None
        if isinstance(key, str) and key.isascii() and key.isdigit():
            token = int(key)
        if token is None or not isinstance(bias, (int, float)) or isinstance(bias, bool):
            raise PromptCacheError(f"logit_bias {key!r}: {bias!r}: keys are token ids (integers, or their digits) "
                                   "and values numbers")
        pairs.append((token, float(bias)))
    return tuple(pairs)
