"""ctypes binding to libpc_native, the C twin of :mod:`pc_cpu.kvstate.state_blob`.

The library is looked for next to the package's modules (``pc_cpu/libpc_native.so``,
``.dylib`` or ``pc_native.dll``; scikit-build installs it there). When it is absent or
reports another ABI version, :func:`available` is False. Both twins expose ``scan``,
``relocate``, ``assemble_into``, ``restream`` and ``order_in_place`` with the
same signatures, results and ``StateBlobError.code``; :mod:`pc_cpu.kvstate.ops` picks one of
them once, and the rest of pc_cpu calls that.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from typing import Sequence

import numpy as np

from pc_cpu.errors import StateBlobError
from pc_cpu.kvstate.buffers import grow_unwritten
from pc_cpu.kvstate.library import library_path
from pc_cpu.kvstate.rope import RopeParams
from pc_cpu.kvstate.state_blob import BlobLike, StateBlobInfo

log = logging.getLogger(__name__)

ABI_VERSION = 4  # PC_NATIVE_VERSION in native/pc_state.h
_INT32 = (-2**31, 2**31 - 1)
PC_OK = 0
PC_ERR_ARGUMENT = -4
PC_ERR_CAPACITY = -8

# pc_status -> StateBlobError.code and the sentence that explains it.
_STATUS = {
    -1: ("truncated", "state blob truncated: it ends before a field it declares; was it cut short?"),
    -2: ("bad_magic", "not a llama.cpp sequence state: wrong magic number"),
    -3: ("unsupported", "layout not supported: a whole-cache state, cells in several streams, "
                        "more than 2**32 cells, or (to relocate) quantized K, several KV caches "
                        "or M-RoPE ext records"),
    -4: ("argument", "invalid argument: a NULL buffer, a rope that does not fit the K rows, or a "
                     "position moved outside 0..2**31-1"),
    -5: ("corrupt", "state blob corrupt: a field holds an impossible value (negative position, "
                    "several sequence ids per cell, unknown type) or bytes follow the last cache"),
    -6: ("mismatch", "cannot splice: the blobs differ in layout (model, cache types, n_seq_max, "
                     "kv_unified or flash attention); splice blobs of identically configured contexts"),
    -7: ("overlap", "two cells of one KV cache share a position; spliced modules need disjoint "
                    "positions"),
    -8: ("capacity", "output buffer too small for the spliced blob"),
    -9: ("nomem", "pc_native could not allocate temporary memory"),
}


class _Info(ctypes.Structure):
    """pc_state_info."""

    _fields_ = [
        ("seq_id", ctypes.c_int32), ("n_section", ctypes.c_uint32), ("n_stream", ctypes.c_uint32),
        ("n_cell", ctypes.c_uint32), ("pos_min", ctypes.c_int32), ("pos_max", ctypes.c_int32),
        ("cell_ext", ctypes.c_uint32), ("v_trans", ctypes.c_uint32), ("n_layer", ctypes.c_uint32),
        ("k_type", ctypes.c_int32), ("v_type", ctypes.c_int32),
        ("k_row_size", ctypes.c_uint64), ("v_row_size", ctypes.c_uint64),
    ]


class _Rope(ctypes.Structure):
    """pc_rope_params."""

    _fields_ = [
        ("n_rot", ctypes.c_int32), ("mode", ctypes.c_int32), ("n_head_kv", ctypes.c_int32),
        ("head_dim", ctypes.c_int32), ("freq_base", ctypes.c_float), ("freq_scale", ctypes.c_float),
    ]


_u8p = ctypes.POINTER(ctypes.c_uint8)


def _bind(lib: ctypes.CDLL) -> None:
    # int32_t pc_native_version(void);
    lib.pc_native_version.argtypes = []
    lib.pc_native_version.restype = ctypes.c_int32
    # int pc_state_scan(const uint8_t *blob, size_t size, pc_state_info *out);
    lib.pc_state_scan.argtypes = [_u8p, ctypes.c_size_t, ctypes.POINTER(_Info)]
    lib.pc_state_scan.restype = ctypes.c_int
    # int pc_state_relocate(uint8_t *blob, size_t size, int32_t delta, const pc_rope_params *ropes,
    #                       uint32_t n_ropes);
    lib.pc_state_relocate.argtypes = [_u8p, ctypes.c_size_t, ctypes.c_int32, ctypes.POINTER(_Rope),
                                      ctypes.c_uint32]
    lib.pc_state_relocate.restype = ctypes.c_int
    # int pc_state_assemble(const uint8_t *const *blobs, const size_t *sizes, const int32_t *deltas,
    #                       size_t n_blobs, const pc_rope_params *ropes, uint32_t n_ropes, uint32_t n_stream,
    #                       uint8_t *out, size_t out_capacity, size_t *out_size);
    lib.pc_state_assemble.argtypes = [ctypes.POINTER(_u8p), ctypes.POINTER(ctypes.c_size_t),
                                      ctypes.POINTER(ctypes.c_int32), ctypes.c_size_t, ctypes.POINTER(_Rope),
                                      ctypes.c_uint32, ctypes.c_uint32, _u8p, ctypes.c_size_t,
                                      ctypes.POINTER(ctypes.c_size_t)]
    lib.pc_state_assemble.restype = ctypes.c_int
    # int pc_state_restream(const uint8_t *blob, size_t size, uint32_t n_stream,
    #                       uint8_t *out, size_t out_capacity, size_t *out_size);
    lib.pc_state_restream.argtypes = [_u8p, ctypes.c_size_t, ctypes.c_uint32, _u8p, ctypes.c_size_t,
                                      ctypes.POINTER(ctypes.c_size_t)]
    lib.pc_state_restream.restype = ctypes.c_int
    # int pc_state_order(const uint8_t *blob, size_t size, uint8_t *out, size_t out_capacity,
    #                    uint32_t *in_order);
    lib.pc_state_order.argtypes = [_u8p, ctypes.c_size_t, _u8p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_uint32)]
    lib.pc_state_order.restype = ctypes.c_int


@functools.cache
def _lib() -> ctypes.CDLL | None:
    """Returns the loaded, bound library, or None when it is missing or of another ABI.

    Resolved and loaded once per process: every scan, assemble and relocate asks for it.
    """
    path = library_path()
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(str(path))
        _bind(lib)
    except (OSError, AttributeError) as e:
        log.warning("pc_native at %s cannot be loaded (%s); using numpy", path, e)
        return None
    version = lib.pc_native_version()
    if version != ABI_VERSION:
        log.warning("pc_native at %s has ABI %d, pc_cpu needs %d; rebuild it. Using numpy",
                    path, version, ABI_VERSION)
        return None
    return lib


def available() -> bool:
    """True when the native library is present, loadable and of the right ABI version."""
    return _lib() is not None


def _require() -> ctypes.CDLL:
    lib = _lib()
    if lib is None:
        raise StateBlobError("pc_native is not available; use pc_cpu.kvstate.state_blob",
                             code="unsupported")
    return lib


def _error(status: int, context: str = "") -> StateBlobError:
    code, sentence = _STATUS.get(status, ("corrupt", f"pc_native returned unknown status {status}"))
    return StateBlobError(f"{context}{sentence} (pc_status {status})", code=code)


def _pointer(blob: BlobLike) -> tuple[np.ndarray, ctypes.POINTER]:
    """A read pointer into blob without copying; keep the array alive during the call."""
    try:
        arr = np.frombuffer(blob, dtype=np.uint8)
    except (TypeError, ValueError):
        raise StateBlobError(f"state blob must be contiguous bytes, not {type(blob).__name__}",
                             code="argument") from None
    if arr.size == 0:
        arr = np.zeros(1, np.uint8)[:0]  # a valid address for a 0-byte blob
    return arr, arr.ctypes.data_as(_u8p)


def scan(blob: BlobLike) -> StateBlobInfo:
    """Validates a blob and describes it; see :func:`pc_cpu.kvstate.state_blob.scan`."""
    lib = _require()
    arr, ptr = _pointer(blob)
    info = _Info()
    status = lib.pc_state_scan(ptr, arr.size, ctypes.byref(info))
    if status:
        raise _error(status)
    return StateBlobInfo(
        seq_id=info.seq_id, n_section=info.n_section, n_stream=info.n_stream, n_cell=info.n_cell,
        pos_min=info.pos_min, pos_max=info.pos_max, cell_ext=bool(info.cell_ext),
        v_trans=bool(info.v_trans), n_layer=info.n_layer, k_type=info.k_type,
        v_type=info.v_type, k_row_size=info.k_row_size, v_row_size=info.v_row_size)


def _splice_args(blobs: Sequence[BlobLike]) -> tuple[list[np.ndarray], ctypes.Array, ctypes.Array]:
    arrays, ptrs = zip(*(_pointer(b) for b in blobs)) if len(blobs) else ((), ())
    return list(arrays), (_u8p * len(blobs))(*ptrs), (ctypes.c_size_t * len(blobs))(*(a.size for a in arrays))


def _splice_error(lib: ctypes.CDLL, status: int, blobs: Sequence[BlobLike]) -> StateBlobError:
    """Names the blob at fault when the status comes from parsing one blob."""
    if _STATUS.get(status, ("",))[0] in ("truncated", "bad_magic", "corrupt", "unsupported"):
        for i, blob in enumerate(blobs):
            arr, ptr = _pointer(blob)
            if lib.pc_state_scan(ptr, arr.size, ctypes.byref(_Info())) == status:
                return _error(status, f"blob {i} of {len(blobs)}: ")
    return _error(status)


def _into(out: bytearray) -> ctypes.Array:
    """A ctypes array over the non-empty `out`, to pass straight to one call: the temporary dies
    with the call, and with it the export that would keep `out` from being resized."""
    return (ctypes.c_uint8 * len(out)).from_buffer(out)


def _rope_struct(rope: RopeParams) -> _Rope:
    # An int that does not fit int32 becomes -1, which the C library refuses as PC_ERR_ARGUMENT
    # at the same step where the numpy implementation refuses the original value.
    ints = (rope.n_rot, int(rope.mode), rope.n_head_kv, rope.head_dim)
    ints = tuple(v if _INT32[0] <= v <= _INT32[1] else -1 for v in ints)
    return _Rope(*ints, rope.freq_base, rope.freq_scale)


def relocate(blob: BlobLike, delta: int, rope: RopeParams | tuple[RopeParams, ...]) -> bytearray:
    """Moves a blob's cells by delta; see :func:`pc_cpu.kvstate.state_blob.relocate`."""
    lib = _require()
    if not _INT32[0] <= delta <= _INT32[1]:
        raise StateBlobError(f"cannot relocate: delta {delta} is not an int32", code="argument")
    try:
        out = bytearray(memoryview(blob))
    except TypeError:
        raise StateBlobError(f"state blob must be bytes-like, not {type(blob).__name__}",
                             code="argument") from None
    ropes = rope if isinstance(rope, tuple) and rope and all(isinstance(r, RopeParams) for r in rope) else \
        (rope,) if isinstance(rope, RopeParams) else None  # None: refused by the C library
    c_ropes = (_Rope * len(ropes))(*(_rope_struct(r) for r in ropes)) if ropes else None
    status = lib.pc_state_relocate(_into(out if out else bytearray(1)), len(out), delta, c_ropes,
                                   len(ropes) if ropes else 1)
    if status:
        raise _error(status, "cannot relocate: ")
    return out


def assemble_into(blobs: Sequence[BlobLike], deltas: Sequence[int], rope: RopeParams | tuple[RopeParams, ...] | None,
                  n_stream: int, out: bytearray) -> int:
    """Moves and splices blobs into one restore blob at the start of `out`; see :func:`pc_cpu.kvstate.state_blob.assemble_into`."""
    if not isinstance(out, bytearray):
        raise StateBlobError(f"output must be a bytearray (it may be grown), not {type(out).__name__}",
                             code="argument")
    need = _assemble(blobs, deltas, rope, n_stream, out)
    if need > len(out):
        grow_unwritten(out, need)  # pc_state_assemble writes every byte of the result
        _assemble(blobs, deltas, rope, n_stream, out)
    return need


def _assemble(blobs, deltas, rope, n_stream: int, out: bytearray | None) -> int:
    """Runs pc_state_assemble into `out` (None: sizing only); returns the result's size, also when out is too small."""
    lib = _require()
    if len(deltas) != len(blobs):
        raise StateBlobError(f"cannot assemble: {len(blobs)} blobs but {len(deltas)} deltas", code="argument")
    if not all(_INT32[0] <= d <= _INT32[1] for d in deltas):
        raise StateBlobError(f"cannot assemble: a delta of {list(deltas)} is not an int32", code="argument")
    ropes = rope if isinstance(rope, tuple) else (rope,) if rope is not None else ()
    if not all(isinstance(r, RopeParams) for r in ropes):
        ropes = ()  # refused by the C library as PC_ERR_ARGUMENT when a blob moves
    c_ropes = (_Rope * max(len(ropes), 1))(*(_rope_struct(r) for r in ropes))
    arrays, ptrs, sizes = _splice_args(blobs)  # arrays keep the blobs' pointers valid
    c_deltas = (ctypes.c_int32 * max(len(deltas), 1))(*deltas)
    need = ctypes.c_size_t(0)
    status = lib.pc_state_assemble(ptrs, sizes, c_deltas, len(blobs), c_ropes if ropes else None, len(ropes),
                                   n_stream if 0 <= n_stream < 2**32 else 0, _into(out) if out else None,
                                   len(out) if out else 0, ctypes.byref(need))
    if status == PC_ERR_CAPACITY:
        return need.value
    if status:
        raise _error(status, "cannot assemble: ") if status == PC_ERR_ARGUMENT else _splice_error(lib, status, blobs)
    return need.value


def restream(blob: BlobLike, n_stream: int) -> bytearray:
    """Returns `blob` rewritten for `n_stream` KV streams; see :func:`pc_cpu.kvstate.state_blob.restream`."""
    lib = _require()
    arr, ptr = _pointer(blob)
    n = n_stream if 0 <= n_stream < 2**32 else 0  # out of range: refused by the C library
    need = ctypes.c_size_t(0)
    status = lib.pc_state_restream(ptr, arr.size, n, None, 0, ctypes.byref(need))  # sizes it
    out = bytearray()
    if status == PC_ERR_CAPACITY:
        out = bytearray(need.value)
        status = lib.pc_state_restream(ptr, arr.size, n, _into(out), len(out), ctypes.byref(need))
    if status:
        raise _error(status, "cannot restream: ")
    return out


def order_in_place(blob: bytearray | memoryview) -> None:
    """Sorts a writable blob's cells by position where it lies; see :func:`pc_cpu.kvstate.state_blob.order_in_place`."""
    lib = _require()
    try:
        buf = (ctypes.c_uint8 * len(memoryview(blob).cast("B"))).from_buffer(blob)
    except (TypeError, ValueError):
        raise StateBlobError("a blob sorted in place must be a writable, contiguous buffer (a bytearray)",
                             code="argument") from None
    ptr = ctypes.cast(buf, _u8p) if len(buf) else None
    in_order = ctypes.c_uint32(0)
    status = lib.pc_state_order(ptr, len(buf), ptr, len(buf), ctypes.byref(in_order)) if ptr else -1
    del buf, ptr  # release the export so a bytearray stays resizable
    if status:
        raise _error(status, "cannot order: ")
