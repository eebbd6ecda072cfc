"""pc_cpu.pml.documents: text that cannot become UTF-8 is refused by name, before a tokenizer or a hash sees it."""

from __future__ import annotations

import pytest

from pc_cpu.errors import PromptCacheError
from pc_cpu.pml.documents import check_question, document_id, order_documents, preamble_tokens
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
