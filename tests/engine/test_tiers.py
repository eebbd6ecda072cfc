"""Encodings survive eviction and restarts: restored from RAM or disk, re-encoded when damaged or foreign."""

from __future__ import annotations

import logging

import pytest

from pc_cpu.engine.prompts.schema_cells import ModuleCache
from pc_cpu.errors import EngineError
from tests.tiny_gguf import write_tiny_llama_gguf

DOCS = {name: f"Document {name}: " + " ".join(f"{name}{i} fact number {i}." for i in range(12)) for name in "abc"}
SCHEMA = ('<schema name="t">Read this. <union name="doc">'
          + "".join(f'<module name="{n}">{t}</module>' for n, t in DOCS.items()) + "</union></schema>")


def prompt(name: str) -> str:
    return f'<prompt schema="t"><{name}/> What number comes after eleven?</prompt>'


@pytest.fixture
def store_dir(tmp_path):
    return tmp_path / "store"


def answers(cache) -> dict[str, list[int]]:
    return {name: cache.generate(prompt(name), max_tokens=6).token_ids for name in DOCS}


def cells_ids(cache) -> set[str]:
    """Returns the model ids the RAM tier's cells are stored under (the library context's Context.cells_id)."""
    return {key.model for key in cache.store.tier("ram").keys()}


def test_a_second_process_serves_from_disk_without_encoding(make_cache, store_dir):
    first = make_cache(store=store_dir)
    first.load_schema(SCHEMA)
    expected = answers(first)
    second = make_cache(store=store_dir)  # a fresh context and RAM tier: only the files are shared
    second.load_schema(SCHEMA, encode=False)
    result = second.generate(prompt("b"), max_tokens=6)
    assert result.tiers == {"#root": "disk", "b": "disk"}
    assert second.schemas.encoded == 0
    assert result.token_ids == expected["b"]


def test_cells_stored_with_flash_attention_are_kept_apart_from_cells_without_it(make_cache, store_dir):
    flash = make_cache(store=store_dir, flash_attn=True)
    flash.load_schema(SCHEMA)
    assert set(flash.add_document("Ferns grow in shade.").tiers.values()) == {"encoded"}
    plain = make_cache(store=store_dir, flash_attn=False)  # V transposed: llama.cpp will not restore flash cells into it
    assert flash.flash_attn and not plain.flash_attn
    plain.load_schema(SCHEMA)
    assert cells_ids(plain) != cells_ids(flash) == {flash.model.info.fingerprint}  # older entries keep their key
    assert plain.schemas.encoded == flash.schemas.encoded > 0  # not served the other layout's cells: its own
    result = plain.generate(prompt("b"), max_tokens=6)
    assert result.token_ids == plain.generate(prompt("b"), max_tokens=6, use_cache=False).token_ids
    assert set(plain.add_document("Ferns grow in shade.").tiers.values()) == {"encoded"}  # documents too
    # Flash entries kept the plain fingerprint when flash attention was llama.cpp's choice (on, on a CPU),
    # so a store made before it went off by default still serves a cache that turns it on.
    again = make_cache(store=store_dir, flash_attn=True)
    again.load_schema(SCHEMA, encode=False)
    assert set(again.generate(prompt("b"), max_tokens=6).tiers.values()) == {"disk"} and again.schemas.encoded == 0
    default = make_cache(store=store_dir)  # off, except on sliding-window models (default_flash_attn)
    default.load_schema(SCHEMA, encode=False)
    assert set(default.generate(prompt("b"), max_tokens=6).tiers.values()) == {"disk"} and default.schemas.encoded == 0
    assert cells_ids(default) == cells_ids(flash if default.model.info.n_swa else plain)  # promoted from disk


@pytest.mark.tiny_only  # equal tokens across cell layouts: SmolLM2's rounding flips a near-tie (README)
def test_evicted_modules_come_back_from_ram_with_the_same_answers(make_cache, store_dir):
    roomy = make_cache(store=False)
    roomy.load_schema(SCHEMA)
    expected = answers(roomy)
    cells = roomy.schemas.layout("t").modules["a"].n_tokens
    # One prompt slot: its stream keeps only the last prompt's cells for reuse (the one before "a" is "c").
    tight = make_cache(store=False, n_ctx=2 * cells + 40, parallel=1)  # room for one document at a time
    tight.load_schema(SCHEMA)
    assert tight.schemas.resident_cells < roomy.schemas.resident_cells  # the schema does not fit: some were evicted
    assert answers(tight) == expected
    again = tight.generate(prompt("a"), max_tokens=6)
    assert again.tiers["a"] == "ram" and again.token_ids == expected["a"]
    assert tight.schemas.encoded == roomy.schemas.encoded  # nothing encoded twice


def test_restored_cells_sit_at_the_layout_positions(make_cache, store_dir):
    make_cache(store=store_dir).load_schema(SCHEMA)
    cache = make_cache(store=store_dir)
    cache.load_schema(SCHEMA, encode=False)
    plan = cache.plan(prompt("c"))
    assert cache.workbench.prepare(plan, use_cache=True)["c"] == "disk"
    with cache.workbench.prefilled(plan, use_cache=True) as prefilled:
        assert prefilled.positions() == list(plan.positions)


def damage_flip(path):
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))


def damage_truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def damage_garbage(path):
    path.write_bytes(b"not a store file at all" * 10)


@pytest.mark.parametrize("damage", [damage_flip, damage_truncate, damage_garbage], ids=["flip", "truncate", "garbage"])
def test_damaged_store_files_are_reported_once_and_re_encoded(make_cache, store_dir, damage, caplog):
    clean = make_cache(store=store_dir)
    clean.load_schema(SCHEMA)
    expected = answers(clean)
    for path in store_dir.glob("*.pcs"):
        damage(path)
    with caplog.at_level(logging.WARNING):
        cache = make_cache(store=store_dir)
        cache.load_schema(SCHEMA, encode=False)
        result = cache.generate(prompt("a"), max_tokens=6)
    assert result.tiers == {"#root": "encoded", "a": "encoded"}
    assert result.token_ids == expected["a"]
    assert answers(cache) == expected
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == len(DOCS) + 1  # once per file


def test_another_models_states_are_never_used(make_cache, store_dir, tmp_path):
    make_cache(store=store_dir).load_schema(SCHEMA)
    other_model = write_tiny_llama_gguf(tmp_path / "other.gguf", seed=1)
    cache = make_cache(other_model, store=store_dir)
    cache.load_schema(SCHEMA, encode=False)
    assert set(cache.generate(prompt("a"), max_tokens=2).tiers.values()) == {"encoded"}


def test_store_false_keeps_nothing_on_disk(make_cache, store_dir, monkeypatch):
    monkeypatch.setenv("PC_CPU_STORE_DIR", str(store_dir))
    cache = make_cache(store=False)
    cache.load_schema(SCHEMA)
    assert not store_dir.exists() or not any(store_dir.iterdir())
    assert [t.name for t in cache.store.tiers] == ["ram"]


def test_a_union_member_read_from_disk_brings_its_siblings_into_ram(make_cache, store_dir):
    make_cache(store=store_dir).load_schema(SCHEMA)
    cache = make_cache(store=store_dir)
    cache.load_schema(SCHEMA, encode=False)
    assert cache.generate(prompt("a"), max_tokens=1).tiers["a"] == "disk"
    ram = cache.store.tier("ram")
    assert {key.label.split("/")[-1] for key in ram.keys()} >= set(DOCS)
    assert cache.generate(prompt("b"), max_tokens=1).tiers["b"] == "ram"


def test_evict_frees_the_context_and_the_next_prompt_restores_from_ram(make_cache):
    cache = make_cache(store=False)
    cache.load_schema(SCHEMA)
    expected = cache.generate(prompt("a"), max_tokens=6).token_ids
    assert cache.evict("t") > 0 and cache.schemas.resident_cells == 0
    result = cache.generate(prompt("a"), max_tokens=6)
    assert result.tiers == {"#root": "ram", "a": "ram"} and result.token_ids == expected


# --- the pin, in the machinery built as a PromptCache builds it (tests/engine/machinery.py Engine) ---

def pinned_cells(engine) -> int:
    """Returns how many cells the pin sequence holds (every resident cell, and nothing else)."""
    from pc_cpu.kvstate import state_blob

    if engine.ctx.seq_pos_max(engine.roles.pin) < 0:
        return 0
    return state_blob.scan(engine.ctx.state_get(engine.roles.pin)).n_cell


def engine_answers(engine, layout) -> dict[str, list[int]]:
    return {name: engine.generate(layout, prompt(name), max_tokens=6).token_ids for name in DOCS}


def test_the_pin_holds_exactly_the_resident_cells_through_eviction(make_engine):
    # Every resident cell is shared with the pin so that llama.cpp's sliding-window cache never reuses
    # it; dropping an encoding must release only its own cells, even where another holds the same positions.
    other = SCHEMA.replace('name="t"', 'name="u"').replace("Read this.", "Read that.")
    engine = make_engine()
    layout = engine.load(SCHEMA)
    engine.load(other)  # the same positions again, in other library sequences
    assert pinned_cells(engine) == engine.resident.cells > 0
    engine.evict("u")
    assert pinned_cells(engine) == engine.resident.cells > 0
    assert engine.generate(layout, prompt("c"), max_tokens=4, recompute="tail:4").token_ids
    engine.evict("t")  # as unload_schema frees its cells
    assert engine.resident.cells == pinned_cells(engine) == 0


def refuse(*args) -> None:
    raise EngineError("refused for this test")


def test_a_stored_state_refused_at_restore_is_removed_and_re_encoded(make_engine, store_dir, monkeypatch, caplog):
    clean = make_engine(store=store_dir)
    expected = engine_answers(clean, clean.load(SCHEMA))
    engine = make_engine(store=store_dir)
    layout = engine.layout(SCHEMA)  # laid out, not encoded
    # llama.cpp refuses the bytes both ways: restored straight into the prompt's stream, then into the library.
    monkeypatch.setattr(ModuleCache, "restore_stored", refuse)
    monkeypatch.setattr(ModuleCache, "_restore", lambda self, entry, runs, library, shift=0: "refused for this test")

    with caplog.at_level(logging.WARNING):
        result = engine.generate(layout, prompt("a"), max_tokens=6)

    assert result.tiers == {"#root": "encoded", "a": "encoded"}
    assert result.token_ids == expected["a"]
    assert sum("refused for this test" in r.getMessage() for r in caplog.records) == 2  # ROOT's preamble and a
    assert pinned_cells(engine) == engine.resident.cells > 0  # the refused slots left nothing behind
    monkeypatch.undo()
    assert engine.evict("t") and engine.generate(layout, prompt("a"), max_tokens=6).tiers["a"] == "ram"  # stored afresh
