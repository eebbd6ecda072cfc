"""PromptCache's views of its cells for tests and tools: prefilled_ask, document_cells, encoding_cells."""

from __future__ import annotations

import numpy as np
import pytest

from pc_cpu.errors import PromptCacheError
from pc_cpu.kvstate import ops
from tests.engine.test_documents import FUJI, PARIS, QUESTION

SCHEMA = ('<schema name="v"><system>You answer briefly.</system><module name="a">The tea shop opened in 1990.'
          '</module><module name="b">It sells green tea.</module></schema>')


def positions(blob) -> list[int]:
    return sorted(int(p) for p in ops.section_positions(blob)[0])


def test_a_question_prefilled_without_the_cache_is_the_full_prefill_of_its_tokens(make_cache):
    # use_cache=False computes the preamble, each document, then the question, as the baseline of `ask` does.
    cache = make_cache(store=False)
    ids = [cache.add_document(PARIS), cache.add_document(FUJI)]
    prompt = cache.documents.prompt(QUESTION, [PARIS, FUJI])
    with cache.workbench.prefilled_ask(QUESTION, documents=ids, use_cache=False) as baseline:
        logits = baseline.logits()
        assert baseline.end == prompt.end and baseline.positions() == list(range(prompt.end))
    with cache.workbench.full_prefill(prompt.tokens, batch_starts=[*prompt.prefix_cuts, prompt.tail_start]) as full:
        assert np.array_equal(logits, full.logits())
    answer = cache.ask(QUESTION, documents=ids, max_tokens=1, use_cache=False)
    assert answer.token_ids[0] == int(np.argmax(logits))


def test_a_cached_question_prefilled_holds_its_documents_cells_and_its_question(make_cache):
    cache = make_cache(store=False)
    ids = [cache.add_document(PARIS), cache.add_document(FUJI)]
    prompt = cache.documents.prompt(QUESTION, [PARIS, FUJI])
    with cache.workbench.prefilled_ask(QUESTION, documents=ids, recompute="select:50%") as cached:
        assert cached.positions() == list(range(prompt.end))
        moved = range(prompt.documents[1].start, prompt.tail_start)
        assert len(cached.selected) == round(0.5 * len(moved)) and set(cached.selected) <= set(moved)
    with cache.workbench.prefilled_ask(QUESTION, documents=ids) as plain:
        assert plain.selected == ()


def test_a_documents_cells_sit_at_its_home_after_the_preamble(make_cache):
    cache = make_cache(store=False)
    doc = cache.add_document(PARIS)
    prompt = cache.documents.prompt(QUESTION, [PARIS])
    assert positions(cache.documents.cells(doc)) == list(range(prompt.home, prompt.documents[0].end))
    assert cache.documents.cells(doc) == cache.documents.cells(doc)  # served by a tier the second time: the same bytes


def test_an_encodings_cells_sit_at_its_layout_positions_and_a_missing_one_is_named(make_cache):
    cache = make_cache(store=False)
    cache.load_schema(SCHEMA, encode=False)
    with pytest.raises(PromptCacheError, match="encoding 'b' of schema 'v' is not resident; load the schema"):
        cache.schemas.cells("v", "b")
    cache.generate('<prompt schema="v"><b/><user>What does it sell?</user></prompt>', max_tokens=1)
    b = cache.schemas.layout("v").modules["b"]
    assert positions(cache.schemas.cells("v", "b")) == list(range(b.start, b.end))
