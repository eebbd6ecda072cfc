"""Gives a loaded GGUF model: tokenizer, chat template and shape (one owner of llama_model*)."""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path

import llama_cpp

from pc_cpu import crash_guard
from pc_cpu.engine.llama import extra_buffers
from pc_cpu.engine.llama.architecture import ArchitectureFacts, refusal
from pc_cpu.engine.llama.log import set_llama_verbose
from pc_cpu.errors import ModelError, ModelLoadError, UnsupportedModelError
from pc_cpu.kvstate.rope import RopeMode, RopeParams

log = logging.getLogger(__name__)

# Sliding-window architectures whose llama.cpp loader leaves the window layers' RoPE at
# rope.freq_base_swa (default 10000) and scale 1, so that saved cells of both caches can be
# moved by the relocator (vendor/llama.cpp/src/models/gemma3.cpp, llama-hparams.h).
_ISWA_ROPE_CHECKED = frozenset({"gemma3"})


@dataclass(frozen=True)
class ModelInfo:
    path: str
    description: str
    n_ctx_train: int
    n_layer: int
    n_head_kv: int
    n_embd_head: int
    n_swa: int  # sliding-window size; 0 when every layer attends to the whole context
    fingerprint: str  # identifies the weights: a store keyed on it never mixes models


class Model:
    """A llama.cpp model; also the pml Tokenizer (tokenize, bos_id, placeholder_id)."""

    def __init__(self, path: str | os.PathLike, *, verbose: bool = False):
        set_llama_verbose(verbose)
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelError(f"model file {str(self.path)!r} does not exist; pass --model PATH to a GGUF file")
        self.extra_buffers = extra_buffers.decide()
        log.info("loading %s; %s", self.path.name, self.extra_buffers.describe())
        crash_guard.set_message(_crash_advice(self.path.name, self.extra_buffers))
        params = extra_buffers.model_params()
        self._model = llama_cpp.llama_model_load_from_file(str(self.path).encode(), params)
        if not self._model:
            raise ModelLoadError(f"llama.cpp could not load model file {str(self.path)!r} (not a GGUF file, "
                                 "truncated, or an architecture it does not support); download it again or pass "
                                 "--model PATH to another .gguf (--verbose shows llama.cpp's reason)")
        reason = refusal(self.architecture())
        if reason:
            self.close()
            raise UnsupportedModelError(f"cannot serve {self.path.name!r}: {reason}")
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self._vocab)
        add_bos = llama_cpp.llama_vocab_get_add_bos(self._vocab)
        self.bos_id: int | None = llama_cpp.llama_vocab_bos(self._vocab) if add_bos else None
        space = self.tokenize(" ", special=False)
        self.placeholder_id: int = space[0] if space else 0
        self.info = self._read_info()

    # llama_model * is freed once; contexts made from it must be closed first (PromptCache does).
    def close(self) -> None:
        if getattr(self, "_model", None):
            llama_cpp.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:
        self.close()

    @property
    def handle(self):
        """Returns the llama_model pointer for the engine's Context."""
        return self._model

    @property
    def vocab(self):
        """Returns the llama_vocab pointer, for samplers that read the vocabulary (a grammar, penalties)."""
        return self._vocab

    def architecture(self) -> ArchitectureFacts:
        """Returns what llama.cpp read from the GGUF about the kind of model this is."""
        m = self._model
        return ArchitectureFacts(
            architecture=self.metadata("general.architecture") or "unknown",
            rope_type=llama_cpp.llama_model_rope_type(m), recurrent=llama_cpp.llama_model_is_recurrent(m),
            hybrid=llama_cpp.llama_model_is_hybrid(m), has_encoder=llama_cpp.llama_model_has_encoder(m),
            diffusion=llama_cpp.llama_model_is_diffusion(m))

    def _read_info(self) -> ModelInfo:
        buf = ctypes.create_string_buffer(256)
        llama_cpp.llama_model_desc(self._model, buf, len(buf))
        n_embd = llama_cpp.llama_model_n_embd(self._model)
        n_head = max(1, llama_cpp.llama_model_n_head(self._model))
        # Head size is n_embd / n_head for Llama, but not for every model (Gemma 3: 256, not 640 / 4).
        arch = self.metadata("general.architecture") or ""
        key_length = self.metadata(f"{arch}.attention.key_length")
        return ModelInfo(
            path=str(self.path), description=buf.value.decode("utf-8", "replace"),
            n_ctx_train=llama_cpp.llama_model_n_ctx_train(self._model),
            n_layer=llama_cpp.llama_model_n_layer(self._model),
            n_head_kv=llama_cpp.llama_model_n_head_kv(self._model),
            n_embd_head=int(key_length) if key_length and key_length.isdigit() else n_embd // n_head,
            n_swa=llama_cpp.llama_model_n_swa(self._model), fingerprint=_fingerprint(self.path))

    def rope(self) -> RopeParams:
        """Returns how the model rotates K by position: what moving cells to other positions needs (relocate)."""
        arch = self.metadata("general.architecture") or ""
        rope_dims = self.metadata(f"{arch}.rope.dimension_count")
        return RopeParams(n_rot=int(rope_dims) if rope_dims and rope_dims.isdigit() else self.info.n_embd_head,
                          mode=RopeMode(llama_cpp.llama_model_rope_type(self._model)), n_head_kv=self.info.n_head_kv,
                          head_dim=self.info.n_embd_head,
                          freq_base=float(self.metadata(f"{arch}.rope.freq_base") or 10000.0),
                          freq_scale=llama_cpp.llama_model_rope_freq_scale_train(self._model))

    def cache_ropes(self) -> tuple[RopeParams, ...] | None:
        """Returns the RoPE of each KV cache a saved state holds, in its order; None when unknown.

        One cache, or an iswa model's base cache then its sliding-window cache, whose layers
        llama.cpp rotates with `{arch}.rope.freq_base_swa` (default 10000) and scale 1
        (llama_model::get_rope_freq_base). Only architectures whose loader was checked to keep
        those defaults get two; others return None (their cells move with llama.cpp's seq_add).
        """
        rope = self.rope()
        if not self.info.n_swa:
            return (rope,)
        arch = self.metadata("general.architecture") or ""
        if arch not in _ISWA_ROPE_CHECKED:
            return None
        swa_base = self.metadata(f"{arch}.rope.freq_base_swa")
        return (rope, replace(rope, freq_base=float(swa_base) if swa_base else 10000.0, freq_scale=1.0))

    def metadata(self, key: str) -> str | None:
        """Returns a GGUF metadata value as text, or None when the model does not have the key."""
        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_model_meta_val_str(self._model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    def tokenize(self, text: str, *, special: bool) -> list[int]:
        """Returns the token ids of `text` without BOS; special=True parses control tokens."""
        data = text.encode("utf-8")
        capacity = len(data) + 8
        while True:
            buf = (llama_cpp.llama_token * capacity)()
            n = llama_cpp.llama_tokenize(self._vocab, data, len(data), buf, capacity, False, special)
            if n >= 0:
                return list(buf[:n])
            capacity = -n

    def piece(self, token: int) -> bytes:
        """Returns the bytes a token stands for (control tokens render as nothing)."""
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, False)
        return buf.raw[:n]

    def detokenize(self, tokens: list[int]) -> str:
        """Returns the text of `tokens` (control tokens dropped)."""
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", errors="replace")

    def token_text(self, token: int) -> str:
        """Returns a token's vocabulary text, control tokens included (e.g. '<|im_end|>')."""
        raw = llama_cpp.llama_vocab_get_text(self._vocab, token)
        return raw.decode("utf-8", "replace") if raw else ""

    def is_end_of_generation(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    def chat_template(self) -> str | None:
        """Returns the GGUF's tokenizer.chat_template, or None when the model has none."""
        raw = llama_cpp.llama_model_chat_template(self._model, None)
        return raw.decode("utf-8") if raw else None

    def bos_text(self) -> str:
        return self.token_text(llama_cpp.llama_vocab_bos(self._vocab))

    def eos_text(self) -> str:
        return self.token_text(llama_cpp.llama_vocab_eos(self._vocab))


def _crash_advice(name: str, decision: extra_buffers.ExtraBuffers) -> str:
    """Returns what a crash inside llama.cpp should tell the user, now that `name` is loaded this way."""
    if decision.enabled:
        return (f"while running {name} with CPU extra buffers on ({decision.reason}); this is how llama.cpp's AMX "
                f"path fails on some CPUs: set {extra_buffers.ENV}=off and run again")
    return (f"while running {name} with CPU extra buffers off ({decision.reason}); run again with "
            "`pc-cpu --verbose ...` to see where, and report it as a bug")


def _fingerprint(path: Path) -> str:
    """Returns a short hash of the file's size, head and tail: cheap, and changes with the weights."""
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        digest.update(f.read(1 << 20))
        f.seek(max(0, size - (1 << 20)))
        digest.update(f.read(1 << 20))
    return digest.hexdigest()[:16]
