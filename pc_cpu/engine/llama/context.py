"""Gives a llama.cpp context: batched decoding at explicit positions and the memory/state calls.

Every id, position and size is checked here before it reaches llama.cpp, because
llama.cpp aborts the whole process on an out-of-range sequence id or an
oversized batch instead of returning an error.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from typing import Callable, Sequence

import llama_cpp
import numpy as np

from pc_cpu.engine.llama.log import take_buffer_sizes
from pc_cpu.engine.llama.model import Model, ModelInfo
from pc_cpu.errors import ContextOverflowError, EngineError
from pc_cpu.kvstate.buffers import grow_unwritten

MAX_SEQUENCES = 256  # llama.cpp's LLAMA_MAX_SEQ


@dataclass(frozen=True)
class ContextConfig:
    n_ctx: int = 8192  # positions per sequence; unified: KV cells shared by every sequence
    n_batch: int = 512  # tokens per llama_decode call; longer inputs are split
    n_seq_max: int = 64  # sequence ids 0..n_seq_max-1
    threads: int | None = None  # None: every core for batches, half of them for one-token decodes
    # None: llama.cpp decides (on, on a CPU). PromptCache passes default_flash_attn(model) unless asked.
    flash_attn: bool | None = None
    swa_full: bool = True  # keep cells outside a sliding window: modules far back stay visible
    # True: one pool of n_ctx cells that sequences share (seq_cp shares cells between them).
    # False: every sequence gets its own stream of n_ctx cells, filled from slot 0 in the order
    # cells arrive, and attention sums only that stream: a prompt's result then depends on its
    # own cells alone (see pc_cpu.engine.cells.streams).
    kv_unified: bool = True


def default_flash_attn(info: ModelInfo) -> bool | None:
    """Returns PromptCache's flash attention for a model: off, or None (llama.cpp's choice, on) for a sliding window.

    Off, a cached prompt's few tokens over thousands of cached cells decode ~1.5-2x faster on a
    CPU (llama.cpp's flash-attention kernel walks every cell once per query row), and each
    generated token 15-24% faster; a long prefill costs about the same on SmolLM2 but 15-41% more
    on Qwen2.5-Coder-0.5B, paid once per new text, which pc_cpu exists to reuse
    (docs/performance.md). Without flash attention, attention sums a sequence's cells in slot
    order, so cells keep their bits only where they are computed from slot 0 of a stream of their
    own: the workspace. Sliding-window models have none and compute in the library context,
    where slots depend on what was there before, so they keep llama.cpp's choice.
    """
    return None if info.n_swa else False


def default_threads() -> int:
    """Returns the number of cores this process may use: the threads of a batch (prefill, encoding)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def default_decode_threads() -> int:
    """Returns the threads of a one-token decode: half the cores, at least one.

    Decoding one token reads every weight once and is bound by memory bandwidth, not by cores:
    on 2 cores, Qwen2.5-0.5B decoded 42 tokens/s with 1 thread and 39-44 with 2. But llama.cpp's
    threads wait for each other at every op, so a core that another program takes stalls them
    all: with one core busy elsewhere, 2 threads decoded 12.6 tokens/s and 1 thread 37.8
    (bench/cpu_paths.py, docs/performance.md). A batch is bound by compute and gains from every
    core (2 threads prefilled 512 tokens 1.55x faster), so batches keep default_threads().
    """
    return max(1, default_threads() // 2)


class Context:
    """One llama_context (a unified KV cache, or one stream per sequence); the only owner of its handle and batch."""

    def __init__(self, model: Model, config: ContextConfig):
        if not 1 <= config.n_seq_max <= MAX_SEQUENCES:
            raise EngineError(f"n_seq_max={config.n_seq_max}: must be 1..{MAX_SEQUENCES}")
        if config.n_ctx < 16:
            raise EngineError(f"n_ctx={config.n_ctx}: must be at least 16")
        self.model = model
        self.config = config
        self.threads = config.threads or default_threads()
        params = llama_cpp.llama_context_default_params()
        # llama.cpp splits a non-unified context's n_ctx evenly between the sequences' streams.
        params.n_ctx = config.n_ctx if config.kv_unified else config.n_ctx * config.n_seq_max
        params.n_batch = config.n_batch
        params.n_ubatch = config.n_batch
        params.n_seq_max = config.n_seq_max
        params.n_threads = config.threads or default_decode_threads()
        params.n_threads_batch = self.threads
        params.kv_unified = config.kv_unified
        params.swa_full = config.swa_full
        params.no_perf = True
        if config.flash_attn is not None:
            params.flash_attn_type = 1 if config.flash_attn else 0
        take_buffer_sizes()  # what earlier contexts reported is not this one's
        self._ctx = llama_cpp.llama_init_from_model(model.handle, params)
        self.buffers = take_buffer_sizes()  # its KV and compute buffers, as llama.cpp's log reports them
        if not self._ctx:
            raise EngineError(f"llama.cpp could not create a context with n_ctx={config.n_ctx}; "
                              "lower n_ctx (run with --verbose to see why)")
        self._mem = llama_cpp.llama_get_memory(self._ctx)
        self.n_ctx = llama_cpp.llama_n_ctx_seq(self._ctx)  # positions (and cells) one sequence can hold
        self.kv_unified = config.kv_unified
        self.n_stream = 1 if config.kv_unified else config.n_seq_max  # KV streams, as state blobs count them
        self.n_seq_max = config.n_seq_max
        self.n_batch = config.n_batch
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        self.can_shift = bool(llama_cpp.llama_memory_can_shift(self._mem))
        self._state_buffer = bytearray()  # reused by state_get_reusing: see there

    @property
    def cells_id(self) -> str:
        """Returns what a stored cell's bytes depend on besides its tokens: the model, and the layout of V.

        Flash attention stores V as it is, without it transposed, and llama.cpp refuses to restore
        one into the other: the two are kept apart in the store. Cells computed with llama.cpp's own
        choice (flash attention on, on a CPU) keep the plain model fingerprint they were stored under.
        """
        fingerprint = self.model.info.fingerprint
        return f"{fingerprint}/v-transposed" if self.config.flash_attn is False else fingerprint

    def close(self) -> None:
        """Frees the batch, then the context (children before parents)."""
        if getattr(self, "_ctx", None):
            llama_cpp.llama_batch_free(self._batch)
            llama_cpp.llama_free(self._ctx)
            self._ctx = None

    def __del__(self) -> None:
        self.close()

    # --- checks -------------------------------------------------------------

    def check_seq(self, seq: int) -> None:
        if not 0 <= seq < self.n_seq_max:
            raise EngineError(f"sequence id {seq} is out of range 0..{self.n_seq_max - 1}")

    def check_positions(self, start: int, end: int) -> None:
        if start < 0 or end > self.n_ctx:
            raise ContextOverflowError(f"positions [{start}, {end}) do not fit the context of {self.n_ctx} "
                                       "tokens; raise n_ctx or shorten the prompt")

    # --- decoding -----------------------------------------------------------

    def decode(self, tokens: Sequence[int], positions: Sequence[int], seqs: Sequence[int] | int,
               *, logits_last: bool = True, after_chunk: Callable[[int, int], None] | None = None) -> None:
        """Computes `tokens` at `positions` in sequence(s) `seqs`, in chunks of n_batch.

        After it returns, `logits()` gives the last token's logits when logits_last is set.
        Per sequence, positions must continue from its last cell (llama.cpp's rule).
        after_chunk(lo, hi) runs once tokens[lo:hi] are in the cache, before the next chunk
        is decoded (the encoder pins their cells there; see pc_cpu.engine.cells.encoder).
        """
        seq_list = self._checked(tokens, positions, seqs)
        n = len(tokens)
        for lo in range(0, n, self.n_batch):
            hi = min(n, lo + self.n_batch)
            self._decode_chunk(tokens[lo:hi], positions[lo:hi], seq_list[lo:hi], "last" if logits_last and hi == n
                               else "none")
            if after_chunk is not None:
                after_chunk(lo, hi)

    def decode_each(self, tokens: Sequence[int], positions: Sequence[int], seqs: Sequence[int]) -> None:
        """Computes one batch (at most n_batch tokens) with an output per token: `logits(i)` is token i's.

        This is a decode step of several sequences at once (one new token each).
        """
        seq_list = self._checked(tokens, positions, seqs)
        if len(tokens) > self.n_batch:
            raise EngineError(f"{len(tokens)} tokens in one step > n_batch={self.n_batch}; run fewer prompts at once")
        self._decode_chunk(tokens, positions, seq_list, "all")

    def _checked(self, tokens, positions, seqs) -> list[int]:
        """Returns the per-token sequence ids after checking every id, position and token."""
        n = len(tokens)
        if n == 0 or len(positions) != n:
            raise EngineError(f"decode needs one position per token (got {n} tokens, {len(positions)} positions)")
        seq_list = [seqs] * n if isinstance(seqs, int) else list(seqs)
        if len(seq_list) != n:
            raise EngineError(f"decode needs one sequence id per token (got {len(seq_list)} for {n} tokens)")
        for seq in set(seq_list):
            self.check_seq(seq)
        self.check_positions(min(positions), max(positions) + 1)
        for token in tokens:
            if not 0 <= token < self.model.n_vocab:
                raise EngineError(f"token id {token} is outside the vocabulary (0..{self.model.n_vocab - 1})")
        return seq_list

    def _decode_chunk(self, tokens, positions, seqs, outputs: str) -> None:
        """Decodes at most n_batch tokens; `outputs` is "last", "all" or "none" (which tokens get logits)."""
        batch = self._batch
        n = len(tokens)
        for i in range(n):
            batch.token[i] = tokens[i]
            batch.pos[i] = positions[i]
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seqs[i]
            batch.logits[i] = 1 if outputs == "all" else 0
        if outputs == "last":
            batch.logits[n - 1] = 1
        batch.n_tokens = n
        status = llama_cpp.llama_decode(self._ctx, batch)
        if status != 0:
            raise _decode_error(status, n, self.n_ctx)

    def logits(self, index: int = -1) -> np.ndarray:
        """Returns a copy of the logits of output `index` of the last decode (-1: the last output)."""
        ptr = llama_cpp.llama_get_logits_ith(self._ctx, index)
        if not ptr:
            raise EngineError("no logits for that output: the last decode did not ask for them")
        return np.ctypeslib.as_array(ptr, shape=(self.model.n_vocab,)).copy()

    @property
    def handle(self):
        return self._ctx

    # --- memory -------------------------------------------------------------

    def seq_pos_max(self, seq: int) -> int:
        """Returns the largest position in `seq`, or -1 when it has no cells."""
        self.check_seq(seq)
        return llama_cpp.llama_memory_seq_pos_max(self._mem, seq)

    def seq_pos_min(self, seq: int) -> int:
        self.check_seq(seq)
        return llama_cpp.llama_memory_seq_pos_min(self._mem, seq)

    def seq_cp(self, src: int, dst: int, start: int, end: int) -> None:
        """Shares `src`'s cells at positions [start, end) with `dst` (no copy of data); unified caches only."""
        if not self.kv_unified:
            raise EngineError("seq_cp needs a unified KV cache: sequences of this context have their own streams")
        self.check_seq(src)
        self.check_seq(dst)
        self.check_positions(start, end)
        llama_cpp.llama_memory_seq_cp(self._mem, src, dst, start, end)

    def seq_rm(self, seq: int, start: int = -1, end: int = -1) -> None:
        """Drops `seq`'s cells at [start, end) (-1: open-ended); cells no one else holds are freed."""
        self.check_seq(seq)
        if not llama_cpp.llama_memory_seq_rm(self._mem, seq, start, end):
            raise EngineError(f"llama.cpp refused to remove cells [{start}, {end}) of sequence {seq}")

    def seq_add(self, seq: int, start: int, end: int, delta: int) -> None:
        """Moves `seq`'s cells at [start, end) by `delta` positions; K is re-rotated at the next decode.

        A cell has one position for every sequence that holds it: call this only on cells
        no other sequence shares.
        """
        self.check_seq(seq)
        if not self.can_shift:
            raise EngineError("this model's KV cache cannot shift positions; prompts whose parameter "
                              "arguments leave gaps are not supported on it")
        self.check_positions(start + min(0, delta), end + max(0, delta))
        llama_cpp.llama_memory_seq_add(self._mem, seq, start, end, delta)

    # --- state bytes ----------------------------------------------------------

    def state_get(self, seq: int) -> bytes:
        """Returns the bytes of `seq`'s cells (llama_state_seq_get_data)."""
        self.check_seq(seq)
        size = llama_cpp.llama_state_seq_get_size(self._ctx, seq)
        buf = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data(self._ctx, buf, size, seq)
        return ctypes.string_at(buf, written)  # one copy (slicing a ctypes array would build a list of ints)

    def state_get_reusing(self, seq: int, *, room_after: int = 0) -> memoryview:
        """Returns `seq`'s state bytes, followed by `room_after` zero bytes, in a buffer this context reuses.

        Why: a prompt's ~95 MB state read into a fresh buffer cost ~100 ms, most of it the
        kernel mapping new pages (glibc maps buffers this large anew each time), against
        ~6 ms to restore it. The view is valid until the next call; release it before then.
        """
        self.check_seq(seq)
        size = llama_cpp.llama_state_seq_get_size(self._ctx, seq)
        if len(self._state_buffer) < size + room_after:
            self._state_buffer = bytearray()  # the old one freed first, then a fresh one llama.cpp writes whole
            grow_unwritten(self._state_buffer, size + room_after)
        dst = (ctypes.c_uint8 * size).from_buffer(self._state_buffer)
        written = llama_cpp.llama_state_seq_get_data(self._ctx, dst, size, seq)
        del dst  # release the export so the buffer stays resizable
        view = memoryview(self._state_buffer)[:written + room_after]
        view[written:] = bytes(room_after)
        return view

    def whole_state_spans(self, start: int, end: int) -> list[tuple[int, int]]:
        """Returns [start, end) cut into spans whose cells a state of one sequence holds whole.

        llama_state_seq_get_data leaves out the sliding-window cells that are masked
        for the sequence's last position; half-window spans aligned to multiples of
        their size are never masked under any window kind llama.cpp has (standard,
        chunked, symmetric). A model without a window gets one span.
        """
        if start >= end:
            return []
        window = self.model.info.n_swa
        if not window:
            return [(start, end)]
        step = max(1, window // 2)
        return [(max(a, start), min(a + step, end)) for a in range(start - start % step, end, step)]

    def state_set(self, seq: int, data: bytes | bytearray | memoryview) -> None:
        """Replaces `seq`'s cells with a blob from state_get (the sequence is cleared first)."""
        self.check_seq(seq)
        # set_data only reads the blob: point llama.cpp at the object's own buffer, no copy.
        if isinstance(data, (bytearray, memoryview)) and not getattr(data, "readonly", False):
            buf = (ctypes.c_uint8 * len(data)).from_buffer(data)
        else:
            buf = ctypes.cast(ctypes.c_char_p(bytes(data)), ctypes.POINTER(ctypes.c_uint8))
        if llama_cpp.llama_state_seq_set_data(self._ctx, buf, len(data), seq) == 0:
            raise EngineError(f"llama.cpp could not restore a {len(data)}-byte state into sequence {seq}: "
                              "the blob is from another model or the context has no free cells")


def _decode_error(status: int, n: int, n_ctx: int) -> Exception:
    if status == 1:
        return ContextOverflowError(f"no free KV cells for {n} tokens (context holds {n_ctx}): "
                                    "raise n_ctx, shorten the prompt, or load fewer schemas")
    if status == 2:
        return EngineError("decoding was aborted")
    if status == -1:
        return EngineError("llama.cpp rejected the batch as invalid (positions must continue each "
                           "sequence's last position); run with --verbose to see its reason")
    return EngineError(f"llama.cpp failed while decoding (code {status}); run with --verbose for details")
