"""Gives a llama.cpp sampler chain: a grammar and penalties if asked, then greedy, or temperature with top-k / top-p / min-p and a seed.

The chain's order is llama.cpp's own (common/sampling): logit biases, then the repetition
penalties, then the cut-offs and the draw; a grammar is applied as llama.cpp's server applies it
(tokens it forbids are never drawn: see Sampler). Every link is
deterministic given the logits and the tokens accepted so far, so a cached prompt answers as its
full prefill does with a grammar and penalties on too.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass

import llama_cpp
import numpy as np

from pc_cpu.errors import PromptCacheError


TOP_K_MAX = 2**31 - 1  # llama_sampler_init_top_k takes an int32_t: ctypes would keep the low bits of more
SEED_MAX = 2**32 - 2  # a uint32_t, and 0xFFFFFFFF is LLAMA_DEFAULT_SEED, "pick a random seed"
TEMPERATURE_MAX = 3.4e38  # about FLT_MAX: llama.cpp takes a C float, and beyond it a temperature is infinity


PENALTY_LAST_N_MAX = 2**31 - 1  # an int32_t
TOP_LOGPROBS_MAX = 20  # as OpenAI's API takes


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    seed: int = 0
    min_p: float = 0.0  # 0: off; else tokens below min_p x the likeliest one's probability are cut
    repeat_penalty: float = 1.0  # 1: off; > 1 divides the logit of a token seen in the last penalty_last_n
    frequency_penalty: float = 0.0  # 0: off; subtracted once per time a token was seen
    presence_penalty: float = 0.0  # 0: off; subtracted once if a token was seen at all
    penalty_last_n: int = 64  # tokens the penalties look back over (llama.cpp's default); 0: none
    grammar: str | None = None  # GBNF the answer must follow (pc_cpu.engine.llama.grammar); None: free text
    # Tokens that switch the grammar on when the model samples one (llama.cpp's lazy grammar, which then
    # holds the answer from that token on); (): the grammar holds from the first token.
    grammar_triggers: tuple[int, ...] = ()
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit); -inf bans a token
    logprobs: int | None = None  # None: off; k: each chosen token's log probability and the k likeliest (<= 20)

    @property
    def penalized(self) -> bool:
        """Returns whether any repetition penalty is on."""
        return self.penalty_last_n > 0 and (self.repeat_penalty != 1 or self.frequency_penalty != 0
                                            or self.presence_penalty != 0)

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
        if not (_is_number(self.min_p) and 0 <= self.min_p <= 1):
            raise PromptCacheError(f"min_p={self.min_p!r}: must be a number in [0, 1] (0 turns it off)")
        if not (_is_number(self.repeat_penalty) and 0 < self.repeat_penalty <= TEMPERATURE_MAX):
            raise PromptCacheError(f"repeat_penalty={self.repeat_penalty!r}: must be a finite number > 0 "
                                   "(1 turns it off)")
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            if not (_is_number(value) and -2 <= value <= 2):
                raise PromptCacheError(f"{name}={value!r}: must be a number in [-2, 2], as OpenAI's API takes "
                                       "(0 turns it off)")
        if not _is_integer_in(self.penalty_last_n, PENALTY_LAST_N_MAX):
            raise PromptCacheError(f"penalty_last_n={self.penalty_last_n!r}: must be an integer in "
                                   f"0..{PENALTY_LAST_N_MAX}")
        if self.logprobs is not None and not _is_integer_in(self.logprobs, TOP_LOGPROBS_MAX):
            raise PromptCacheError(f"top_logprobs={self.logprobs!r}: must be an integer in 0..{TOP_LOGPROBS_MAX}")
        for token, bias in self.logit_bias:
            if not _is_integer_in(token, TOP_K_MAX) or not (isinstance(bias, (int, float)) and not math.isnan(bias)
                                                            and bias <= 100):
                raise PromptCacheError(f"logit_bias {token!r}: {bias!r}: give token ids (integers >= 0) and biases of "
                                       "at most 100 (-100 or -inf all but bans a token)")
        if self.grammar is not None and not (isinstance(self.grammar, str) and self.grammar.strip()):
            raise PromptCacheError("grammar must be GBNF text (pc_cpu.engine.llama.grammar makes it from a "
                                   "JSON schema), or None")


def _is_number(value) -> bool:
    """Returns whether `value` is a finite int or float (not a bool, not NaN)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_integer_in(value, maximum: int) -> bool:
    """Returns whether `value` is an int (not a bool) in [0, maximum]."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= maximum


def _logit_bias_sampler(n_vocab: int, biases: tuple[tuple[int, float], ...]):
    """Returns llama.cpp's logit-bias sampler of (token, bias) pairs; a token beyond the vocabulary is refused."""
    beyond = [token for token, _ in biases if token >= n_vocab]
    if beyond:
        raise PromptCacheError(f"logit_bias names token {beyond[0]}, beyond this model's {n_vocab} tokens; give ids "
                               f"in 0..{n_vocab - 1}")
    entries = (llama_cpp.llama_logit_bias * len(biases))(
        *(llama_cpp.llama_logit_bias(token, max(bias, -3.4e38)) for token, bias in biases))
    return llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(biases), entries)


def _grammar_sampler(model, grammar: str, triggers: tuple[int, ...]):
    """Returns llama.cpp's grammar sampler of GBNF `grammar` (lazy when `triggers` are given); NULL when it does not parse."""
    if not triggers:
        return llama_cpp.llama_sampler_init_grammar(model.vocab, grammar.encode("utf-8"), b"root")
    tokens = (llama_cpp.llama_token * len(triggers))(*triggers)
    return llama_cpp.llama_sampler_init_grammar_lazy_patterns(model.vocab, grammar.encode("utf-8"), b"root",
                                                              None, 0, tokens, len(triggers))


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's log probability under the model (before any grammar or bias), and the likeliest others."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token id, log probability), likeliest first


def token_logprob(logits: np.ndarray, token: int, top: int) -> TokenLogprob:
    """Returns `token`'s log probability under the softmax of `logits`, with the `top` likeliest tokens'."""
    shifted = logits.astype(np.float64) - float(np.max(logits))
    logprobs = shifted - math.log(float(np.exp(shifted).sum()))
    best = np.argsort(-logprobs, kind="stable")[:top] if top else ()
    return TokenLogprob(token, float(logprobs[token]), tuple((int(i), float(logprobs[i])) for i in best))


_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])  # llama_token_data, as C lays it out


class Sampler:
    """Owns one llama_sampler chain, and a grammar sampler beside it when the answer is held to one.

    With a grammar, a token is drawn as llama.cpp's own server draws it (common/sampling.cpp): the
    chain draws from every token, and only when the grammar refuses that token is the draw made
    again with the grammar applied to the whole vocabulary. Applying a grammar to 150k tokens at
    every step is what costs; most drawn tokens are ones the grammar takes. A greedy draw is the
    same token either way (the grammar only removes tokens); a random one is drawn as llama.cpp
    draws it. Both are deterministic given the logits and the tokens accepted so far.
    """

    def __init__(self, params: SamplingParams, model=None):
        """`model`: the Model whose vocabulary a grammar or penalties need (pc_cpu.engine.llama.model)."""
        params.validate()
        self._grammar = None
        self._chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        if params.grammar is not None or params.penalized or params.logit_bias:
            if model is None:
                self.close()
                raise PromptCacheError("a grammar or a repetition penalty needs the model's vocabulary: pass model=")
        if params.logit_bias:
            self._add(_logit_bias_sampler(model.n_vocab, params.logit_bias))
        if params.grammar is not None:
            self._grammar = _grammar_sampler(model, params.grammar, params.grammar_triggers)
            if not self._grammar:  # llama.cpp logs the parse error and returns NULL
                self._grammar = None
                self.close()
                raise PromptCacheError("llama.cpp could not parse the grammar (GBNF); check it, or give a JSON "
                                       "schema instead (response_format)")
            self._n_vocab = model.n_vocab
            self._ids = np.arange(model.n_vocab, dtype=np.int32)
        if params.penalized:
            self._add(llama_cpp.llama_sampler_init_penalties(model.n_vocab, params.penalty_last_n,
                                                             params.repeat_penalty, params.frequency_penalty,
                                                             params.presence_penalty))
        if params.temperature == 0:
            self._add(llama_cpp.llama_sampler_init_greedy())
            return
        if params.top_k > 0:
            self._add(llama_cpp.llama_sampler_init_top_k(params.top_k))
        if params.top_p < 1:
            self._add(llama_cpp.llama_sampler_init_top_p(params.top_p, 1))
        if params.min_p > 0:
            self._add(llama_cpp.llama_sampler_init_min_p(params.min_p, 1))
        self._add(llama_cpp.llama_sampler_init_temp(params.temperature))
        self._add(llama_cpp.llama_sampler_init_dist(params.seed))  # in 0..SEED_MAX: validate() checked

    def _add(self, sampler) -> None:
        # The chain takes ownership of `sampler`: freeing the chain frees it.
        llama_cpp.llama_sampler_chain_add(self._chain, sampler)

    def sample(self, ctx_handle, index: int = -1) -> int:
        """Returns the next token from output `index` of the last decode (and records it in the chain)."""
        if self._grammar is None:
            return int(llama_cpp.llama_sampler_sample(self._chain, ctx_handle, index))
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx_handle, index), shape=(self._n_vocab,))
        token = self._draw(logits, grammar=False)
        if not self._grammar_takes(token):
            token = self._draw(logits, grammar=True)
        llama_cpp.llama_sampler_accept(self._grammar, token)
        llama_cpp.llama_sampler_accept(self._chain, token)
        return token

    def _draw(self, logits: np.ndarray, *, grammar: bool) -> int:
        """Returns the token the chain draws from every token's logits (after the grammar's mask when `grammar`)."""
        data = np.empty(self._n_vocab, dtype=_TOKEN_DATA)
        data["id"], data["logit"], data["p"] = self._ids, logits, 0.0
        candidates = llama_cpp.llama_token_data_array(
            data.ctypes.data_as(llama_cpp.llama_token_data_p), self._n_vocab, -1, False)
        if grammar:
            llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(candidates))
        llama_cpp.llama_sampler_apply(self._chain, ctypes.byref(candidates))
        return int(candidates.data[candidates.selected].id)

    def _grammar_takes(self, token: int) -> bool:
        """Returns whether the grammar, in its present state, allows `token` next."""
        one = (llama_cpp.llama_token_data * 1)(llama_cpp.llama_token_data(token, 1.0, 0.0))
        single = llama_cpp.llama_token_data_array(one, 1, -1, False)
        llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(single))
        return bool(np.isfinite(one[0].logit))

    def close(self) -> None:
        if getattr(self, "_chain", None):
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None
        if getattr(self, "_grammar", None):
            llama_cpp.llama_sampler_free(self._grammar)
            self._grammar = None

    def __del__(self) -> None:
        self.close()
