"""Grows the large byte buffers that blobs of cells are written into, without writing them first."""

from __future__ import annotations

import ctypes
import sys

_resize = ctypes.pythonapi.PyByteArray_Resize
_resize.argtypes = (ctypes.py_object, ctypes.c_ssize_t)
_resize.restype = ctypes.c_int


def grow_unwritten(buffer: bytearray, size: int) -> None:
    """Grows `buffer` to `size` bytes without writing the new ones; for a buffer the caller fills whole at once.

    Why: growing a bytearray the usual way writes zeros into every new page before the caller
    writes its own bytes, so a ~100 MB restore blob in a fresh process paid for its pages twice
    (`pc-cpu ask` from disk: ~75 ms of its ~260 ms, py-spy). CPython's PyByteArray_Resize leaves
    the new bytes as they are (a large block is a fresh mapping: its pages are mapped when the
    caller first writes them). The new bytes are undefined until written.

    Raises:
        BufferError: a view of `buffer` is alive (as bytearray.extend would).
    """
    if size <= len(buffer):
        return
    if _resize(buffer, size) != 0:
        raise BufferError("cannot resize a bytearray while a view of it exists")
    _ask_for_huge_pages(buffer)


_HUGE = 2 << 20  # a transparent huge page on x86-64 and arm64
_MADV_HUGEPAGE = 14  # Linux's madvise advice
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def _ask_for_huge_pages(buffer: bytearray) -> None:
    """Asks Linux to back `buffer`'s whole 2 MiB pages with huge pages (a hint; ignored where unsupported).

    Why: a ~100 MB blob written into fresh memory took ~25,000 page faults, most of the ~60 ms a
    question over a stored document spends assembling its blob in a new process (py-spy); huge
    pages make them ~50. Systems whose transparent huge pages are "madvise" (a common default)
    need the hint; "always" needs none, "never" ignores it.
    """
    if _libc is None or len(buffer) < 2 * _HUGE:
        return
    start = ctypes.addressof(ctypes.c_char.from_buffer(buffer))
    first = (start + _HUGE - 1) // _HUGE * _HUGE
    last = (start + len(buffer)) // _HUGE * _HUGE
    if last > first:
        _libc.madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), _MADV_HUGEPAGE)
