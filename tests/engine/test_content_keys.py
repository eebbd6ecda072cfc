"""Encodings are keyed by what their cells depend on: shared between schemas, kept when a schema grows."""

from __future__ import annotations

import pytest

from pc_cpu.pml.encoding import encoding_keys

SYSTEM = "<system>You answer from the notes.</system>"


def notes(name: str, count: int, *, system: str = SYSTEM) -> str:
    modules = "".join(f'<module name="n{i}">Note {i}: shelf {i} holds {i * 7} boxes of tea.</module>'
                      for i in range(count))
    return f'<schema name="{name}">{system}{modules}</schema>'


def test_the_same_text_in_two_schemas_is_encoded_once(make_cache, tmp_path):
    cache = make_cache(store=tmp_path / "store")
    cache.load_schema(notes("a", 3))
    encoded = cache.modules.encoded
    cells = cache.resident_cells
    cache.load_schema(notes("b", 3))  # another name, the same system message and notes at the same positions
    assert cache.modules.encoded == encoded
    assert cache.resident_cells == cells  # one set of cells serves both schemas
    result = cache.generate('<prompt schema="b"><n1/><user>How many boxes on shelf 1?</user></prompt>', max_tokens=2)
    assert set(result.tiers.values()) == {"context"}


def test_appending_a_module_encodes_that_module_only(make_cache, tmp_path):
    store = tmp_path / "store"
    first = make_cache(store=store)
    first.load_schema(notes("lib", 20))
    first.close()
    second = make_cache(store=store)  # another process: only the store is shared
    second.load_schema(notes("lib", 21))
    assert second.modules.encoded == 1
    third = make_cache(store=store)
    third.load_schema(notes("lib", 22))
    assert third.modules.encoded == 1


def test_another_system_message_encodes_everything_after_it_again(make_cache):
    # The modules attended to the system message: their cells depend on it, and so does the key.
    cache = make_cache(store=False)
    cache.load_schema(notes("a", 2))
    before = cache.modules.encoded
    cache.load_schema(notes("b", 2, system="<system>Answer in French.</system>"))
    assert cache.modules.encoded - before == len(encoding_keys(cache.layout("b"), cache.encoding))


@pytest.mark.tiny_only
def test_a_module_nearly_as_long_as_the_context_loads(make_cache):
    # The fit check counted the module twice (as library cells and as the cells it is computed
    # in, which are the same cells): a 4,600-token module was refused in an 8,192-cell context.
    cache = make_cache(n_ctx=8192, store=False)
    text = " ".join(f"w{i % 97}" for i in range(2400))
    schema = f'<schema name="long"><module name="doc">{text}</module></schema>'
    layout = cache.inspect_schema(schema)
    assert 4600 <= layout.modules["doc"].end - layout.modules["doc"].start < 8192 // 2 * 2
    cache.load_schema(schema)
    result = cache.generate('<prompt schema="long"><doc/> And then</prompt>', max_tokens=2)
    assert result.cached_tokens >= 4600


@pytest.mark.tiny_only
def test_a_schema_three_times_the_context_loads_and_answers(make_cache, tmp_path):
    cache = make_cache(n_ctx=256, store=tmp_path / "store")
    schema = notes("big", 60)
    assert cache.inspect_schema(schema).length <= 256  # folded: every note right after the system message
    from pc_cpu.pml.layout import build_layout
    from pc_cpu.pml.schema import parse_schema

    assert build_layout(parse_schema(schema), cache.model, cache.markup).length > 3 * 256
    cache.load_schema(schema)
    assert cache.modules.encoded == 61  # the preamble and each note, once
    assert cache.resident_cells <= cache.ctx.n_ctx
    result = cache.generate('<prompt schema="big"><n42/><n7/><n0/><user>Shelf 7?</user></prompt>', max_tokens=3)
    assert result.modules == ["n42", "n7", "n0"] and result.finish_reason in ("stop", "length")
    baseline = cache.generate('<prompt schema="big"><n42/><n7/><n0/><user>Shelf 7?</user></prompt>', max_tokens=3,
                              use_cache=False)
    assert baseline.uncached_tokens == result.cached_tokens + result.uncached_tokens
