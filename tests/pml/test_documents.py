"""pc_cpu.pml.documents: text that cannot become UTF-8 is refused by name, before a tokenizer or a hash sees it."""

from __future__ import annotations

import pytest

from pc_cpu.errors import PromptCacheError
from pc_cpu.pml.documents import check_question, document_id, preamble_tokens
from tests.fake_tokenizer import WordTokenizer
from tests.pml.conftest import CHATML_MARKUP, utf8_refusal


def test_the_question_the_document_and_the_system_message_are_each_named():
    with pytest.raises(PromptCacheError, match=utf8_refusal("the question", 5)):
        check_question("Why?\udc80")
    with pytest.raises(PromptCacheError, match=utf8_refusal("the document's text", 7)):
        document_id("Boats \udc80 float.")
    with pytest.raises(PromptCacheError, match=utf8_refusal("the system message", 4)):
        preamble_tokens("Be \udc80", WordTokenizer(), CHATML_MARKUP)
