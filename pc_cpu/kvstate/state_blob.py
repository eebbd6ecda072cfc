"""llama.cpp sequence-state blobs in numpy: the reference twin of the C library (libpc_native).

A blob is what ``llama_state_seq_get_data`` returns for one sequence; its byte format is
described in ``native/pc_state.h``. The byte operations here (scan, splice, relocate,
assemble_into, restream, order_by_position) are the reference that the C library
(``pc_cpu.kvstate.native``) must match byte for byte: both check in the same order
(``native/pc_state.c``, ``pc_splice.c``, ``pc_relocate.c``, ``pc_stream.c``), so for any
input they either return the same bytes or raise :class:`StateBlobError` with the same
``code``. Callers go through :mod:`pc_cpu.kvstate.ops`, which picks one twin. The readers
(section_*, layer_kv, with_sequence) have no C twin: nothing hot runs them.

Positions: a blob's cells sit at arbitrary, distinct positions; ``pos_min``/``pos_max`` are
the extremes (inclusive, as ``llama_memory_seq_pos_min``/``_max`` report them), not a range.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Sequence, Union

import numpy as np

from pc_cpu.errors import StateBlobError
from pc_cpu.kvstate.rope import RopeMode, RopeParams

BlobLike = Union[bytes, bytearray, memoryview]

MAGIC = 0xAF143CD8
MAX_SECTION = 4          # KV caches per blob we accept (llama.cpp writes 1, or 2 for iswa)
MAX_STREAM = 256         # LLAMA_MAX_SEQ
MAX_LAYER = 4096
MAX_TYPE = 64            # every ggml_type value is below this
CELL_BYTES = 12          # i32 pos, u32 n_seq_id, i32 seq_id
EXT_BYTES = 12           # llama_kv_cell_ext: i32 x, i32 y, i32 tok
LAYER_HEADER_BYTES = 12  # i32 type + u64 row size, or i32 type + u32 el size + u32 n_embd
GGML_TYPE_F32 = 0
GGML_TYPE_F16 = 1
MAX_ROT = 1024           # rotated dims per head
MAX_HEAD = 65536         # bound on n_head_kv and head_dim
INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class StateBlobInfo:
    """What :func:`scan` learns about a blob (fields as ``pc_state_info`` in pc_state.h).

    Layer fields describe the first section's first layer; an empty blob reports
    ``n_layer`` 0, types -1 and row sizes 0.
    """

    seq_id: int        # the sequence it was saved from; set_data ignores it
    n_section: int     # KV caches in the blob: 1, or 2 for an iswa model (base, then SWA)
    n_stream: int      # streams per cache: 1 with kv_unified
    n_cell: int        # cells of the first section
    pos_min: int       # smallest position, -1 when empty
    pos_max: int       # largest position (inclusive), -1 when empty
    cell_ext: bool     # each cell carries the 12-byte ext record (M-RoPE / PLE models)
    v_trans: bool      # V is element-major (flash attention off)
    n_layer: int
    k_type: int        # ggml_type of K (0 = F32, 1 = F16)
    v_type: int
    k_row_size: int    # bytes of one cell's K
    v_row_size: int    # bytes of one cell's V (element size * n_embd_v_gqa when transposed)


# --- parsing ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Layer:
    """One layer's K or V record; for a transposed V, row_size = el_size * n_embd."""

    type: int
    row_size: int      # bytes per cell
    el_size: int       # transposed V only, else 0
    n_embd: int        # transposed V only, else 0
    header_off: int
    data_off: int      # n_cell * row_size bytes

    def key(self) -> tuple[int, int, int, int]:
        return (self.type, self.row_size, self.el_size, self.n_embd)


@dataclass(frozen=True)
class _Section:
    """One KV cache's part of a blob; its cells live in at most one stream."""

    n_stream: int
    stream: int | None          # the stream holding the cells
    n_cell: int
    cells_off: int
    positions: np.ndarray       # int32, cell order
    v_trans: int
    k: tuple[_Layer, ...]
    v: tuple[_Layer, ...]

    @property
    def n_layer(self) -> int:
        return len(self.k)


@dataclass(frozen=True)
class _Layout:
    buf: memoryview
    seq_id: int
    cell_ext: int
    sections: tuple[_Section, ...]

    @property
    def cell_bytes(self) -> int:
        return CELL_BYTES + (EXT_BYTES if self.cell_ext else 0)

    @property
    def n_cell_total(self) -> int:
        return sum(s.n_cell for s in self.sections)


def _error(code: str, message: str) -> StateBlobError:
    return StateBlobError(message, code=code)


class _Reader:
    """A cursor over a blob that raises 'truncated' instead of reading past its end."""

    def __init__(self, buf: memoryview, off: int = 0):
        self.buf = buf
        self.off = off

    def left(self) -> int:
        return len(self.buf) - self.off

    def _take(self, fmt: str, what: str) -> int:
        n = struct.calcsize(fmt)
        if self.left() < n:
            raise _error("truncated", f"state blob truncated: {what} needs {n} bytes at offset "
                         f"{self.off}, {self.left()} left; was the blob cut short?")
        (value,) = struct.unpack_from(fmt, self.buf, self.off)
        self.off += n
        return value

    def u32(self, what: str) -> int:
        return self._take("<I", what)

    def i32(self, what: str) -> int:
        return self._take("<i", what)

    def u64(self, what: str) -> int:
        return self._take("<Q", what)


def _layer_read(r: _Reader, n_cell: int, transposed: bool, what: str) -> _Layer:
    header_off = r.off
    type_ = r.i32(f"{what} type")
    if not transposed:
        row_size, el_size, n_embd = r.u64(f"{what} row size"), 0, 0
    else:
        el_size = r.u32(f"{what} element size")
        n_embd = r.u32(f"{what} embedding size")
        row_size = el_size * n_embd
    if not 0 <= type_ < MAX_TYPE:
        raise _error("corrupt", f"state blob corrupt: {what} has ggml type {type_}, "
                     f"valid types are 0..{MAX_TYPE - 1}")
    if row_size == 0:
        raise _error("corrupt", f"state blob corrupt: {what} declares 0 bytes per cell")
    if row_size > r.left() // n_cell:
        raise _error("truncated", f"state blob truncated: {what} declares {n_cell} cells of "
                     f"{row_size} bytes at offset {r.off}, {r.left()} bytes left")
    data_off = r.off
    r.off += row_size * n_cell
    return _Layer(type_, row_size, el_size, n_embd, header_off, data_off)


def _cells_parse(r: _Reader, n_cell: int, seq_id: int, ext: int, where: str) -> np.ndarray:
    """Returns the cell positions; every cell must belong to exactly the blob's sequence."""
    rec = CELL_BYTES + (EXT_BYTES if ext else 0)
    if n_cell > r.left() // rec:
        raise _error("truncated", f"state blob truncated: {where} declares {n_cell} cells of "
                     f"{rec} bytes at offset {r.off}, {r.left()} bytes left")
    cells = np.frombuffer(r.buf, dtype="<i4", count=n_cell * rec // 4, offset=r.off)
    cells = cells.reshape(n_cell, rec // 4)
    bad = np.flatnonzero((cells[:, 0] < 0) | (cells[:, 1] != 1) | (cells[:, -1] != seq_id))
    if bad.size:
        pos, n_seq, seq = (int(v) for v in cells[bad[0], [0, 1, -1]])
        raise _error("corrupt", f"state blob corrupt: {where} cell {int(bad[0])} has position "
                     f"{pos}, {n_seq} sequence ids and sequence {seq}; a single-sequence blob "
                     f"of sequence {seq_id} needs position >= 0, 1 id and sequence {seq_id}")
    r.off += n_cell * rec
    return cells[:, 0].astype(np.int32)


def _data_parse(r: _Reader, n_cell: int, where: str) -> tuple[int, tuple[_Layer, ...], tuple[_Layer, ...]]:
    """v_trans, n_layer, then every layer's K record, then every layer's V record."""
    v_trans = r.u32(f"{where} v_trans")
    if v_trans > 1:
        raise _error("corrupt", f"state blob corrupt: {where} v_trans is {v_trans}, not 0 or 1")
    n_layer = r.u32(f"{where} layer count")
    if n_layer > MAX_LAYER:
        raise _error("corrupt", f"state blob corrupt: {where} declares {n_layer} layers, "
                     f"more than {MAX_LAYER}")
    k = tuple(_layer_read(r, n_cell, False, f"{where} K of layer {il}") for il in range(n_layer))
    v = tuple(_layer_read(r, n_cell, bool(v_trans), f"{where} V of layer {il}")
              for il in range(n_layer))
    return v_trans, k, v


def _section_parse(r: _Reader, seq_id: int, ext: int, index: int) -> _Section:
    where = f"section {index}"
    n_stream = r.u32(f"{where} stream count")
    if n_stream == 0 or n_stream > MAX_STREAM:
        raise _error("corrupt", f"state blob corrupt: {where} declares {n_stream} streams, "
                     f"valid is 1..{MAX_STREAM}")
    found = None
    for s in range(n_stream):
        n_cell = r.u32(f"{where} cell count of stream {s}")
        if n_cell == 0:
            continue
        if found is not None:
            raise _error("unsupported", f"state blob unsupported: {where} has cells in streams "
                         f"{found[0]} and {s}; one sequence lives in one stream")
        stream_where = f"{where} stream {s}"
        positions = _cells_parse(r, n_cell, seq_id, ext, stream_where)
        cells_off = r.off - n_cell * (CELL_BYTES + (EXT_BYTES if ext else 0))
        found = (s, n_cell, cells_off, positions, *_data_parse(r, n_cell, stream_where))
    if found is None:
        return _Section(n_stream, None, 0, 0, np.zeros(0, np.int32), 0, (), ())
    return _Section(n_stream, *found)


def _blob_parse(buf: memoryview, ext: int) -> _Layout:
    r = _Reader(buf)
    magic = r.u32("magic")
    if magic != MAGIC:
        raise _error("bad_magic", f"not a llama.cpp sequence state: magic {magic:#010x}, "
                     f"expected {MAGIC:#010x}")
    seq_id = r.i32("sequence id")
    if seq_id < 0:
        raise _error("unsupported", f"state blob unsupported: sequence id {seq_id} means a "
                     f"whole-cache state; save one sequence (seq_id >= 0)")
    sections: list[_Section] = []
    while r.left() > 0:
        if len(sections) == MAX_SECTION:
            raise _error("corrupt", f"state blob corrupt: {r.left()} bytes follow section "
                         f"{MAX_SECTION - 1} at offset {r.off}")
        sections.append(_section_parse(r, seq_id, ext, len(sections)))
    if not sections:
        raise _error("truncated", "state blob truncated: it ends after its 8-byte header")
    return _Layout(buf, seq_id, ext, tuple(sections))


def _as_bytes_view(blob: BlobLike) -> memoryview:
    try:
        view = memoryview(blob)
    except TypeError:
        raise _error("argument", f"state blob must be bytes-like, not {type(blob).__name__}") from None
    if not view.contiguous:
        raise _error("argument", "state blob must be a contiguous bytes-like object")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def _layout_parse(blob: BlobLike) -> _Layout:
    """Parses a blob, detecting the undeclared ext record: without it first, then with it."""
    buf = _as_bytes_view(blob)
    try:
        return _blob_parse(buf, 0)
    except StateBlobError as first:
        try:
            return _blob_parse(buf, 1)
        except StateBlobError:
            raise first from None


def scan(blob: BlobLike) -> StateBlobInfo:
    """Validates a blob and describes it.

    Args:
        blob: bytes from ``llama_state_seq_get_data`` (or from :func:`splice`/:func:`relocate`).
    Returns:
        A :class:`StateBlobInfo`.
    Raises:
        StateBlobError: the blob is truncated, corrupt, not a sequence state, or a layout this
            module does not handle (cells in several streams, a whole-cache state).
    """
    lay = _layout_parse(blob)
    s0 = lay.sections[0]
    k0 = s0.k[0] if s0.k else None
    v0 = s0.v[0] if s0.v else None
    return StateBlobInfo(
        seq_id=lay.seq_id, n_section=len(lay.sections), n_stream=s0.n_stream, n_cell=s0.n_cell,
        pos_min=int(s0.positions.min()) if s0.n_cell else -1,
        pos_max=int(s0.positions.max()) if s0.n_cell else -1,
        cell_ext=bool(lay.cell_ext), v_trans=bool(s0.v_trans), n_layer=s0.n_layer,
        k_type=k0.type if k0 else -1, v_type=v0.type if v0 else -1,
        k_row_size=k0.row_size if k0 else 0, v_row_size=v0.row_size if v0 else 0)


def section_layers(blob: BlobLike) -> tuple[int, ...]:
    """Returns how many layers each KV cache (section) of the blob holds, in blob order.

    One section for most models; two for sliding-window (iswa) models: the
    full-attention layers, then the sliding-window ones, each in model order.
    """
    return tuple(sec.n_layer for sec in _layout_parse(blob).sections)


def section_cells(blob: BlobLike) -> tuple[int, ...]:
    """Returns how many cells each KV cache (section) of the blob holds, in blob order.

    A sliding-window section holds fewer than the full-attention one when llama.cpp
    left out cells a window behind the sequence's end.
    """
    return tuple(sec.n_cell for sec in _layout_parse(blob).sections)


def section_positions(blob: BlobLike) -> tuple[np.ndarray, ...]:
    """Returns the positions of each KV cache's (section's) cells, in blob order: int32 arrays, cell order.

    For checking what a stored blob holds (pc_cpu.store.cells): duplicates and strays are left
    in, as the blob has them; :func:`scan` reports only the extremes of the first section.
    """
    return tuple(sec.positions.copy() for sec in _layout_parse(blob).sections)


@dataclass(frozen=True)
class KRows:
    """Where one layer's K rows lie in a blob: n_cell rows of row_size bytes from byte `offset`."""

    section: int       # the KV cache (see section_layers)
    layer: int         # within the section
    type: int          # ggml_type (0 = F32, 1 = F16)
    offset: int
    n_cell: int
    row_size: int

    @property
    def size(self) -> int:
        return self.n_cell * self.row_size


def k_rows(blob: BlobLike) -> tuple[KRows, ...]:
    """Returns where every layer's K rows lie in the blob, section by section, layer by layer.

    For experiments and tests that read or change K in place (a view of the blob's bytes at
    `offset`); the cells' positions are section_positions(blob)[section], in the same cell order.
    """
    return tuple(KRows(s, i, rec.type, rec.data_off, sec.n_cell, rec.row_size)
                 for s, sec in enumerate(_layout_parse(blob).sections) for i, rec in enumerate(sec.k))


def layer_kv(blob: BlobLike, layer: int, *, section: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Returns (positions, K, V) of the `layer`-th layer of KV cache `section`: float32 arrays, one row per cell.

    For reading values (recompute selection), not part of the byte surface the C library mirrors.

    Raises:
        StateBlobError: the section or layer does not exist, or K/V are quantized (only F32 and
            F16 caches can be read).
    """
    lay = _layout_parse(blob)
    if not 0 <= section < len(lay.sections):
        raise _error("argument", f"KV cache {section} is not in a blob of {len(lay.sections)}")
    sec = lay.sections[section]
    if not 0 <= layer < sec.n_layer:
        raise _error("argument", f"layer {layer} is not in a KV cache of {sec.n_layer} layers")
    k = _rows(lay.buf, sec.k[layer], sec.n_cell, transposed=False)
    v = _rows(lay.buf, sec.v[layer], sec.n_cell, transposed=bool(sec.v_trans))
    return sec.positions.copy(), k, v


def _rows(buf: memoryview, rec: _Layer, n_cell: int, *, transposed: bool) -> np.ndarray:
    dtypes = {GGML_TYPE_F32: "<f4", GGML_TYPE_F16: "<f2"}
    if rec.type not in dtypes:
        raise _error("unsupported", f"state blob unsupported: ggml type {rec.type} (quantized KV cache); "
                     "only F32 and F16 caches can be read")
    dtype = np.dtype(dtypes[rec.type])
    count = rec.row_size * n_cell // dtype.itemsize
    data = np.frombuffer(buf, dtype=dtype, count=count, offset=rec.data_off)
    if transposed:  # element-major: n_embd rows of n_cell values
        return data.reshape(rec.n_embd, n_cell).T.astype(np.float32)
    return data.reshape(n_cell, -1).astype(np.float32)


# --- splice ----------------------------------------------------------------------------------

def _parse_all(blobs: Sequence[BlobLike]) -> list[_Layout]:
    layouts = []
    for i, blob in enumerate(blobs):
        try:
            layouts.append(_layout_parse(blob))
        except StateBlobError as e:
            raise _error(e.code, f"blob {i} of {len(blobs)}: {e}") from None
    return layouts


def _check_global(lays: list[_Layout]) -> None:
    """Every blob must come from the same kind of context (caches, streams, ext record)."""
    l0 = lays[0]
    ext_ref = next((i for i, lay in enumerate(lays) if lay.n_cell_total), len(lays) - 1)
    for i, lay in enumerate(lays[1:], start=1):
        if len(lay.sections) != len(l0.sections):
            raise _error("mismatch", f"cannot splice: blob {i} has {len(lay.sections)} KV caches, "
                         f"blob 0 has {len(l0.sections)}; splice blobs of one model only")
        if lay.n_cell_total and lay.cell_ext != lays[ext_ref].cell_ext:
            raise _error("mismatch", f"cannot splice: blob {i} and blob {ext_ref} disagree on the "
                         f"cell ext record; splice blobs of one model only")
        for s, (sec, sec0) in enumerate(zip(lay.sections, l0.sections)):
            if sec.n_stream != sec0.n_stream:
                raise _error("mismatch", f"cannot splice: section {s} of blob {i} has "
                             f"{sec.n_stream} streams, blob 0 has {sec0.n_stream}; save all "
                             f"blobs from contexts with the same n_seq_max and kv_unified")


def _same_layers(a: _Section, b: _Section) -> bool:
    return (a.v_trans == b.v_trans and a.n_layer == b.n_layer
            and all(x.key() == y.key() for x, y in zip(a.k + a.v, b.k + b.v)))


def _check_section(lays: list[_Layout], s: int) -> int:
    """Compares layouts and positions of section s; returns its size in the output."""
    secs = [lay.sections[s] for lay in lays]
    ref = next((i for i, sec in enumerate(secs) if sec.n_cell), None)
    for i, sec in enumerate(secs):
        if sec.n_cell and i != ref and not _same_layers(secs[ref], sec):
            raise _error("mismatch", f"cannot splice: section {s} of blob {i} differs from blob "
                         f"{ref} in layers, cache types or V layout (flash attention); splice "
                         f"blobs saved by identically configured contexts")
    total = sum(sec.n_cell for sec in secs)
    if total > 0xFFFFFFFF:
        raise _error("unsupported", f"cannot splice: {total} cells exceed a u32 cell count")
    _check_positions(secs, s, total)
    return _section_bytes(lays[0 if ref is None else ref], s, total)


def _check_positions(secs: list[_Section], s: int, total: int) -> None:
    if total < 2:
        return
    pos = np.sort(np.concatenate([sec.positions for sec in secs]))
    dup = np.flatnonzero(pos[1:] == pos[:-1])
    if dup.size:
        p = int(pos[dup[0]])
        owners = [i for i, sec in enumerate(secs) if (sec.positions == p).any()]
        raise _error("overlap", f"cannot splice: position {p} of section {s} is held by blobs "
                     f"{owners}; spliced modules need disjoint positions")


def _section_bytes(ref: _Layout, s: int, total: int) -> int:
    sec = ref.sections[s]
    n = 4 + 4 * sec.n_stream
    if total == 0:
        return n
    n += total * ref.cell_bytes + 8
    return n + sum(LAYER_HEADER_BYTES + rec.row_size * total for rec in sec.k + sec.v)


def _check_inputs(blobs: Sequence[BlobLike]) -> tuple[list[_Layout], int]:
    if len(blobs) == 0:
        raise _error("argument", "cannot splice: no blobs given; pass at least one")
    lays = _parse_all(blobs)
    _check_global(lays)
    need = 8 + sum(_check_section(lays, s) for s in range(len(lays[0].sections)))
    return lays, need


class _Writer:
    """Appends to a writable byte view sized by _check_inputs."""

    def __init__(self, out: memoryview):
        self.out = out
        self.off = 0

    def bytes(self, src: memoryview) -> None:
        self.out[self.off:self.off + len(src)] = src
        self.off += len(src)

    def u32(self, value: int) -> None:
        struct.pack_into("<I", self.out, self.off, value & 0xFFFFFFFF)
        self.off += 4


def _write_cells(w: _Writer, lays: list[_Layout], s: int, seq_id: int) -> None:
    """Cell records of every blob, each stamped with the output's sequence id."""
    full = [lay for lay in lays if lay.sections[s].n_cell]
    start, rec = w.off, full[0].cell_bytes  # blobs with cells share the ext record
    for lay in full:
        sec = lay.sections[s]
        w.bytes(lay.buf[sec.cells_off:sec.cells_off + sec.n_cell * rec])
    n_cell = (w.off - start) // rec
    cells = np.frombuffer(w.out, dtype="<i4", count=n_cell * rec // 4, offset=start)
    cells.reshape(n_cell, rec // 4)[:, -1] = seq_id


def _write_rows(w: _Writer, recs: list[tuple[_Layout, _Layer, int]]) -> None:
    for lay, rec, n_cell in recs:
        w.bytes(lay.buf[rec.data_off:rec.data_off + rec.row_size * n_cell])


def _write_elements(w: _Writer, recs: list[tuple[_Layout, _Layer, int]], total: int) -> None:
    """One transposed V layer: for each embedding element, every blob's run of cells."""
    el, n_embd = recs[0][1].el_size, recs[0][1].n_embd
    dst = np.frombuffer(w.out, dtype=np.uint8, count=n_embd * total * el, offset=w.off)
    dst = dst.reshape(n_embd, total * el)
    col = 0
    for lay, rec, n_cell in recs:
        src = np.frombuffer(lay.buf, dtype=np.uint8, count=n_embd * n_cell * el, offset=rec.data_off)
        dst[:, col:col + n_cell * el] = src.reshape(n_embd, n_cell * el)
        col += n_cell * el
    w.off += n_embd * total * el


def _write_stream(w: _Writer, lays: list[_Layout], s: int, ref: int, total: int) -> None:
    rs = lays[ref].sections[s]
    _write_cells(w, lays, s, lays[0].seq_id)
    w.u32(rs.v_trans)
    w.u32(rs.n_layer)
    full = [(lay, lay.sections[s]) for lay in lays if lay.sections[s].n_cell]
    for il in range(2 * rs.n_layer):
        is_v = il >= rs.n_layer
        pick = (lambda sec: sec.v[il - rs.n_layer]) if is_v else (lambda sec: sec.k[il])
        recs = [(lay, pick(sec), sec.n_cell) for lay, sec in full]
        head = recs[0][1].header_off
        w.bytes(lays[ref].buf[head:head + LAYER_HEADER_BYTES])
        if is_v and rs.v_trans:
            _write_elements(w, recs, total)
        else:
            _write_rows(w, recs)


def _write_section(w: _Writer, lays: list[_Layout], s: int) -> None:
    """n_stream, every stream's cell count; the first non-empty blob's stream gets all cells."""
    ref = next((i for i, lay in enumerate(lays) if lay.sections[s].n_cell), None)
    total = sum(lay.sections[s].n_cell for lay in lays)
    n_stream = lays[0].sections[s].n_stream
    target = None if ref is None else lays[ref].sections[s].stream
    w.u32(n_stream)
    for st in range(n_stream):
        w.u32(total if st == target else 0)
        if st == target:
            _write_stream(w, lays, s, ref, total)


def _write(lays: list[_Layout], need: int, out: memoryview) -> None:
    w = _Writer(out)
    w.u32(MAGIC)
    w.u32(lays[0].seq_id)
    for s in range(len(lays[0].sections)):
        _write_section(w, lays, s)
    assert w.off == need, "splice size and writer disagree"


def splice(blobs: Sequence[BlobLike]) -> bytearray:
    """Merges single-sequence blobs into one blob that one ``llama_state_seq_set_data`` restores.

    Per KV cache: the cells of blob 0, then blob 1, ..., in one stream; K rows and V rows (or
    V elements, when transposed) concatenated in the same order; every cell and the header
    carry blob 0's sequence id (set_data ignores it).

    Args:
        blobs: blobs saved from identically configured contexts of one model, whose cells hold
            pairwise distinct positions.
    Returns:
        The spliced blob.
    Raises:
        StateBlobError: a blob is invalid ("blob i of n: ..."), the blobs differ in layout
            ("mismatch"), or two cells share a position ("overlap").
    """
    lays, need = _check_inputs(blobs)
    out = bytearray(need)
    _write(lays, need, memoryview(out))
    return out


# --- order -----------------------------------------------------------------------------------

def order_by_position(blob: BlobLike) -> BlobLike:
    """Returns `blob` with each KV cache's cells (records, K rows, V rows or V elements) sorted by position.

    ``llama_state_seq_set_data`` puts a blob's cells into a sequence's empty stream in blob
    order, from slot 0; attention then sums them in that order. Sorted, a restored prompt
    sits in its stream exactly as a fresh prefill of the same tokens would, which is what
    makes cached and fresh results bit-identical (pc_cpu.engine.cells.streams). A blob that is
    already sorted is returned as it is, uncopied.

    Raises:
        StateBlobError: the blob is invalid, or two cells of one cache share a position.
    """
    lay = _layout_parse(blob)
    orders = []
    for index, sec in enumerate(lay.sections):
        order = np.argsort(sec.positions, kind="stable")
        if np.any(np.diff(sec.positions[order]) == 0):
            raise _error("overlap", f"cannot order: section {index} holds two cells at one position")
        orders.append(order)
    if all(np.array_equal(order, np.arange(len(order))) for order in orders):
        return blob
    out = bytearray(lay.buf)
    for sec, order in zip(lay.sections, orders):
        if sec.n_cell == 0:
            continue
        _permute_rows(out, lay.buf, sec.cells_off, lay.cell_bytes, order)
        for rec in sec.k:
            _permute_rows(out, lay.buf, rec.data_off, rec.row_size, order)
        for rec in sec.v:
            if sec.v_trans:  # element-major: n_embd rows of n_cell elements
                src = np.frombuffer(lay.buf, np.uint8, rec.n_embd * sec.n_cell * rec.el_size, rec.data_off)
                dst = np.frombuffer(out, np.uint8, rec.n_embd * sec.n_cell * rec.el_size, rec.data_off)
                dst.reshape(rec.n_embd, sec.n_cell, rec.el_size)[:] = \
                    src.reshape(rec.n_embd, sec.n_cell, rec.el_size)[:, order, :]
            else:
                _permute_rows(out, lay.buf, rec.data_off, rec.row_size, order)
    return out


def graft_cells(base: BlobLike, donor: BlobLike, layers: Sequence[int], positions: Sequence[int], *,
                parts: str = "kv") -> bytearray:
    """Returns a copy of `base` whose K and/or V of `layers`, at the cells of `positions`, are `donor`'s.

    For finding where two computations of the same tokens differ in effect (bench/document_cell_swaps.py):
    the cached cells of a prompt with some layers or positions taken from its full prefill. Both
    blobs must hold the same positions in the same cell order (order_by_position both first) and
    the same layer records; `parts` is "k", "v" or "kv".

    Raises:
        StateBlobError: the blobs do not match, or a layer is not in them.
    """
    if parts not in ("k", "v", "kv"):
        raise _error("argument", f"parts={parts!r}: use 'k', 'v' or 'kv'")
    lb, ld = _layout_parse(base), _layout_parse(donor)
    if len(lb.sections) != len(ld.sections):
        raise _error("argument", "the blobs hold different KV caches")
    out = bytearray(lb.buf)
    for sb, sd in zip(lb.sections, ld.sections):
        if not np.array_equal(sb.positions, sd.positions) or sb.n_layer != sd.n_layer or sb.v_trans != sd.v_trans:
            raise _error("argument", "the blobs hold different cells: order both by position, from the same tokens")
        rows = np.nonzero(np.isin(sb.positions, np.asarray(list(positions), dtype=np.int64)))[0]
        for layer in layers:
            if not 0 <= layer < sb.n_layer:
                raise _error("argument", f"layer {layer} is not in a KV cache of {sb.n_layer} layers")
        chosen = ([(sb.k[i], sd.k[i], False) for i in layers] if "k" in parts else []) + \
                 ([(sb.v[i], sd.v[i], bool(sb.v_trans)) for i in layers] if "v" in parts else [])
        for rb, rd, transposed in chosen:
            if rb.key() != rd.key():
                raise _error("argument", "the blobs' layer records differ (type or row size)")
            shape = (rb.n_embd, sb.n_cell, rb.el_size) if transposed else (sb.n_cell, rb.row_size)
            size = sb.n_cell * rb.row_size
            dst = np.frombuffer(out, np.uint8, size, rb.data_off).reshape(shape)
            src = np.frombuffer(ld.buf, np.uint8, size, rd.data_off).reshape(shape)
            if transposed:
                dst[:, rows] = src[:, rows]
            else:
                dst[rows] = src[rows]
    return out


def order_in_place(blob: bytearray | memoryview) -> None:
    """Sorts each KV cache's cells of a writable blob by position, where it lies (see :func:`order_by_position`).

    For a blob read into a buffer the caller reuses (pc_cpu.engine.cells.streams.move_to_stream): no
    new 10-100 MB buffer to map, which costs more than the sort.

    Raises:
        StateBlobError: as :func:`order_by_position` (the blob is then unchanged); "argument" when
            `blob` is not writable.
    """
    try:
        view = memoryview(blob)
    except TypeError:
        view = None
    if view is None or view.readonly or not view.contiguous:
        raise _error("argument", "a blob sorted in place must be a writable, contiguous buffer (a bytearray)")
    view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
    ordered = order_by_position(view)
    if ordered is not view:
        view[:] = ordered


def _permute_rows(out: bytearray, buf: memoryview, offset: int, row_size: int, order: np.ndarray) -> None:
    """Writes the len(order) rows of `row_size` bytes at `offset` of `buf` into `out`, in `order`."""
    n = len(order)
    src = np.frombuffer(buf, np.uint8, n * row_size, offset).reshape(n, row_size)
    np.frombuffer(out, np.uint8, n * row_size, offset).reshape(n, row_size)[:] = src[order]


def restream(blob: BlobLike, n_stream: int) -> bytearray:
    """Returns `blob` rewritten for a context with `n_stream` KV streams (its cells in the first).

    llama.cpp refuses a state whose stream count differs from the context's, but restores a
    sequence's cells into that sequence's own stream whichever stream they were saved from;
    so a blob saved from the unified library context (1 stream) restores into a prompt
    context (one stream per sequence) once its counts are rewritten.
    """
    if not 1 <= n_stream <= MAX_STREAM:
        raise _error("argument", f"n_stream={n_stream}: must be 1..{MAX_STREAM}")
    lay = _layout_parse(blob)
    out = bytearray(lay.buf[:8])  # magic, sequence id
    for sec in lay.sections:
        out += struct.pack("<II", n_stream, sec.n_cell)
        if sec.n_cell:
            last = sec.v[-1] if sec.v else sec.k[-1] if sec.k else None
            end = last.data_off + last.row_size * sec.n_cell if last else sec.cells_off + sec.n_cell * lay.cell_bytes + 8
            out += lay.buf[sec.cells_off:end]
        out += bytes(4 * (n_stream - 1))
    return out


STREAM_COUNT_OFFSET = 8  # after the magic and the sequence id: the first cache's stream count


def assemble_into(blobs: Sequence[BlobLike], deltas: Sequence[int], rope: RopeParams | tuple[RopeParams, ...] | None,
                  n_stream: int, out: bytearray) -> int:
    """Writes one restore blob for a context of `n_stream` streams, blob i moved by deltas[i], all spliced, at the start of `out`.

    The same bytes as relocating each moved blob, splicing them and restreaming the result; the
    C library (pc_state_assemble) does it in one pass, without the relocated copies. `rope` is
    used only for blobs that move (deltas[i] != 0). Reuse `out` across prompts: a fresh 100 MB
    buffer costs more to map than the assembly itself.

    Returns:
        The bytes written; `out` is grown when too small.
    Raises:
        StateBlobError: as those steps do, a malformed blob first; "argument" for mismatched
            lengths, n_stream outside 1..256, or `out` not a bytearray.
    """
    if not isinstance(out, bytearray):
        raise _error("argument", f"output must be a bytearray (it may be grown), not {type(out).__name__}")
    if len(deltas) != len(blobs) or not blobs:
        raise _error("argument", f"cannot assemble: {len(blobs)} blobs and {len(deltas)} deltas")
    if not 1 <= n_stream <= MAX_STREAM:
        raise _error("argument", f"n_stream={n_stream}: must be 1..{MAX_STREAM}")
    _parse_all(blobs)  # a malformed blob is reported before a bad move, as the C library does
    moved = [relocate(blob, delta, rope) if delta else blob for blob, delta in zip(blobs, deltas)]
    result = restream(splice(moved), n_stream)
    if len(result) > len(out):
        out.extend(bytes(len(result) - len(out)))
    out[:len(result)] = result
    return len(result)


# --- relocate --------------------------------------------------------------------------------

def _rope_error(rope: RopeParams) -> str | None:
    """Why rope is invalid, or None. freq_* are judged as the float32 the C library gets."""
    with np.errstate(over="ignore"):
        base, scale = np.float32(rope.freq_base), np.float32(rope.freq_scale)
    if not 0 < rope.n_head_kv <= MAX_HEAD:
        return f"n_head_kv={rope.n_head_kv} must be in 1..{MAX_HEAD}"
    if not 0 < rope.head_dim <= MAX_HEAD:
        return f"head_dim={rope.head_dim} must be in 1..{MAX_HEAD}"
    if not (0 < rope.n_rot <= min(rope.head_dim, MAX_ROT) and rope.n_rot % 2 == 0):
        return f"n_rot={rope.n_rot} must be even and in 2..min(head_dim={rope.head_dim}, {MAX_ROT})"
    if rope.mode not in (RopeMode.NORMAL, RopeMode.NEOX):
        return f"mode={rope.mode} must be RopeMode.NORMAL (0) or RopeMode.NEOX (2)"
    if not (math.isfinite(base) and base > 0 and math.isfinite(scale) and scale > 0):
        return f"freq_base={rope.freq_base} and freq_scale={rope.freq_scale} must be finite and > 0"
    return None


def _check_k_layers(sec: _Section, rope: RopeParams) -> None:
    n_el = rope.n_head_kv * rope.head_dim
    for il, rec in enumerate(sec.k):
        if rec.type not in (GGML_TYPE_F32, GGML_TYPE_F16):
            raise _error("unsupported", f"cannot relocate: K of layer {il} has ggml type "
                         f"{rec.type}; only F32 (0) and F16 (1) caches can be re-rotated")
        el = 2 if rec.type == GGML_TYPE_F16 else 4
        if rec.row_size != n_el * el:
            raise _error("argument", f"cannot relocate: K of layer {il} has {rec.row_size}-byte "
                         f"rows, rope describes n_head_kv={rope.n_head_kv} x head_dim="
                         f"{rope.head_dim} x {el} = {n_el * el} bytes; pass the model's rope")


def _check_relocate(lay: _Layout, delta: int, rope) -> tuple[RopeParams, ...]:
    """Returns one rope per KV cache of the blob, after checking that every cache can be moved by delta."""
    if lay.cell_ext:
        raise _error("unsupported", "cannot relocate: the blob has M-RoPE ext records, which cannot be "
                     "re-rotated")
    ropes = rope if isinstance(rope, tuple) and rope and all(isinstance(r, RopeParams) for r in rope) else None
    if len(lay.sections) > 1 and (ropes is None or len(ropes) == 1):
        raise _error("unsupported", f"cannot relocate: blob has {len(lay.sections)} KV caches; give one "
                     "rope per cache (an iswa model rotates its caches with different bases)")
    if ropes is None:
        if not isinstance(rope, RopeParams):
            raise _error("argument", f"cannot relocate: rope must be RopeParams, not {type(rope).__name__}")
        ropes = (rope,)
    if len(ropes) != len(lay.sections):
        raise _error("argument", f"cannot relocate: {len(ropes)} ropes for {len(lay.sections)} KV caches")
    for r in ropes:
        why = _rope_error(r)
        if why:
            raise _error("argument", f"cannot relocate: invalid rope: {why}")
    for sec, r in zip(lay.sections, ropes):
        if sec.n_cell == 0:
            continue
        lo, hi = int(sec.positions.min()), int(sec.positions.max())
        if lo + delta < 0 or hi + delta > INT32_MAX:
            raise _error("argument", f"cannot relocate: positions {lo}..{hi} moved by {delta} leave "
                         f"0..{INT32_MAX}")
        _check_k_layers(sec, r)
    return ropes


def rope_table(delta: int, rope: RopeParams) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin (float32, n_rot/2 each) of every rotated pair for a shift of delta.

    Float32 steps as ggml's ggml_rope_cache_init; cos, sin and the power in double, rounded
    to float32, exactly as native/pc_relocate.c computes them.
    """
    n_pairs = rope.n_rot // 2
    exponent = float(np.float32(-2.0) / np.float32(rope.n_rot))
    theta_scale = np.float32(math.pow(float(np.float32(rope.freq_base)), exponent))
    scale = np.float32(rope.freq_scale)
    theta = np.float32(delta)
    cos_t, sin_t = np.empty(n_pairs, np.float32), np.empty(n_pairs, np.float32)
    for i in range(n_pairs):
        angle = scale * theta
        cos_t[i], sin_t[i] = math.cos(float(angle)), math.sin(float(angle))
        theta = theta * theta_scale
    return cos_t, sin_t


def _pair_indices(rope: RopeParams) -> tuple[np.ndarray, np.ndarray]:
    i = np.arange(rope.n_rot // 2)
    if rope.mode == RopeMode.NEOX:
        return i, i + rope.n_rot // 2
    return 2 * i, 2 * i + 1


def _rotate_k(buf: bytearray, rec: _Layer, n_cell: int, rope: RopeParams,
              cos_t: np.ndarray, sin_t: np.ndarray) -> None:
    dtype = "<f2" if rec.type == GGML_TYPE_F16 else "<f4"
    k = np.frombuffer(buf, dtype=dtype, count=n_cell * rope.n_head_kv * rope.head_dim,
                      offset=rec.data_off).reshape(n_cell, rope.n_head_kv, rope.head_dim)
    a, b = _pair_indices(rope)
    x0, x1 = k[:, :, a].astype(np.float32), k[:, :, b].astype(np.float32)
    with np.errstate(all="ignore"):  # inf and NaN in K are carried along, as llama.cpp does
        # two roundings per product, none fused: the C library is built with -ffp-contract=off
        y0, y1 = x0 * cos_t - x1 * sin_t, x0 * sin_t + x1 * cos_t
        # which NaN payload an add of two NaNs keeps differs between SIMD loops: use one NaN
        for y in (y0, y1):
            y[np.isnan(y)] = np.nan  # float32 0x7fc00000, F16 0x7e00
        k[:, :, a], k[:, :, b] = y0.astype(dtype), y1.astype(dtype)


def relocate(blob: BlobLike, delta: int, rope: RopeParams | tuple[RopeParams, ...]) -> bytearray:
    """Moves every cell of a blob by delta positions, re-rotating K as llama.cpp's K-shift does.

    This places a module encoded at positions [p, p+n) at [p+delta, p+n+delta).

    Args:
        blob: a blob with F16 or F32 K (not changed).
        delta: positions to add, an int32.
        rope: the model's RoPE parameters; for a blob of several KV caches (an iswa model's base
            and sliding-window caches), a tuple of one per cache, in the blob's order.
    Returns:
        The relocated copy.
    Raises:
        StateBlobError: the blob is invalid, the rope does not fit it ("argument"), a position
            would leave [0, 2**31), or K is quantized / the blob has several caches and one
            rope ("unsupported").
    """
    if not -2**31 <= delta <= INT32_MAX:
        raise _error("argument", f"cannot relocate: delta {delta} is not an int32")
    out = bytearray(_as_bytes_view(blob))
    lay = _layout_parse(out)
    ropes = _check_relocate(lay, delta, rope)
    if delta == 0:
        return out
    for sec, r in zip(lay.sections, ropes):
        if sec.n_cell == 0:
            continue
        cells = np.frombuffer(out, dtype="<i4", count=sec.n_cell * lay.cell_bytes // 4,
                              offset=sec.cells_off).reshape(sec.n_cell, lay.cell_bytes // 4)
        cells[:, 0] += np.int32(delta)
        cos_t, sin_t = rope_table(delta, r)
        for rec in sec.k:
            _rotate_k(out, rec, sec.n_cell, r, cos_t, sin_t)
    return out


def with_sequence(blob: BlobLike, seq_id: int) -> bytearray:
    """Returns a copy of `blob` whose header and cells name sequence `seq_id` (bytes otherwise unchanged).

    llama.cpp writes the id of the sequence a state was saved from, and ignores it when it
    restores into another (it discards each cell's id); so the id carries no meaning, but it
    makes the same cells saved from two workspaces two byte strings. Encoders write id 0,
    so an encoding's bytes depend on its tokens alone.
    """
    lay = _layout_parse(blob)
    out = bytearray(lay.buf)
    struct.pack_into("<i", out, 4, seq_id)
    for sec in lay.sections:
        ids = sec.cells_off + lay.cell_bytes - 4 + lay.cell_bytes * np.arange(sec.n_cell)  # each cell's last field
        for offset in ids.tolist():
            struct.pack_into("<i", out, offset, seq_id)
    return out
