"""Gives freed blobs of cells back to the OS at once, where glibc's malloc would keep them (Linux only).

A PromptCache keeps and drops blobs of a few MiB all day: saved cells in the RAM tier, a
document's cells, states read from llama.cpp. glibc serves a request below its mmap threshold from
an arena and keeps the pages of a freed block for later requests; and each time a mapped block is
freed it raises that threshold to the block's size (up to 32 MiB), so after the first large blob is
freed, every later one lives in an arena. Blobs of every size coming and going then leave holes the
arenas never return: in a soak on 2026-12-06 (bench/soak.py, SmolLM2 and Qwen2.5-Coder-0.5B, RAM
tier full) RSS kept growing, 5.5% in 14 minutes on Qwen, and glibc's malloc_trim(0) on the running
servers gave back 205 and 219 MiB. Fixing the threshold (which also stops it moving) makes each
blob of LARGE_BLOCK_BYTES or more a mapping of its own, unmapped when it is freed; smaller
allocations (a token's logits: 600 KiB on Qwen) keep reusing arena memory as before.

It is process-wide, so it is set once, when the first PromptCache opens; $PC_CPU_MMAP_THRESHOLD
sets another threshold in bytes, and 0 leaves malloc as it was.
"""

from __future__ import annotations

import ctypes
import os
import platform

from pc_cpu.errors import ConfigError

LARGE_BLOCK_BYTES = 1 << 20
M_MMAP_THRESHOLD = -3  # glibc's malloc.h
ENV = "PC_CPU_MMAP_THRESHOLD"

_applied: int | None = None


def map_large_blocks_apart(threshold: int | None = None) -> int:
    """Returns the mmap threshold now in force for blocks of cells (0: malloc left as it was).

    `threshold` None reads $PC_CPU_MMAP_THRESHOLD (default LARGE_BLOCK_BYTES). Only glibc is
    changed: other C libraries (musl, macOS, Windows) return their memory differently, and are left alone.
    """
    global _applied
    wanted = _threshold_from_env() if threshold is None else threshold
    if _applied == wanted:
        return wanted
    if wanted <= 0 or platform.libc_ver()[0] != "glibc":
        return _applied or 0  # mallopt cannot be undone: a threshold set earlier stays in force
    libc = ctypes.CDLL(None)  # the process's own C library
    if libc.mallopt(M_MMAP_THRESHOLD, ctypes.c_int(wanted)) != 1:
        return 0  # glibc refuses thresholds above HEAP_MAX_SIZE / 2 (32 MiB on 64-bit)
    _applied = wanted
    return wanted


def _threshold_from_env() -> int:
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return LARGE_BLOCK_BYTES
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"${ENV}={raw!r} is not a number of bytes; set it to e.g. 1048576, or 0 to leave "
                          f"malloc as it is") from None
