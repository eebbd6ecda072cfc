"""relocate(): moving a module blob to other positions, checked against llama.cpp's own K-shift."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from pc_cpu.errors import StateBlobError
from pc_cpu.kvstate import native, state_blob
from pc_cpu.kvstate.rope import RopeMode

from .conftest import GGML_F16, GGML_F32, BlobSpec, make_blob

needs_native = pytest.mark.skipif(not native.available(), reason="libpc_native not built")


def _cells_and_k(blob: bytes, n_head_kv: int, head_dim: int):
    """(positions, K of every layer as float64 (n_layer, n_cell, n_head_kv, head_dim), V bytes)."""
    info = state_blob.scan(blob)
    n, dtype = info.n_cell, "<f2" if info.k_type == GGML_F16 else "<f4"
    positions = np.frombuffer(blob, "<i4", n * 3, 16).reshape(n, 3)[:, 0]
    off, ks = 16 + 12 * n + 8, []
    for _ in range(info.n_layer):
        k = np.frombuffer(blob, dtype, n * n_head_kv * head_dim, off + 12)
        ks.append(k.reshape(n, n_head_kv, head_dim))
        off += 12 + n * info.k_row_size
    return positions, np.stack(ks), blob[off:]


def _reference_rotation(k: np.ndarray, delta: int, rope) -> np.ndarray:
    """RoPE by delta in float64, straight from the formula."""
    i = np.arange(rope.n_rot // 2)
    theta = delta * rope.freq_base ** (-2.0 * i / rope.n_rot) * rope.freq_scale
    a = i if rope.mode == RopeMode.NEOX else 2 * i
    b = a + rope.n_rot // 2 if rope.mode == RopeMode.NEOX else 2 * i + 1
    out = k.astype(np.float64).copy()
    x0, x1 = out[..., a].copy(), out[..., b].copy()
    out[..., a] = x0 * np.cos(theta) - x1 * np.sin(theta)
    out[..., b] = x0 * np.sin(theta) + x1 * np.cos(theta)
    return out


def _f16_ulps(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Distance in F16 ulps (sign-magnitude bits mapped to a monotonic integer line)."""
    def line(v):
        bits = np.asarray(v, "<f2").view("<u2").astype(np.int32)
        return np.where(bits & 0x8000, 0x8000 - bits, bits)
    return np.abs(line(x) - line(y))


@pytest.mark.parametrize("k_type", [GGML_F16, GGML_F32], ids=["f16", "f32"])
@pytest.mark.parametrize("mode, n_rot", [(RopeMode.NORMAL, 8), (RopeMode.NEOX, 8), (RopeMode.NEOX, 4)])
def test_relocate_rotates_k_by_the_rope_formula(impl, k_type, mode, n_rot):
    spec = BlobSpec(positions=(3, 4, 10), k_type=k_type)
    rope = spec.rope(mode, n_rot)
    blob = make_blob(spec)
    out = impl.relocate(blob, 25, rope)
    pos0, k0, v0 = _cells_and_k(blob, spec.n_head_kv, spec.head_dim)
    pos1, k1, v1 = _cells_and_k(bytes(out), spec.n_head_kv, spec.head_dim)
    assert list(pos1) == [28, 29, 35] and v1 == v0  # V does not depend on position
    expected = _reference_rotation(k0, 25, rope)
    tol = 1e-3 if k_type == GGML_F16 else 1e-5
    np.testing.assert_allclose(k1, expected, rtol=tol, atol=tol * 4)
    assert np.array_equal(k1[..., n_rot:], k0[..., n_rot:])  # dims past n_rot stay


def test_relocate_by_zero_changes_nothing(impl):
    blob = make_blob()
    assert bytes(impl.relocate(blob, 0, BlobSpec().rope())) == blob


def test_relocate_there_and_back(impl):
    spec = BlobSpec(positions=tuple(range(100, 140)), k_type=GGML_F32)
    blob = make_blob(spec)
    back = impl.relocate(impl.relocate(blob, 3000, spec.rope()), -3000, spec.rope())
    _, k0, _ = _cells_and_k(blob, 2, 8)
    _, k1, _ = _cells_and_k(bytes(back), 2, 8)
    np.testing.assert_allclose(k1, k0, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spec, delta, rope_change, code", [
    (BlobSpec(k_type=8), 5, {}, "unsupported"),                  # Q8_0 K
    (BlobSpec(n_section=2), 5, {}, "unsupported"),               # iswa: two RoPE bases
    (BlobSpec(ext=True), 5, {}, "unsupported"),                  # M-RoPE ext records
    (BlobSpec(), 5, {"head_dim": 16}, "argument"),               # rope does not fit the rows
    (BlobSpec(), 5, {"n_rot": 7}, "argument"),
    (BlobSpec(), 5, {"mode": 1}, "argument"),
    (BlobSpec(), 5, {"freq_base": float("nan")}, "argument"),
    (BlobSpec(), 5, {"n_head_kv": 2**40}, "argument"),
    (BlobSpec(positions=(3, 4)), -4, {}, "argument"),           # position -1
    (BlobSpec(positions=(3, 2**31 - 3)), 5, {}, "argument"),    # past INT32_MAX
    (BlobSpec(), 2**31, {}, "argument"),                         # delta not an int32
], ids=["q8_0", "iswa", "ext", "row_size", "odd_rot", "mode", "nan_base", "huge_heads",
        "negative_pos", "pos_overflow", "delta_overflow"])
def test_relocate_refuses(impl, spec, delta, rope_change, code):
    blob = make_blob(spec)
    rope = dataclasses.replace(spec.rope(), **rope_change)
    with pytest.raises(StateBlobError) as e:
        impl.relocate(blob, delta, rope)
    assert e.value.code == code


@pytest.fixture(params=["simd", "portable"])
def c_path(request, monkeypatch):
    """Runs a test on the C library's F16C path (where the CPU has it) and on its portable one."""
    if request.param == "portable":
        monkeypatch.setenv("PC_NATIVE_PORTABLE", "1")
    else:
        monkeypatch.delenv("PC_NATIVE_PORTABLE", raising=False)
    return request.param


@needs_native
@pytest.mark.parametrize("k_type", [GGML_F16, GGML_F32], ids=["f16", "f32"])
@pytest.mark.parametrize("mode, n_rot", [(RopeMode.NORMAL, 8), (RopeMode.NEOX, 8), (RopeMode.NEOX, 6),
                                         (RopeMode.NORMAL, 20), (RopeMode.NEOX, 16), (RopeMode.NORMAL, 16)])
def test_numpy_and_native_relocate_agree_on_synthetic_blobs(k_type, mode, n_rot, c_path):
    # head_dim 24: 8-wide steps and a tail; n_rot 16 turns whole 8-wide steps in registers (both modes)
    spec = BlobSpec(positions=tuple(range(100, 150)), k_type=k_type, head_dim=24)
    rope = dataclasses.replace(spec.rope(mode, n_rot), freq_base=500000.0, freq_scale=0.25)
    blob = make_blob(spec)
    for delta in (1, -50, 77, 4095, 1 << 20):
        assert bytes(native.relocate(blob, delta, rope)) == bytes(state_blob.relocate(blob, delta, rope))


def _with_special_k(blob: bytes, spec: BlobSpec) -> bytes:
    """Returns `blob` with its K values cycling through F16/F32 edge cases: NaNs, infinities,
    zeros of both signs, subnormals, the largest finite values and values that round to them."""
    f16 = np.array([0x7e00, 0xfe01, 0x7c00, 0xfc00, 0x0000, 0x8000, 0x0001, 0x83ff, 0x0400, 0x7bff,
                    0xfbff, 0x3c00, 0x3555], "<u2").view("<f2")
    special = f16.astype(np.float32) if spec.k_type == GGML_F32 else f16
    if spec.k_type == GGML_F32:
        special = np.concatenate([special, np.array([3.4e38, -1e-45, 65520.0, 1e-8], np.float32)])
    dtype = "<f2" if spec.k_type == GGML_F16 else "<f4"
    out = bytearray(blob)
    n = len(spec.positions) * spec.n_head_kv * spec.head_dim
    off = 16 + 12 * len(spec.positions) + 8
    for _ in range(spec.n_layer):
        values = np.resize(special, n).astype(dtype)
        np.random.default_rng(off).shuffle(values)
        out[off + 12: off + 12 + values.nbytes] = values.tobytes()
        off += 12 + values.nbytes
    return bytes(out)


@needs_native
@pytest.mark.parametrize("k_type", [GGML_F16, GGML_F32], ids=["f16", "f32"])
@pytest.mark.parametrize("mode", [RopeMode.NORMAL, RopeMode.NEOX])
def test_numpy_and_native_relocate_agree_on_special_values(k_type, mode, c_path):
    # The C conversions are branch-free so that they vectorize; every edge case must still round
    # exactly as numpy does.
    spec = BlobSpec(positions=tuple(range(10, 47)), k_type=k_type, head_dim=16)
    blob = _with_special_k(make_blob(spec), spec)
    rope = spec.rope(mode)
    for delta in (1, -7, 3001):
        assert bytes(native.relocate(blob, delta, rope)) == bytes(state_blob.relocate(blob, delta, rope))


@needs_native
def test_numpy_and_native_relocate_agree_on_real_blobs(real_blobs, smollm2):
    neox = dataclasses.replace(smollm2.rope, mode=RopeMode.NEOX, n_rot=32)
    for blob in (real_blobs.a, real_blobs.b):
        for rope in (smollm2.rope, neox):
            for delta in (17, 400, 4000):
                assert bytes(native.relocate(blob, delta, rope)) == bytes(state_blob.relocate(blob, delta, rope))


@pytest.mark.parametrize("k_type", [GGML_F16, GGML_F32], ids=["f16", "f32"])
@pytest.mark.parametrize("flash_attn", [False, True], ids=["fa_off", "fa_on"])
@pytest.mark.parametrize("start, delta", [(0, 137), (300, -250)])
def test_relocate_matches_llama_k_shift(impl, rig_factory, smollm2, k_type, flash_attn, start, delta):
    """Our relocation of a module vs llama_memory_seq_add on the same cells."""
    rig = rig_factory(flash_attn=flash_attn, type_k=k_type, type_v=k_type)
    tokens = smollm2.tokens("A module encoded once and placed elsewhere in the prompt later on.")
    rig.decode(tokens, start, 1)
    before = rig.get(1)
    rig.seq_add(1, delta)
    rig.decode(tokens[:1], 0, 2)  # the K-shift is lazy: the next decode applies it
    shifted = rig.get(1)
    assert rig.pos_range(1) == (start + delta, start + delta + len(tokens) - 1)

    ours = bytes(impl.relocate(before, delta, smollm2.rope))
    rope = smollm2.rope
    pos_l, k_l, v_l = _cells_and_k(shifted, rope.n_head_kv, rope.head_dim)
    pos_o, k_o, v_o = _cells_and_k(ours, rope.n_head_kv, rope.head_dim)
    assert np.array_equal(pos_o, pos_l) and v_o == v_l
    if k_type == GGML_F16:
        assert _f16_ulps(k_o, k_l).max() <= 2
    else:
        np.testing.assert_allclose(k_o, k_l, rtol=1e-5, atol=1e-5)
    assert len(ours) == len(shifted)


def test_a_blob_of_two_caches_turns_each_with_its_own_rope(impl):
    # An iswa model's state: the base cache, then the sliding-window cache, rotated with
    # different RoPE bases. Each section must equal a one-cache relocation with its own rope.
    spec = BlobSpec(positions=tuple(range(20, 36)), n_section=2)
    blob = make_blob(spec)
    base = dataclasses.replace(spec.rope(), freq_base=1_000_000.0)
    window = spec.rope()
    out = bytes(impl.relocate(blob, 77, (base, window)))
    one = make_blob(dataclasses.replace(spec, n_section=1))  # the same first section (same seed)
    half = len(blob[8:]) // 2  # both sections have the same size here
    assert blob[8:8 + half] == one[8:]
    assert out[8:8 + half] == bytes(impl.relocate(one, 77, base))[8:]
    second = blob[:8] + blob[8 + half:]
    assert out[8 + half:] == bytes(impl.relocate(second, 77, window))[8:]


@pytest.mark.parametrize("ropes, code", [(1, "unsupported"), (3, "argument")])
def test_a_blob_of_two_caches_needs_one_rope_each(impl, ropes, code):
    spec = BlobSpec(n_section=2)
    with pytest.raises(StateBlobError) as e:
        impl.relocate(make_blob(spec), 5, tuple([spec.rope()] * ropes))
    assert e.value.code == code


@needs_native
def test_numpy_and_native_relocate_agree_on_two_caches():
    spec = BlobSpec(positions=tuple(range(3, 40)), n_section=2, k_type=GGML_F16)
    blob = _with_special_k(make_blob(spec), dataclasses.replace(spec, n_section=1))
    ropes = (dataclasses.replace(spec.rope(), freq_base=1_000_000.0), spec.rope(RopeMode.NEOX))
    for delta in (1, -3, 5000):
        assert bytes(native.relocate(blob, delta, ropes)) == bytes(state_blob.relocate(blob, delta, ropes))
