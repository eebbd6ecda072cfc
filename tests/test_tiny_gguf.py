"""The test-time tiny GGUF: readable, shaped as asked, SmolLM2's tokenizer, reproducible bytes."""

from __future__ import annotations

import pathlib
import struct

import pytest
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType

from tests.conftest import smollm2_path
from tests.tiny_gguf import write_tiny_llama_gguf


def _raw(field) -> tuple[list, list[bytes]]:
    """A metadata field as (value types, raw bytes of each value), for exact equality."""
    return list(field.types), [field.parts[i].tobytes() for i in field.data]


def _value(reader: GGUFReader, key: str):
    return reader.fields[key].contents()


@pytest.fixture(scope="module")
def tiny_reader(tiny_model_path: pathlib.Path) -> GGUFReader:
    return GGUFReader(tiny_model_path)


@pytest.fixture(scope="module")
def smollm2_reader() -> GGUFReader:
    return GGUFReader(smollm2_path())


def test_metadata_describes_a_small_llama(tiny_reader: GGUFReader) -> None:
    assert _value(tiny_reader, "general.architecture") == "llama"
    assert _value(tiny_reader, "llama.block_count") == 2
    assert _value(tiny_reader, "llama.embedding_length") == 64
    assert _value(tiny_reader, "llama.attention.head_count") == 4
    assert _value(tiny_reader, "llama.attention.head_count_kv") == 2
    assert _value(tiny_reader, "llama.feed_forward_length") == 128
    assert _value(tiny_reader, "llama.context_length") == 4096
    assert _value(tiny_reader, "llama.rope.dimension_count") == 64 // 4  # RoPE over the whole head
    assert _value(tiny_reader, "llama.vocab_size") == 49152


def test_tensors_are_f32_with_tied_embeddings(tiny_reader: GGUFReader) -> None:
    tensors = {t.name: t for t in tiny_reader.tensors}
    assert len(tensors) == 1 + 9 * 2 + 1  # token_embd, 9 per block, output_norm
    assert "output.weight" not in tensors  # llama.cpp reuses token_embd as the output head
    assert {t.tensor_type for t in tensors.values()} == {GGMLQuantizationType.F32}
    assert list(tensors["token_embd.weight"].shape) == [64, 49152]  # ggml order: (n_embd, n_vocab)
    assert list(tensors["blk.1.attn_k.weight"].shape) == [64, 2 * 16]  # (n_embd, n_head_kv * head)


def test_tokenizer_metadata_is_copied_exactly(
    tiny_reader: GGUFReader, smollm2_reader: GGUFReader
) -> None:
    source_keys = [k for k in smollm2_reader.fields if k.startswith("tokenizer.")]
    assert "tokenizer.ggml.tokens" in source_keys
    assert "tokenizer.chat_template" in source_keys
    assert [k for k in tiny_reader.fields if k.startswith("tokenizer.")] == source_keys
    for key in source_keys:
        assert _raw(tiny_reader.fields[key]) == _raw(smollm2_reader.fields[key]), key


def test_chat_template_can_be_dropped_or_replaced(tmp_path: pathlib.Path) -> None:
    # Checked on the raw bytes (GGUF key-value record: u64 key length, key, u32 type, u64 length,
    # value): a GGUFReader parse of the 49,152-token vocabulary takes seconds per file.
    smollm2_path()
    key = b"tokenizer.chat_template"
    dropped = write_tiny_llama_gguf(tmp_path / "none.gguf", n_layer=1, chat_template=None)
    assert key not in dropped.read_bytes()
    replaced = write_tiny_llama_gguf(tmp_path / "own.gguf", n_layer=1, chat_template="{{ x }}")
    value = b"{{ x }}"
    record = struct.pack("<Q", len(key)) + key
    record += struct.pack("<IQ", GGUFValueType.STRING, len(value)) + value
    assert replaced.read_bytes().count(key) == 1
    assert record in replaced.read_bytes()


def test_same_seed_gives_same_bytes_and_other_seed_differs(tmp_path: pathlib.Path) -> None:
    smollm2_path()
    first = write_tiny_llama_gguf(tmp_path / "a.gguf", seed=7).read_bytes()
    again = write_tiny_llama_gguf(tmp_path / "b.gguf", seed=7).read_bytes()
    other = write_tiny_llama_gguf(tmp_path / "c.gguf", seed=8).read_bytes()
    assert first == again
    assert len(other) == len(first)  # same layout, only the weights change
    assert other != first


def test_inconsistent_heads_are_refused(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ValueError, match="n_head_kv=3 does not divide n_head=4"):
        write_tiny_llama_gguf(tmp_path / "bad.gguf", n_head_kv=3)
