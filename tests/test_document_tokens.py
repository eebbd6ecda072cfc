"""PromptCache.document_tokens (pc_cpu.documents.Documents.tokens): a document is tokenized once, not on every question."""

from __future__ import annotations

import pc_cpu.documents

PARIS = "The Eiffel Tower stands in Paris. It is 330 metres tall and was finished in 1889."
FUJI = "Mount Fuji is the highest mountain in Japan, 3,776 metres above the sea."


def test_a_question_does_not_tokenize_its_documents_again(make_cache, monkeypatch):
    cache = make_cache(store=False)
    ids = [cache.add_document(text) for text in (PARIS, FUJI)]
    first = cache.ask("How tall?", documents=ids, max_tokens=2, prefix="off")
    seen = []
    tokenize = cache.model.tokenize
    monkeypatch.setattr(cache.model, "tokenize", lambda text, **kw: seen.append(text) or tokenize(text, **kw))
    second = cache.ask("How tall?", documents=ids, max_tokens=2, prefix="off")
    assert PARIS not in seen and FUJI not in seen and seen  # the question and its markup still are
    assert second.token_ids == first.token_ids and second.prompt_tokens == first.prompt_tokens


def test_the_kept_tokens_are_bounded_and_still_right(make_cache, monkeypatch):
    monkeypatch.setattr(pc_cpu.documents, "TOKENS_KEPT", 2)
    cache = make_cache(store=False)
    texts = [PARIS, FUJI, "A third document.", "A fourth one."]
    expected = [cache.documents.tokens(t) for t in texts]
    seen = []
    tokenize = cache.model.tokenize
    monkeypatch.setattr(cache.model, "tokenize", lambda text, **kw: seen.append(text) or tokenize(text, **kw))
    cache.documents.tokens(texts[-1])
    assert texts[-1] not in seen  # the last two are kept...
    assert [cache.documents.tokens(t) for t in texts] == expected  # evicted ones are tokenized again, the same
    assert PARIS in seen and FUJI in seen  # ...and no more than two: the first two had been dropped


def test_the_least_recently_used_tokens_are_the_ones_dropped(make_cache, monkeypatch):
    monkeypatch.setattr(pc_cpu.documents, "TOKENS_KEPT", 2)
    cache = make_cache(store=False)
    third = "A third document."
    cache.documents.tokens(PARIS)
    cache.documents.tokens(FUJI)
    cache.documents.tokens(PARIS)  # now FUJI is the least recently used
    cache.documents.tokens(third)  # one too many: FUJI goes, PARIS stays
    seen = []
    tokenize = cache.model.tokenize
    monkeypatch.setattr(cache.model, "tokenize", lambda text, **kw: seen.append(text) or tokenize(text, **kw))
    cache.documents.tokens(PARIS)
    cache.documents.tokens(third)
    assert seen == []  # both kept
    cache.documents.tokens(FUJI)
    assert FUJI in seen
