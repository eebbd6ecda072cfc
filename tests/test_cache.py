"""PromptCache is a façade: its owners hold the work, its earlier names still reach them, and its engine stays inside."""

from __future__ import annotations

import pytest

SCHEMA = '<schema name="s"><system>Be brief.</system><module name="a">Alpha text here.</module><user></user></schema>'


def test_each_job_has_an_owner_the_facade_hands_it_to(make_cache):
    cache = make_cache()
    cache.load_schema(SCHEMA)
    assert cache.schemas.names == ["s"] and cache.schemas.layout("s").schema == "s"
    assert cache.schemas.inspect(SCHEMA).schema == "s" and cache.schemas.encoded >= 1
    doc = cache.add_document("The Morrow Archive keeps 4,200 maps.", name="archive.txt")
    assert cache.documents.library.resolve("archive.txt").id == doc
    assert cache.documents.tokens("The Morrow Archive keeps 4,200 maps.") == cache.documents.prompt(
        "How many?", ["The Morrow Archive keeps 4,200 maps."]).documents[0].tokens
    assert cache.conversations.prompt([{"role": "user", "content": "Hi"}]).end > 0
    assert cache.stats().conversation_tips == cache.conversations.tips == 0


@pytest.mark.parametrize("old, owner, new", [
    ("schema_names", "schemas", "names"), ("modules_encoded", "schemas", "encoded"),
    ("resident_cells", "schemas", "resident_cells"), ("encoding", "schemas", "mode"),
    ("library", "documents", "library"), ("documents_encoded", "documents", "encoded"),
    ("chat_template", "conversations", "template"), ("scheduler", "workbench", "scheduler"),
])
def test_an_earlier_name_warns_and_gives_what_its_owner_gives(make_cache, old, owner, new):
    cache = make_cache()
    cache.load_schema(SCHEMA)
    with pytest.warns(DeprecationWarning, match=f"PromptCache.{old} is now PromptCache.{owner}.{new}"):
        value = getattr(cache, old)
    assert value == getattr(getattr(cache, owner), new)


def test_an_earlier_method_name_still_calls_its_owner(make_cache):
    cache = make_cache()
    cache.load_schema(SCHEMA)
    with pytest.warns(DeprecationWarning):
        layout = cache.layout("s")
    assert layout is cache.schemas.layout("s")


def test_the_engine_is_not_handed_out_and_the_error_says_where_to_look(make_cache):
    cache = make_cache()
    with pytest.raises(AttributeError, match="tests/engine/conftest.py"):
        cache.engine  # noqa: B018
    with pytest.raises(AttributeError, match="no attribute 'no_such_thing'"):
        cache.no_such_thing  # noqa: B018
