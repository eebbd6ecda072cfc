"""Scaffolds: modules also encoded jointly, whose joint cells replace their own when a prompt imports them all."""

from __future__ import annotations

import numpy as np
import pytest

from pc_cpu.errors import PromptError, SchemaError
from pc_cpu.kvstate import ops
from pc_cpu.pml.encoding import scaffold_key
from pc_cpu.pml.plan import CopyCells, DecodeTokens
from tests.conftest import batched_prefill_logits, prefill_logits
from tests.conftest import cell_positions

DOC_A = "The lighthouse keeper climbed the spiral stairs every evening at dusk and trimmed the wick."
DOC_B = "Later he polished the great lens and wrote the weather into a leather book."
MODULES = f'<module name="a">{DOC_A}</module><module name="b">{DOC_B}</module>'
# a and b follow each other right after the preamble (BOS), so the joint encoding is a full prefill's.
ADJACENT = (f'<schema name="s"><scaffold name="both">{MODULES}</scaffold>'
            '<module name="other">Unrelated.</module></schema>')
APART = f'<schema name="s">{MODULES}<module name="other">Unrelated.</module></schema>'
CHAT = (f'<schema name="s"><system>You answer briefly.</system><user><scaffold name="both">{MODULES}</scaffold>'
        '</user></schema>')
# ROOT text between the members: computed per prompt, so the scaffold's runs have a gap.
GAPPED = (f'<schema name="g"><scaffold name="both"><module name="a">{DOC_A}</module> And then, one more thing: '
          f'<module name="b">{DOC_B}</module></scaffold></schema>')
NESTED = ('<schema name="n"><scaffold name="sc"><module name="p">Outer text <module name="c">inner text</module>'
          ' more outer text</module></scaffold></schema>')
QUESTION = " What did the keeper polish?"


def sources(plan) -> dict[str, set]:
    """Returns {module: the CopyCells sources its cells come from}."""
    found: dict[str, set] = {}
    for op in plan.ops:
        if isinstance(op, CopyCells):
            found.setdefault(op.module, set()).add(op.source)
    return found


# --- cached equals fresh ------------------------------------------------------------------------

@pytest.mark.parametrize("schema, imports", [(ADJACENT, "<a/><b/>"), (ADJACENT, "<both/>"), (CHAT, "<both/>")],
                         ids=["members", "scaffold", "after-system-preamble"])
def test_adjacent_scaffold_gives_the_full_prefill_logits(make_cache, schema, imports):
    # After a system preamble, the joint run is computed after the preamble's shared cells.
    prompt = f'<prompt schema="s">{imports}{QUESTION}</prompt>'
    cache = make_cache()
    cached = prefill_logits(cache, schema, prompt, use_cache=True)
    a, b = cache.schemas.layout("s").modules["a"], cache.schemas.layout("s").modules["b"]
    baseline = batched_prefill_logits(make_cache(), schema, prompt, [a.start, b.end])  # the joint run is one batch
    assert np.abs(cached - baseline).max() == 0.0


def test_without_the_scaffold_the_logits_differ(make_cache):
    # b is encoded without seeing a, which the full prefill lets it see.
    prompt = f'<prompt schema="s"><a/><b/>{QUESTION}</prompt>'
    cached = prefill_logits(make_cache(), APART, prompt, use_cache=True)
    baseline = prefill_logits(make_cache(), APART, prompt, use_cache=False)
    assert np.abs(cached - baseline).max() > 0.0


def test_adjacent_scaffold_gives_the_baseline_greedy_tokens(make_cache):
    prompt = f'<prompt schema="s"><both/>{QUESTION}</prompt>'
    cache, fresh = make_cache(), make_cache()
    cache.load_schema(ADJACENT)
    fresh.load_schema(ADJACENT, encode=False)
    cached = cache.generate(prompt, max_tokens=10)
    assert cached.token_ids == fresh.generate(prompt, max_tokens=10, use_cache=False).token_ids
    assert cached.cached_tokens > 0


# --- which cells a prompt gets -------------------------------------------------------------------

def test_full_import_shares_the_scaffold_cells(make_cache):
    cache = make_cache()
    cache.load_schema(ADJACENT)
    plan = cache.plan(f'<prompt schema="s"><a/><b/>{QUESTION}</prompt>')
    assert sources(plan)["a"] == sources(plan)["b"] == {scaffold_key("both")}
    assert plan.encoding_of("a") == "scaffold:both"
    assert cache.plan(f'<prompt schema="s"><both/>{QUESTION}</prompt>') == plan


def test_partial_import_uses_the_members_own_cells(make_cache):
    cache = make_cache()
    cache.load_schema(ADJACENT)
    plan = cache.plan(f'<prompt schema="s"><b/><other/>{QUESTION}</prompt>')
    assert sources(plan)["b"] == {None}
    assert plan.encoding_of("b") == "b"
    with cache.workbench.prefilled(plan, use_cache=True) as prompt:
        assert prompt.positions() == list(plan.positions)
        logits = prompt.logits()
    # The cells came from b's own library sequence: the same logits as a cache that has no scaffold.
    apart = prefill_logits(make_cache(), APART, f'<prompt schema="s"><b/><other/>{QUESTION}</prompt>', use_cache=True)
    assert np.allclose(logits, apart, atol=1e-3)


def test_scaffold_cells_are_kept_apart_from_the_members(engine):
    layout = engine.load(ADJACENT)
    own = engine.modules.sequence_of(layout, "a")
    joint = engine.modules.sequence_of(layout, scaffold_key("both"))
    assert own is not None and joint is not None and own != joint
    a, b = layout.modules["a"], layout.modules["b"]
    assert cell_positions(engine.ctx, joint, layout.length, engine.roles.hold) == list(range(a.start, b.end))
    assert engine.resident.cells == layout.cached_cells + (b.end - a.start)


def test_nested_members_are_imported_by_the_scaffold(make_cache):
    cache = make_cache()
    cache.load_schema(NESTED)
    by_name = cache.plan('<prompt schema="n"><sc/> Go.</prompt>')
    assert by_name == cache.plan('<prompt schema="n"><p><c/></p> Go.</prompt>')
    assert {k: v for k, v in sources(by_name).items() if k != "#root"} == {"p": {"scaffold:sc"}, "c": {"scaffold:sc"}}
    assert sources(cache.plan('<prompt schema="n"><p/> Go.</prompt>'))["p"] == {None}
    logits = prefill_logits(cache, NESTED, '<prompt schema="n"><sc/> Go.</prompt>', use_cache=True)
    p = cache.schemas.layout("n").modules["p"]
    baseline = batched_prefill_logits(make_cache(), NESTED, '<prompt schema="n"><sc/> Go.</prompt>', [p.start, p.end])
    assert np.abs(logits - baseline).max() == 0.0  # p's runs and c follow each other: no gap


# --- gaps ---------------------------------------------------------------------------------------

def test_gapped_scaffold_assembles_at_the_layout_positions(make_cache):
    cache = make_cache()
    cache.load_schema(GAPPED)
    layout = cache.schemas.layout("g")
    plan = cache.plan(f'<prompt schema="g"><both/>{QUESTION}</prompt>')
    # After the ROOT preamble (BOS, where the model adds one), the ROOT text between the members is computed.
    ops = [op for op in plan.ops if getattr(op, "module", None) != "#root"]
    assert [type(op) for op in ops] == [CopyCells, DecodeTokens, CopyCells, DecodeTokens]
    assert ops[2].start == layout.modules["b"].start and ops[2].source == "scaffold:both"
    with cache.workbench.prefilled(plan, use_cache=True) as prompt:
        assert prompt.positions() == list(plan.positions)
        logits = prompt.logits()
    assert np.isfinite(logits).all()
    again = prefill_logits(make_cache(), GAPPED, f'<prompt schema="g"><both/>{QUESTION}</prompt>', use_cache=True)
    assert np.array_equal(logits, again)


def layer0_keys(blob: bytes) -> dict[int, np.ndarray]:
    """Returns {position: first layer's K row} of a state blob (F16 or F32 K cache)."""
    # An iswa model (Gemma 3) saves its sliding-window layers, layer 0 among them, last.
    positions, k, _ = ops.layer_kv(blob, 0, section=ops.scan(blob).n_section - 1)
    return {int(pos): k[i] for i, pos in enumerate(positions)}


def test_moved_cells_are_re_rotated_before_anyone_reads_them(engine):
    # The first layer's K depends only on the token and its position, so b's cells in the
    # joint encoding (computed earlier, then moved) must match b's own cells, computed in place,
    # up to F16 rounding of the rotation. Read straight after loading: no prompt decode yet.
    layout = engine.load(GAPPED)
    b = layout.modules["b"]
    joint = layer0_keys(engine.ctx.state_get(engine.modules.sequence_of(layout, scaffold_key("both"))))
    own = layer0_keys(engine.ctx.state_get(engine.modules.sequence_of(layout, "b")))
    moved = np.stack([joint[p] for p in range(b.start, b.end)])
    direct = np.stack([own[p] for p in range(b.start, b.end)])
    assert np.abs(moved - direct).max() < 0.02 * np.abs(direct).max()
    # Not rotated, they would sit where they were computed: the gap's width earlier.
    gap = b.start - layout.modules["a"].end
    assert gap > 0
    unrotated = np.stack([own.get(p - gap, direct[0]) for p in range(b.start, b.end)])
    assert np.abs(moved - unrotated).max() > 10 * np.abs(moved - direct).max()


# --- errors -------------------------------------------------------------------------------------

def test_scaffold_with_a_union_is_refused_at_load(make_cache):
    cache = make_cache()
    with pytest.raises(SchemaError, match="scaffold 'sc' holds module 'x' of union 'u'.*move the union out"):
        cache.load_schema('<schema name="u"><scaffold name="sc"><module name="m">M</module><union name="u">'
                          '<module name="x">X</module><module name="y">Y</module></union></scaffold></schema>')
    assert "u" not in cache.schemas.names


@pytest.mark.parametrize("prompt, message", [
    ('<both/><a/>', "module 'a' is imported twice"),
    ('<a/><both/>', "module 'a' is imported twice .also by scaffold 'both'"),
    ('<both x="1"/>', "scaffold import <both/> takes no arguments"),
    ('<other><both/></other>', "scaffold 'both' must be imported at the top level"),
])
def test_bad_scaffold_imports_are_clear_errors(make_cache, prompt, message):
    cache = make_cache()
    cache.load_schema(ADJACENT, encode=False)
    with pytest.raises(PromptError, match=message):
        cache.plan(f'<prompt schema="s">{prompt}</prompt>')


def test_nested_scaffold_import_must_sit_in_its_module(make_cache):
    cache = make_cache()
    cache.load_schema('<schema name="w"><module name="p">P <scaffold name="sc"><module name="c">C</module>'
                      '</scaffold></module></schema>', encode=False)
    with pytest.raises(PromptError, match=r"inside the import of module 'p', as <p><sc/></p>"):
        cache.plan('<prompt schema="w"><sc/></prompt>')
    assert sources(cache.plan('<prompt schema="w"><p><sc/></p> Go.</prompt>'))["c"] == {"scaffold:sc"}


def test_scaffold_member_with_params_needs_explicit_imports(make_cache):
    cache = make_cache()
    cache.load_schema('<schema name="q"><scaffold name="sc"><module name="m">Plan <param name="d" len="3"/>'
                      '</module></scaffold></schema>', encode=False)
    with pytest.raises(PromptError, match="needs arguments for d; import the modules one by one"):
        cache.plan('<prompt schema="q"><sc/></prompt>')


def test_a_gapped_scaffold_is_pinned_at_its_layout_positions(engine):
    # The runs are pinned as they are computed and then moved: the pin must follow them, and
    # must not keep a cell at a position where a run was only computed.
    layout = engine.load(GAPPED)
    resident = engine.modules.resident
    held = sorted(p for key in resident.keys() for a, b in resident.intervals(key) for p in range(a, b))
    pinned = ops.section_positions(engine.ctx.state_get(engine.roles.pin))[0]
    scaffold = resident.intervals(engine.modules.key_of(layout, scaffold_key("both")))
    assert len(scaffold) == 2 and scaffold[0][1] < scaffold[1][0] < layout.length  # a gap: b's run was moved
    assert sorted(pinned.tolist()) == held  # members and scaffold alike, so some positions twice
