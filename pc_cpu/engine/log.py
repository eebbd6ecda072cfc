"""Routes llama.cpp's own log lines to Python logging, silent unless verbose.

llama-cpp-python prints every llama.cpp log line to stderr by default; a CLI
that prints pages of tensor info per run is unusable, so we take the callback over.
"""

from __future__ import annotations

import ctypes
import logging

import llama_cpp

log = logging.getLogger("pc_cpu.llama")
_verbose = False


# typedef void (*ggml_log_callback)(enum ggml_log_level level, const char * text, void * user_data);
@llama_cpp.llama_log_callback
def _on_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    if _verbose:
        log.info(text.decode("utf-8", errors="replace").rstrip("\n"))


def set_llama_verbose(verbose: bool) -> None:
    """Makes llama.cpp's log lines visible (as INFO on logger 'pc_cpu.llama') or silent."""
    global _verbose
    _verbose = verbose
    if verbose and not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO)
    llama_cpp.llama_log_set(_on_log, ctypes.c_void_p(0))
