"""PromptCache refuses text UTF-8 cannot encode (a lone surrogate) with a PromptCacheError, not a UnicodeEncodeError."""

from __future__ import annotations

import pytest

from pc_cpu.errors import PromptCacheError

SCHEMA = '<schema name="s"><module name="doc">A short note about boats.</module></schema>'


@pytest.fixture(scope="module")
def cache(tiny_model_path):
    from pc_cpu import PromptCache

    with PromptCache(tiny_model_path, n_ctx=512, threads=2, store=False) as pc:
        pc.load_schema(SCHEMA)
        yield pc


@pytest.mark.parametrize("call, what", [
    (lambda pc, doc: pc.add_document("Boats \udc80 float."), "the document's text"),
    (lambda pc, doc: pc.add_document("Ships sail.", system="Be \udc80"), "the system message"),
    (lambda pc, doc: pc.documents.tokens("\udc80"), "the document's text"),
    (lambda pc, doc: pc.ask("Why \udc80?", documents=[doc], max_tokens=1), "the question"),
    (lambda pc, doc: pc.ask("Why?", documents=[doc], system="\udc80", max_tokens=1), "the system message"),
    (lambda pc, doc: pc.generate('<prompt schema="s"><doc/> Why \udc80?</prompt>', max_tokens=1), "the prompt"),
    (lambda pc, doc: pc.load_schema('<schema name="t"><module name="m">\udc80</module></schema>'), "the schema"),
])
def test_a_lone_surrogate_is_a_prompt_cache_error_naming_the_text(cache, call, what):
    doc = cache.add_document("Boats float.")
    with pytest.raises(PromptCacheError, match=f"invalid Unicode: a lone surrogate .* of {what}; send UTF-8 text"):
        call(cache, doc)
    assert [d.id for d in cache.list_documents()] == [doc]  # nothing half-added
