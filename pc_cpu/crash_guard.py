"""Gives the CLI one clear `error:` line when llama.cpp dies of a fatal signal (native/pc_guard.h).

A segfault inside llama.cpp ends the process before Python can run any code, so the line is
written by a C signal handler in pc_native: "error: llama.cpp crashed (SIGSEGV) <message>",
then exit code 2. The message says what was running and what to try; the engine updates it as
it loads models (pc_cpu.engine.llama.model). Only the CLI installs the guard: a library must not take
over its host process's signal handlers.

Python's faulthandler, when enabled (`--verbose`, PYTHONFAULTHANDLER, pytest), keeps running
first and prints the traceback; the guard's line follows it.
"""

from __future__ import annotations

import ctypes
import faulthandler
import functools
import sys

DEFAULT_MESSAGE = ("inside native code; run the command again with `pc-cpu --verbose ...` to see where, and report "
                   "it as a bug if the input is right")


@functools.cache
def _lib() -> ctypes.CDLL | None:
    """Returns pc_native with the guard's functions bound, or None when it is missing or too old."""
    from pc_cpu.kvstate.library import library_path  # the one place that finds pc_native; loads no numpy

    path = library_path()
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(str(path))
        # int pc_guard_install(void);
        lib.pc_guard_install.argtypes = []
        lib.pc_guard_install.restype = ctypes.c_int
        # int pc_guard_set_message(const char *message, size_t length);
        lib.pc_guard_set_message.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        lib.pc_guard_set_message.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None  # a library built before the guard: crashes stay silent, nothing else changes
    return lib


def install(*, traceback: bool = False) -> bool:
    """Installs the guard for this process; returns False where it cannot (no pc_native, Windows).

    traceback: also enable faulthandler, so the Python traceback precedes the error line.
    """
    lib = _lib()
    if lib is None:
        if traceback:
            faulthandler.enable()
        return False
    # faulthandler must be enabled after the guard to run before it (it chains to the handler it replaced).
    was_enabled = faulthandler.is_enabled()
    if was_enabled:
        faulthandler.disable()
    ok = lib.pc_guard_install() == 0
    set_message(DEFAULT_MESSAGE)
    if was_enabled or traceback:
        faulthandler.enable(file=sys.__stderr__)
    return ok


def set_message(message: str) -> None:
    """Sets what a crash from now on reports after "error: llama.cpp crashed (SIGNAL) "; no-op without the guard."""
    lib = _lib()
    if lib is not None:
        data = " ".join(message.split()).encode("utf-8", "replace")
        lib.pc_guard_set_message(data, len(data))
