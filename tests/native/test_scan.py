"""scan(): describing a blob, on synthetic blobs and on blobs written by llama.cpp."""

from __future__ import annotations

import pytest

from pc_cpu.errors import StateBlobError
from pc_cpu.kvstate import native, state_blob
from pc_cpu.kvstate.state_blob import StateBlobInfo

from .conftest import GGML_F16, GGML_F32, BlobSpec, make_blob


@pytest.mark.parametrize("spec, expected", [
    (BlobSpec(), StateBlobInfo(0, 1, 1, 3, 0, 2, False, False, 2, GGML_F16, GGML_F16, 32, 32)),
    (BlobSpec(positions=(9, 4, 30), seq_id=5, k_type=GGML_F32, v_trans=True),
     StateBlobInfo(5, 1, 1, 3, 4, 30, False, True, 2, GGML_F32, GGML_F16, 64, 32)),
    (BlobSpec(n_stream=4, stream=2, ext=True),
     StateBlobInfo(0, 1, 4, 3, 0, 2, True, False, 2, GGML_F16, GGML_F16, 32, 32)),
    (BlobSpec(n_section=2), StateBlobInfo(0, 1 + 1, 1, 3, 0, 2, False, False, 2, 1, 1, 32, 32)),
    (BlobSpec(positions=()), StateBlobInfo(0, 1, 1, 0, -1, -1, False, False, 0, -1, -1, 0, 0)),
], ids=["f16", "f32_vtrans_unordered", "streams_ext", "iswa", "empty"])
def test_scan_describes_synthetic_blob(impl, spec, expected):
    assert impl.scan(make_blob(spec)) == expected


def test_scan_reports_the_problem(impl):
    blob = make_blob()
    with pytest.raises(StateBlobError) as e:
        impl.scan(b"\x00" * 4 + blob[4:])
    assert e.value.code == "bad_magic"
    with pytest.raises(StateBlobError) as e:
        impl.scan(blob[:-1])
    assert e.value.code == "truncated"
    with pytest.raises(StateBlobError) as e:
        impl.scan(blob + b"\x01")
    assert e.value.code in ("truncated", "corrupt")


def test_scan_refuses_a_blob_of_another_sequence_per_cell(impl):
    spec = BlobSpec(seq_id=3)
    blob = bytearray(make_blob(spec))
    blob[16 + 8] = 4  # first cell's seq_id: 3 -> 4
    with pytest.raises(StateBlobError) as e:
        impl.scan(blob)
    assert e.value.code == "corrupt"


def test_numpy_message_says_what_is_wrong():
    with pytest.raises(StateBlobError, match=r"magic 0x00000000, expected 0xaf143cd8"):
        state_blob.scan(b"\x00" * 16)
    with pytest.raises(StateBlobError, match=r"V of layer 0 declares 3 cells of 32 bytes at offset 288, 4 bytes left"):
        state_blob.scan(make_blob()[:-200])


@pytest.mark.skipif(not native.available(), reason="libpc_native not built")
def test_native_message_names_the_status():
    with pytest.raises(StateBlobError, match=r"truncated.*pc_status -1"):
        native.scan(make_blob()[:10])


def test_scan_of_real_blobs(impl, real_blobs, smollm2):
    rope = smollm2.rope
    row = rope.n_head_kv * rope.head_dim * 2  # F16 bytes per cell
    a, b = impl.scan(real_blobs.a), impl.scan(real_blobs.b)
    assert a == StateBlobInfo(seq_id=1, n_section=1, n_stream=1, n_cell=real_blobs.n_a, pos_min=0,
                              pos_max=real_blobs.n_a - 1, cell_ext=False,
                              v_trans=not real_blobs.flash_attn, n_layer=30, k_type=GGML_F16,
                              v_type=GGML_F16, k_row_size=row, v_row_size=row)
    assert (b.seq_id, b.n_cell, b.pos_min, b.pos_max) == (
        2, real_blobs.n_b, real_blobs.n_a, real_blobs.n_a + real_blobs.n_b - 1)


@pytest.mark.skipif(not native.available(), reason="libpc_native not built")
def test_numpy_and_native_scan_agree_on_real_blobs(real_blobs):
    for blob in (real_blobs.a, real_blobs.b):
        assert native.scan(blob) == state_blob.scan(blob)
