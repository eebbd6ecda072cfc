"""Routes llama.cpp's own log lines to Python logging, silent unless verbose; keeps the buffer sizes it reports.

llama-cpp-python prints every llama.cpp log line to stderr by default; a CLI
that prints pages of tensor info per run is unusable, so we take the callback over.
llama.cpp says how large the KV and compute buffers of a new context are only in
its log (its memory breakdown is C++-only), so the sizes are read from there
(take_buffer_sizes): what a host sizing its memory needs (pc_cpu.memory).
"""

from __future__ import annotations

import ctypes
import logging
import re
import threading
from dataclasses import dataclass

import llama_cpp

log = logging.getLogger("pc_cpu.llama")
_verbose = False

# "llama_kv_cache:        CPU KV buffer size =   180.00 MiB", "llama_context:        CPU compute buffer size =    46.02 MiB"
_BUFFER_SIZE = re.compile(rb"\b(KV|compute|output) buffer size = *([0-9.]+) MiB")
_sizes_lock = threading.Lock()
_sizes = {b"KV": 0.0, b"compute": 0.0, b"output": 0.0}  # MiB reported since the last take_buffer_sizes


@dataclass(frozen=True)
class BufferSizes:
    """The buffers llama.cpp allocated for a context, as its log reports them (bytes)."""

    kv: int  # the KV cache: every cell of every stream, K and V of every layer
    compute: int  # the graph's intermediate tensors, sized for the largest batch over the largest stream
    output: int  # logits and embeddings of one batch (grows later if a batch asks for more outputs)


# typedef void (*ggml_log_callback)(enum ggml_log_level level, const char * text, void * user_data);
@llama_cpp.llama_log_callback
def _on_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    match = _BUFFER_SIZE.search(text)
    if match:
        with _sizes_lock:
            _sizes[match.group(1)] += float(match.group(2))
    if _verbose:
        log.info(text.decode("utf-8", errors="replace").rstrip("\n"))


def set_llama_verbose(verbose: bool) -> None:
    """Makes llama.cpp's log lines visible (as INFO on logger 'pc_cpu.llama') or silent."""
    global _verbose
    _verbose = verbose
    if verbose and not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO)
    llama_cpp.llama_log_set(_on_log, ctypes.c_void_p(0))


def take_buffer_sizes() -> BufferSizes:
    """Returns the buffer sizes llama.cpp reported since the last call, and starts counting afresh.

    Call it right before and right after creating a context (one thread creates contexts at a
    time): the second call gives that context's buffers.
    """
    with _sizes_lock:
        sizes = {kind: round(mib * (1 << 20)) for kind, mib in _sizes.items()}
        for kind in _sizes:
            _sizes[kind] = 0.0
    return BufferSizes(kv=sizes[b"KV"], compute=sizes[b"compute"], output=sizes[b"output"])
