"""Encodings are keyed by what their cells depend on: shared between schemas, kept when a schema grows."""

from __future__ import annotations

import numpy as np
import pytest

from pc_cpu.pml.encoding import encoding_keys, home_shift, module_segments, scaffold_key, scaffold_segment
from pc_cpu.kvstate import state_blob
from tests.engine.test_determinism import prompt_logits

SYSTEM = "<system>You answer from the notes.</system>"


def notes(name: str, count: int, *, system: str = SYSTEM) -> str:
    modules = "".join(f'<module name="n{i}">Note {i}: shelf {i} holds {i * 7} boxes of tea.</module>'
                      for i in range(count))
    return f'<schema name="{name}">{system}{modules}</schema>'


def test_the_same_text_in_two_schemas_is_encoded_once(make_cache, tmp_path):
    cache = make_cache(store=tmp_path / "store")
    cache.load_schema(notes("a", 3))
    encoded = cache.schemas.encoded
    cells = cache.schemas.resident_cells
    cache.load_schema(notes("b", 3))  # another name, the same system message and notes at the same positions
    assert cache.schemas.encoded == encoded
    assert cache.schemas.resident_cells == cells  # one set of cells serves both schemas
    result = cache.generate('<prompt schema="b"><n1/><user>How many boxes on shelf 1?</user></prompt>', max_tokens=2)
    assert set(result.tiers.values()) == {"context"}


def test_appending_a_module_encodes_that_module_only(make_cache, tmp_path):
    store = tmp_path / "store"
    first = make_cache(store=store)
    first.load_schema(notes("lib", 20))
    first.close()
    second = make_cache(store=store)  # another process: only the store is shared
    second.load_schema(notes("lib", 21))
    assert second.schemas.encoded == 1
    third = make_cache(store=store)
    third.load_schema(notes("lib", 22))
    assert third.schemas.encoded == 1


def test_another_system_message_encodes_everything_after_it_again(make_cache):
    # The modules attended to the system message: their cells depend on it, and so does the key.
    cache = make_cache(store=False)
    cache.load_schema(notes("a", 2))
    before = cache.schemas.encoded
    cache.load_schema(notes("b", 2, system="<system>Answer in French.</system>"))
    assert cache.schemas.encoded - before == len(encoding_keys(cache.schemas.layout("b"), cache.schemas.mode))


@pytest.mark.tiny_only
def test_a_module_nearly_as_long_as_the_context_loads(make_cache, tmp_path):
    # The fit check counted the module twice (as library cells and as the cells it is computed
    # in, which are the same cells): a 4,600-token module was refused in an 8,192-cell context.
    # The shared tiny model was trained on 4,096 positions, under the context this needs.
    from tests.tiny_gguf import write_tiny_llama_gguf

    cache = make_cache(write_tiny_llama_gguf(tmp_path / "tiny-8k.gguf", context_length=8192), n_ctx=8192, store=False)
    text = " ".join(f"w{i % 97}" for i in range(2400))
    schema = f'<schema name="long"><module name="doc">{text}</module></schema>'
    layout = cache.schemas.inspect(schema)
    assert 4600 <= layout.modules["doc"].end - layout.modules["doc"].start < 8192 // 2 * 2
    cache.load_schema(schema)
    result = cache.generate('<prompt schema="long"><doc/> And then</prompt>', max_tokens=2)
    assert result.cached_tokens >= 4600


@pytest.mark.tiny_only
def test_a_schema_three_times_the_context_loads_and_answers(make_cache, tmp_path):
    cache = make_cache(n_ctx=256, store=tmp_path / "store")
    schema = notes("big", 60)
    assert cache.schemas.inspect(schema).length <= 256  # folded: every note right after the system message
    from pc_cpu.pml.layout import build_layout
    from pc_cpu.pml.schema import parse_schema

    assert build_layout(parse_schema(schema), cache.model, cache.schemas.markup).length > 3 * 256
    cache.load_schema(schema)
    assert cache.schemas.encoded == 61  # the preamble and each note, once
    assert cache.schemas.resident_cells <= cache.n_ctx
    result = cache.generate('<prompt schema="big"><n42/><n7/><n0/><user>Shelf 7?</user></prompt>', max_tokens=3)
    assert result.modules == ["n42", "n7", "n0"] and result.finish_reason in ("stop", "length")
    baseline = cache.generate('<prompt schema="big"><n42/><n7/><n0/><user>Shelf 7?</user></prompt>', max_tokens=3,
                              use_cache=False)
    assert baseline.uncached_tokens == result.cached_tokens + result.uncached_tokens


def test_lengthening_a_module_encodes_that_module_only(make_cache, tmp_path):
    # The notes after the edited one move: they are computed at their home and moved into place,
    # so their keys, and their stored cells, do not depend on the edited note's length.
    cache = make_cache(store=tmp_path / "store")
    cache.load_schema(notes("lib", 4))
    edited = notes("lib", 4).replace("Note 1: shelf 1 holds 7 boxes of tea.",
                                     "Note 1: shelf 1 holds 7 boxes of green and black tea from Assam.")
    before = cache.schemas.encoded
    cache.load_schema(edited)
    assert cache.schemas.encoded - before == 1


def test_a_moved_module_answers_as_in_a_cold_process(make_cache, tmp_path):
    # Same tokens, same answer: cells restored from an edited schema's store and moved into place
    # are the bytes a process that never saw the old schema computes and moves.
    edited = notes("lib", 3).replace("Note 0: shelf 0 holds 0 boxes of tea.", "Note 0: shelf 0 is empty today.")
    prompt = '<prompt schema="lib"><n2/><user>How many boxes on shelf 2?</user></prompt>'
    first = make_cache(store=tmp_path / "warm")
    first.load_schema(notes("lib", 3))
    first.close()
    warm = make_cache(store=tmp_path / "warm")
    warm.load_schema(edited)
    moved = warm.generate(prompt, max_tokens=6)
    cold = make_cache(store=tmp_path / "cold")
    cold.load_schema(edited)
    fresh = cold.generate(prompt, max_tokens=6)
    assert warm.schemas.encoded == 1  # n0 only
    assert home_shift(warm.schemas.layout("lib"), "n2", warm.schemas.mode) != 0  # n2 was computed at home, moved
    assert moved.token_ids == fresh.token_ids and len(moved.token_ids) > 0
    assert prompt_logits(warm, prompt).tobytes() == prompt_logits(cold, prompt).tobytes()


def test_a_module_computed_at_home_and_moved_holds_the_cells_computed_in_place(engine):
    # RoPE is relative, so the home computation moved into place gives the in-place cells up to
    # rounding. Layer 0 shows the move alone: V equal, K within F16 rotation rounding (measured
    # 3e-4 relative; a shift off by one position is 0.13-0.23). Layer 1 shows both attended to the
    # same context (measured 0.1-1.1%: activations are quantized for the matmuls, which amplifies rounding).
    layout = engine.load(notes("lib", 3))
    assert engine.modules.shift_of(layout, "n2") > 0
    (job,) = module_segments(layout, "n2", engine.mode)  # in place: the context right before the run
    # sliding-window models compute in the library context, in whole-state spans
    in_place = state_blob.splice(engine.modules.encoder.compute_apart(job))
    moved = resident_cells(engine, layout, "n2")
    check_moved_cells(moved, in_place, list(range(job.start, job.end)))


def resident_cells(engine, layout, key: str) -> bytes:
    """Returns the resident cells of encoding `key` of `layout`, at its layout positions (as Schemas.cells reads them)."""
    seq = engine.modules.sequence_of(layout, key)
    assert seq is not None, f"{key} is not resident"
    return engine.modules.resident_cells(layout, key, seq)


def check_moved_cells(moved, in_place, positions: list[int]) -> None:
    """Asserts that cells computed at home and moved hold the in-place cells at `positions`, up to rounding.

    Tolerances: see test_a_module_computed_at_home_and_moved_holds_the_cells_computed_in_place.
    """
    # The model's first layers: an iswa model (Gemma 3) saves its sliding-window cache, layer 0 among them, last.
    section = len(state_blob.section_layers(moved)) - 1

    def relative_error(layer: int) -> tuple[float, float]:
        (got_pos, *got), (want_pos, *want) = (state_blob.layer_kv(blob, layer, section=section)
                                              for blob in (moved, in_place))
        assert got_pos.tolist() == want_pos.tolist() == positions
        return tuple(float(np.linalg.norm(g - w) / np.linalg.norm(w)) for g, w in zip(got, want))

    k0, v0 = relative_error(0)
    assert v0 == 0.0 and k0 < 0.005
    assert max(relative_error(1)) < 0.05


def scaffolded(intro: str) -> str:
    """A schema whose scaffold (two notes, a gap between them) follows a module: it moves with the module's length."""
    return (f'<schema name="sc">{SYSTEM}<module name="intro">{intro}</module><scaffold name="both">'
            '<module name="a">Note a: shelf 1 holds 7 boxes of tea.</module> And then: '
            '<module name="b">Note b: shelf 2 holds 14 boxes of tea.</module></scaffold></schema>')


@pytest.mark.parametrize("flash_attn", [None, True], ids=["flash_default", "flash_on"])  # default: off but on Gemma
def test_lengthening_a_module_before_a_scaffold_encodes_that_module_only(make_cache, tmp_path, flash_attn):
    # The scaffold is computed at its home and moved into place like a module, so its key, and its
    # stored cells, do not depend on the length of what comes before it. Nor do its bits depend on
    # where the library's other cells sit: with flash attention off, a scaffold computed in the
    # library context gave logits 0.30 apart here (it is computed in the workspace now).
    prompt = '<prompt schema="sc"><intro/><both/><user>How many boxes on shelf 2?</user></prompt>'
    edited = scaffolded("The tea shop's notes, kept by the owner since 1990.")
    first = make_cache(store=tmp_path / "warm", flash_attn=flash_attn)
    first.load_schema(scaffolded("Notes."))
    first.close()
    warm = make_cache(store=tmp_path / "warm", flash_attn=flash_attn)
    warm.load_schema(edited)
    assert warm.schemas.encoded == 1  # intro only: a, b and the scaffold come from the store, moved
    assert home_shift(warm.schemas.layout("sc"), scaffold_key("both"), warm.schemas.mode) > 0  # moved
    moved = warm.generate(prompt, max_tokens=6)
    cold = make_cache(store=tmp_path / "cold", flash_attn=flash_attn)
    cold.load_schema(edited)
    fresh = cold.generate(prompt, max_tokens=6)
    assert moved.token_ids == fresh.token_ids and len(moved.token_ids) > 0
    assert prompt_logits(warm, prompt).tobytes() == prompt_logits(cold, prompt).tobytes()


def test_a_scaffold_computed_at_home_and_moved_holds_the_cells_computed_in_place(engine):
    # Each run is moved from where it was computed (back to back) to its place in the layout, and
    # the whole scaffold from its home: the cells must sit at the layout's positions, as computed there.
    layout = engine.load(scaffolded("The tea shop's notes, kept by the owner since 1990."))
    key = scaffold_key("both")
    assert engine.modules.shift_of(layout, key) > 0
    job = scaffold_segment(layout, "both", engine.mode)  # in place: the context right before the first run
    assert len(job.runs) == 2  # a gap between them
    in_place = state_blob.splice(engine.modules.encoder.compute_apart(job))
    moved = resident_cells(engine, layout, key)
    check_moved_cells(moved, in_place, [p for run in job.runs for p in range(run.start, run.end)])
