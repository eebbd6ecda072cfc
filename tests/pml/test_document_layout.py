"""pc_cpu.pml.document_layout: text that cannot become UTF-8 is refused by name, before a tokenizer or a hash sees it."""

from __future__ import annotations

import pytest

from pc_cpu.errors import DocumentError, PromptCacheError
from pc_cpu.pml.document_layout import (STAND_IN_DOCUMENTS, STAND_IN_TOKENS, DocumentToPlace, check_encoding,
                                        check_question, document_id, document_segment, layout_documents,
                                        order_documents, place_documents, preamble_tokens, stand_in_places, stand_ins)
from tests.fake_tokenizer import WordTokenizer
from tests.pml.conftest import CHATML_MARKUP, utf8_refusal


def test_the_question_the_document_and_the_system_message_are_each_named():
    with pytest.raises(PromptCacheError, match=utf8_refusal("the question", 5)):
        check_question("Why?\udc80")
    with pytest.raises(PromptCacheError, match=utf8_refusal("the document's text", 7)):
        document_id("Boats \udc80 float.")
    with pytest.raises(PromptCacheError, match=utf8_refusal("the system message", 4)):
        preamble_tokens("Be \udc80", WordTokenizer(), CHATML_MARKUP)


DOCS = [("fuji", (10, 11, 12)), ("paris", (20, 21, 22, 23)), ("nile", (30, 31))]
ABOUT_PARIS = (21, 23, 99)  # shares two rare tokens with "paris" only


def _ids(placed):
    return [doc_id for doc_id, _ in placed]


def test_order_moves_the_document_most_like_the_question_and_keeps_the_rest_in_order():
    assert _ids(order_documents(DOCS, ABOUT_PARIS, "given")) == ["fuji", "paris", "nile"]
    assert _ids(order_documents(DOCS, ABOUT_PARIS, "relevant-first")) == ["paris", "fuji", "nile"]
    assert _ids(order_documents(DOCS, ABOUT_PARIS, "relevant-last")) == ["fuji", "nile", "paris"]
    assert order_documents(DOCS, ABOUT_PARIS, "relevant-last")[-1] == DOCS[1]  # tokens travel with their id


def test_order_of_one_document_or_a_question_sharing_nothing_is_the_given_one():
    assert order_documents(DOCS[:1], ABOUT_PARIS, "relevant-last") == DOCS[:1]
    # No shared token: every score is 0 and the first document wins the tie, as most_relevant ranks.
    assert _ids(order_documents(DOCS, (98, 99), "relevant-last")) == ["paris", "nile", "fuji"]


def test_an_unknown_order_names_the_ones_there_are():
    with pytest.raises(PromptCacheError, match="order='random' is not an order; use one of given, relevant-first"):
        order_documents(DOCS, ABOUT_PARIS, "random")


def test_the_first_documents_are_encoded_after_the_ones_before_them_and_later_groups_after_the_group_before():
    n = STAND_IN_DOCUMENTS
    assert [list(stand_in_places(i)) for i in range(n)] == [list(range(i)) for i in range(n)]
    for i in range(n, 3 * n):  # one stand-in context per group: adding a group computes it once
        group = i - i % n
        assert list(stand_in_places(i)) == list(range(group - n, group))


def test_stand_ins_keep_the_last_tokens_that_fit():
    before = [tuple(range(100 * d, 100 * d + 300)) for d in range(3)]  # 900 tokens
    kept = stand_ins(before, room=10_000)
    assert len(kept) == STAND_IN_TOKENS and kept[-1] == before[-1][-1]
    assert stand_ins(before, room=7) == before[-1][-7:]  # a long document leaves less room
    assert stand_ins(before, room=0) == () and stand_ins([], room=100) == ()


def test_the_first_document_of_a_prompt_is_encoded_after_the_preamble_alone():
    after = {"a": (7, 8), "b": (9,)}
    prompt = layout_documents((1, 2), [("a", (3, 4)), ("b", (5,))], (6,), after)
    first, second = prompt.documents
    assert first.after == () and first.context(prompt.preamble) == (1, 2)  # where the full prefill computes it
    assert second.after == (9,) and second.context(prompt.preamble) == (1, 2, 9)
    assert prompt.tokens == (1, 2, 3, 4, 5, 6)  # stand-ins are never prompt tokens
    assert all(d.after == () for d in layout_documents((1,), [("a", (3,)), ("b", (5,))], (6,)).documents)


def test_the_prefix_is_computed_in_a_call_for_the_preamble_and_one_for_each_document():
    # The calls a first document at its home was computed in: its preamble's, then its own.
    prompt = layout_documents((1, 2), [("a", (3, 4)), ("b", (5,))], (6,))
    assert prompt.prefix_cuts == (0, 2, 4) and prompt.tail_start == 5
    assert layout_documents((), [("a", (3, 4))], (6,)).prefix_cuts == (0,)  # no preamble: the document alone
    assert layout_documents((1, 2), [], (6,)).prefix_cuts == (0,)


def test_an_unknown_encoding_names_the_ones_there_are():
    assert check_encoding("library") == "library"
    with pytest.raises(DocumentError, match="library, preamble"):
        check_encoding("chain")


def test_a_document_segment_is_computed_at_its_home_right_after_its_context():
    segment = document_segment((1, 2, 3), (7, 8), "document doc-x")

    assert (segment.start, segment.end, segment.first_position, segment.context) == (3, 5, 0, (1, 2, 3))
    assert document_segment((), (1, 2, 3), "document preamble").runs[0].start == 0  # a preamble is its own home


def test_documents_are_placed_after_their_stand_ins_within_the_room_the_context_leaves():
    first = DocumentToPlace("d1", (11, 12, 13))
    second = DocumentToPlace("d2", (21, 22), before=(("d0", tuple(range(100, 700))), ("d1", (11, 12, 13))))
    placed = place_documents((1, 2), [first, second], (9,), n_ctx=4096)
    assert placed.documents[0].after == ()  # the first sits at its home, after the preamble alone
    assert placed.documents[1].after == stand_ins([tuple(range(100, 700)), (11, 12, 13)], 4096 - 2 - 2 - 1)
    assert placed.documents[1].after_ids == ("d0", "d1")
    tight = place_documents((1, 2), [first, second], (9,), n_ctx=20)
    assert len(tight.documents[1].after) == 20 - 2 - 2 - 1  # no more stand-ins than the context has room for
