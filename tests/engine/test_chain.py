"""Chain encoding: each top-level module computed after its neighbour's cells (pc_cpu.pml.encoding)."""

from __future__ import annotations

import numpy as np
import pytest

from pc_cpu.errors import EngineError, PromptCacheError
from tests.conftest import batched_prefill_logits, prefill_logits

DOC_A = "The lighthouse keeper climbed the spiral stairs every evening at dusk and trimmed the wick."
DOC_B = "Later he polished the great lens and wrote the weather into a leather book."
DOC_C = "On Sundays the supply boat brought flour, oil and letters from the mainland."
SCHEMA = (f'<schema name="s"><system>You answer briefly.</system><user><module name="a">{DOC_A}</module>'
          f'<module name="b">{DOC_B}</module><module name="c">{DOC_C}</module></user></schema>')
QUESTION = " What did the keeper polish?"


def prompt(imports: str) -> str:
    return f'<prompt schema="s"><user>{imports}{QUESTION}</user></prompt>'


def test_two_chained_modules_give_the_full_prefill_logits(make_cache):
    # a is computed after the preamble, b after the preamble and a's cells: both exactly as in a full
    # prefill. The modules sit outside the user turn, so no schema text follows them: the prompt's own
    # text comes right after b and the prompt's positions have no gap, as in the full prefill.
    schema = SCHEMA.replace("<user>", "").replace("</user>", "")
    chain = make_cache(encoding="chain")
    cached = prefill_logits(chain, schema, prompt("<a/><b/>"), use_cache=True)
    a, b = chain.schemas.layout("s").modules["a"], chain.schemas.layout("s").modules["b"]
    baseline = batched_prefill_logits(make_cache(), schema, prompt("<a/><b/>"), [a.start, b.start, b.end])
    preamble = prefill_logits(make_cache(), schema, prompt("<a/><b/>"), use_cache=True)

    assert np.abs(cached - baseline).max() == 0.0
    assert np.abs(preamble - baseline).max() > 0.0  # b alone never saw a


def on_demand_logits(cache, imports: str):
    """Returns the last-token logits of the prompt, its encodings made resident only as the prompt needs them."""
    cache.load_schema(SCHEMA, encode=False)
    with cache.workbench.prefilled(cache.plan(prompt(imports)), use_cache=True) as prefilled:
        return prefilled.logits()


def test_module_encoded_on_demand_is_computed_after_its_whole_chain(make_cache):
    # Only c is imported: a and b must be made resident first, so c gets the cells a full load gives it.
    eager = prefill_logits(make_cache(encoding="chain", store=False), SCHEMA, prompt("<c/>"), use_cache=True)
    lazy_cache = make_cache(encoding="chain", store=False)
    lazy = on_demand_logits(lazy_cache, "<c/>")
    preamble = on_demand_logits(make_cache(store=False), "<c/>")

    assert np.abs(lazy - eager).max() == 0.0
    assert np.abs(preamble - eager).max() > 0.0
    assert lazy_cache.schemas.encoded == 4  # ROOT's preamble, a, b, c


def test_stored_chain_module_is_restored_without_its_neighbours(make_cache, tmp_path):
    first = make_cache(encoding="chain", store=tmp_path)
    expected = prefill_logits(first, SCHEMA, prompt("<c/>"), use_cache=True)
    second = make_cache(encoding="chain", store=tmp_path)
    got = on_demand_logits(second, "<c/>")

    assert np.abs(got - expected).max() == 0.0
    assert second.schemas.encoded == 0
    with pytest.raises(PromptCacheError, match="'b' of schema 's' is not resident"):
        second.schemas.cells("s", "b")  # c's cells were restored, not computed: b was not needed


def test_chain_module_whose_neighbour_is_not_resident_is_refused_not_computed_afresh(make_engine):
    engine = make_engine(encoding="chain")
    layout = engine.layout(SCHEMA)  # laid out, nothing encoded

    with pytest.raises(EngineError, match=r"\['a'\] must be resident"):
        engine.modules.encoder.encode(layout, "b", engine.roles.libraries[0], lambda other: None if other == "a" else 0)


# tiny_only: chain links are computed in the library, among other cells, so the small and the large
# context differ by their cell layouts too; on real models that alone is ~0.5 (README, "Same tokens").
@pytest.mark.tiny_only
def test_a_context_too_small_for_the_schema_keeps_the_preamble_while_encoding_the_chain(make_cache):
    # Loading encodes one module at a time and evicts the least recent (the preamble first); each
    # chain module shares the preamble's cells, so it must come back rather than the encode failing.
    long = SCHEMA.replace(DOC_A, DOC_A * 4).replace(DOC_B, DOC_B * 4).replace(DOC_C, DOC_C * 4)
    small = make_cache(encoding="chain", store=False, n_ctx=256)
    small.load_schema(long)
    # Another schema's encoding then needs cells: the least recent (the preamble first) leave, and
    # the prompt below must bring the chain back (store=False: by encoding it again, after its neighbours).
    filler = '<schema name="filler"><module name="f">' + DOC_A * 6 + "</module></schema>"
    small.load_schema(filler)
    schemas = small.schemas
    assert schemas.resident_cells - schemas.layout("filler").cached_cells < schemas.inspect(long).cached_cells
    logits = {}
    for name, cache in (("small", small), ("big", make_cache(encoding="chain", store=False)),
                        ("preamble", make_cache(store=False))):
        cache.load_schema(long)
        with cache.workbench.prefilled(cache.plan(prompt("<c/>")), use_cache=True) as prefilled:
            logits[name] = prefilled.logits()

    # Not bit-equal: other cell slots in a smaller context change attention's summation order.
    # But c was computed after b's chained cells, as in the big context, not as in preamble mode.
    # Measured mean distances to "big": small 0.05-0.17, preamble 0.24-0.90 on SmolLM2, Gemma 3 and
    # Qwen2.5 (a 5x margin; the tiny model's is wider).
    distance = {name: np.abs(logits[name] - logits["big"]).mean() for name in ("small", "preamble")}
    assert distance["small"] < distance["preamble"] / 3
