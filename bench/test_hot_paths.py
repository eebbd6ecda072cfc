"""Hot-path microbenchmarks (pytest-benchmark): assembly of N modules, blob splice, ordering and
restreaming a prompt's cells, suffix decode, recompute.

    pytest bench/ --benchmark-only            # not part of the default run (testpaths = tests)

SmolLM2-135M (the default model) with 2 threads; skipped when it is not installed.
"""

from __future__ import annotations

import pytest

pytest.importorskip("pytest_benchmark")

from pc_cpu.kvstate import native, state_blob  # noqa: E402

DOC = "The lighthouse keeper climbed the spiral stairs at dusk, trimmed the wick and wrote the weather down. "


def schema(n: int) -> str:
    body = "".join(f'<module name="m{i}">{DOC * 3}</module>' for i in range(n))  # ~60 tokens each
    return f'<schema name="hot{n}"><system>Answer briefly.</system><user>{body}</user></schema>'


def prompt(n: int) -> str:
    return f'<prompt schema="hot{n}">' + "".join(f"<m{i}/>" for i in range(n)) + "<user>Who climbed?</user></prompt>"


@pytest.fixture(scope="module")
def pc():
    from pc_cpu import PromptCache
    from tests.tiny_gguf import packaged_smollm2_path

    try:
        path = packaged_smollm2_path()
    except FileNotFoundError as exc:
        pytest.skip(f"default model unavailable: {exc}")
    cache = PromptCache(path, threads=2, n_ctx=8192, store=False)
    for n in (4, 32):
        cache.load_schema(schema(n))
    yield cache
    cache.close()


@pytest.mark.parametrize("n", [4, 32])
def test_assemble_n_modules(benchmark, pc, n):
    """Shares N resident modules into the prompt sequence (seq_cp per run) and computes nothing else."""
    plan = pc.plan(prompt(n))
    pc.workbench.prepare(plan, use_cache=True)

    def assemble():
        pc.workbench.prefilled(plan, use_cache=True).close()  # built in stream PROMPT_SEQ, then freed

    benchmark(assemble)


@pytest.mark.parametrize("impl", [pytest.param(native, id="native"), pytest.param(state_blob, id="numpy")])
def test_splice_module_blobs(benchmark, pc, impl):
    """Splices the RAM tier's blobs of the 32-module schema into one restore blob."""
    if impl is native and not native.available():
        pytest.skip("libpc_native not built")
    blobs = _module_blobs(pc, 32)
    out = benchmark(impl.splice, blobs)
    assert len(out) > sum(map(len, blobs)) // 2


@pytest.mark.parametrize("impl", [pytest.param(native, id="native"), pytest.param(state_blob, id="numpy")])
def test_order_schema_prompt_in_place(benchmark, pc, impl):
    """Sorts a 32-module prompt's cells, read out of position order, in the buffer they were read into.

    What pc_cpu.engine.cells.streams.move_to_stream does to every schema prompt: library slots hold
    cells in the order they were encoded, not by position. Each round starts from the unsorted bytes.
    """
    if impl is native and not native.available():
        pytest.skip("libpc_native not built")
    staged = bytes(state_blob.splice(_module_blobs(pc, 32)[::-1]))
    buf = bytearray(len(staged))

    def unsorted():
        buf[:] = staged
        return (buf,), {}

    benchmark.pedantic(impl.order_in_place, setup=unsorted, rounds=15)
    assert bytes(buf) == bytes(state_blob.order_by_position(staged)) != staged


@pytest.mark.parametrize("impl", [pytest.param(native, id="native"), pytest.param(state_blob, id="numpy")])
def test_order_and_restream_schema_prompt(benchmark, pc, impl):
    """Sorts the same prompt's cells into a new blob and restreams it for the prompt context (two new buffers).

    What move_to_stream did before sorting in place, and still does for a blob of several KV caches.
    """
    if impl is native and not native.available():
        pytest.skip("libpc_native not built")
    staged = bytes(state_blob.splice(_module_blobs(pc, 32)[::-1]))
    n_stream = pc.memory().streams - 1  # the prompt context's streams (MemoryUse.streams counts the library's too)
    def order_and_restream():
        ordered = bytearray(staged)
        impl.order_in_place(ordered)
        return impl.restream(ordered, n_stream)

    out = benchmark(order_and_restream)
    assert state_blob.scan(out).n_stream == n_stream


def _module_blobs(pc, n: int) -> list[bytes]:
    """Returns n copies of a stored module encoding, moved to disjoint positions one after another.

    The schema's modules share one text, so the store holds one encoding (at its home) that every
    module position reuses: moved copies are the cells a prompt of n modules holds.
    """
    ram = pc.store.tiers[0]
    blob = max((ram.get(k).payload for k in ram.keys()), key=len)
    info = state_blob.scan(blob)
    span = info.pos_max + 1
    rope = pc.model.rope()
    return [bytes(state_blob.relocate(blob, k * span, rope)) if k else blob for k in range(n)]


def test_suffix_decode(benchmark, pc):
    """A cached prompt's TTFT: assembly of 4 modules plus the decode of the uncached question."""
    benchmark(lambda: pc.generate(prompt(4), max_tokens=1))


@pytest.mark.parametrize("policy", ["20%", "select:20%"])
def test_recompute_assembly(benchmark, pc, policy):
    """A cached prompt of 32 modules (~2,000 tokens) recomputing 20% of them: at the ends, or chosen by deviation."""
    pc.generate(prompt(32), max_tokens=1, recompute=policy)  # loads the probe model once
    benchmark(lambda: pc.generate(prompt(32), max_tokens=1, recompute=policy))
