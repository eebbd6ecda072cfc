"""load_schema(progress=...) reports encoding as it happens: counts that grow batch by batch, then finished."""

from __future__ import annotations

import pytest

from pc_cpu import EncodeProgress
from pc_cpu.pml.encoding import encoding_keys, encoding_runs

LONG = " ".join(f"fact {i} is true." for i in range(160))  # ~1,150 tokens: three decode batches of 512
SCHEMA = ('<schema name="p">Read this. <module name="long">' + LONG + '</module>'
          '<module name="short">A short note.</module>'
          '<scaffold name="both"><module name="x">First part.</module><module name="y">Second part.</module>'
          '</scaffold></schema>')


def cached_tokens(cache, name: str) -> dict[str, int]:
    layout = cache.schemas.layout(name)
    return {key: sum(len(r.tokens) for r in encoding_runs(layout, key, cache.schemas.mode))
            for key in encoding_keys(layout, cache.schemas.mode)}


def test_progress_counts_grow_during_encoding_and_end_finished(make_cache, tmp_path):
    cache = make_cache(n_ctx=4096, store=tmp_path / "store")
    events: list[EncodeProgress] = []
    cache.load_schema(SCHEMA, progress=events.append)
    tokens = cached_tokens(cache, "p")

    assert {e.schema for e in events} == {"p"}
    assert {e.tokens_total for e in events} == {sum(tokens.values())}
    assert {e.modules_total for e in events} == {len(tokens)} and len(tokens) >= 5  # root, long, short, x, y, both
    done = [e.tokens_done for e in events]
    assert done == sorted(done) and done[-1] == sum(tokens.values())
    assert [e.modules_done for e in events] == sorted(e.modules_done for e in events)
    assert [e.seconds for e in events] == sorted(e.seconds for e in events)
    # The long module reports while it is computed, a batch at a time, before it is done.
    during_long = [e.tokens_done for e in events if e.module == "long" and e.modules_done < 2]
    assert len(during_long) >= 3 and len(set(during_long)) == len(during_long)
    assert 0 < during_long[0] < during_long[1] < tokens["#root"] + tokens["long"]
    assert [e.finished for e in events].index(True) == len(events) - 1
    assert events[-1].tokens_per_s > 0 and "schema 'p'" in events[-1].summary()
    # One "done" event per encoding, in schema order, whatever tier served it.
    finished_keys = [e.module for i, e in enumerate(events) if e.modules_done > (events[i - 1].modules_done if i else 0)]
    assert finished_keys == list(tokens)


def test_modules_from_the_store_are_reported_done_without_batches(make_cache, tmp_path):
    make_cache(n_ctx=4096, store=tmp_path / "store").load_schema(SCHEMA)
    events: list[EncodeProgress] = []
    second = make_cache(n_ctx=4096, store=tmp_path / "store")
    second.load_schema(SCHEMA, progress=events.append)
    assert second.schemas.encoded == 0
    assert [e.modules_done for e in events] == list(range(1, len(events) + 1))  # no per-batch events
    assert events[-1].finished and events[-1].tokens_done == events[-1].tokens_total


@pytest.mark.tiny_only  # a model that adds BOS (Gemma 3) has a token to encode in any schema
def test_a_schema_with_nothing_to_encode_reports_once(make_cache):
    cache = make_cache(store=False)
    events: list[EncodeProgress] = []
    cache.load_schema('<schema name="empty"></schema>', progress=events.append)
    assert len(events) == 1 and events[0].finished and events[0].tokens_total == 0
