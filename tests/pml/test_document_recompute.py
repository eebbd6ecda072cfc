"""Which document positions a question over documents computes again (pml.documents.with_recompute)."""

from __future__ import annotations

import pytest

from pc_cpu.errors import PromptCacheError
from pc_cpu.pml.document_layout import layout_documents, with_recompute, with_runs
from pc_cpu.pml.recompute import parse_policy

PREAMBLE = (1, 2, 3)
DOCS = [("a", (10, 11, 12, 13)), ("b", (20, 21, 22, 23, 24)), ("c", (30, 31, 32))]
QUESTION = (31, 99)  # shares token 31 with document c only


def runs(policy: str, docs=DOCS, question=QUESTION):
    return with_recompute(layout_documents(PREAMBLE, docs, question), parse_policy(policy)).recomputed


def test_the_first_document_is_never_recomputed_it_already_is_the_full_prefill():
    # a at 3..6, b at 7..11, c at 12..14; "all" takes b and c, in one run since they touch.
    assert runs("all") == ((7, 15),)
    assert runs("0") == ()


def test_head_and_tail_take_each_moved_documents_own_tokens_in_position_order():
    assert runs("head:1") == ((7, 8), (12, 13))
    assert runs("tail:2") == ((10, 12), (13, 15))
    assert runs("head:1,tail:1") == ((7, 8), (11, 13), (14, 15))  # b's tail and c's head touch


def test_relevant_takes_the_documents_sharing_the_rarest_question_tokens():
    assert runs("relevant:1") == ((12, 15),)
    first_is_best = [("c", (30, 31, 32)), ("a", (10, 11, 12, 13))]
    assert runs("relevant:1", first_is_best) == ()  # c sits at its home: nothing to recompute


def test_counts_move_recomputed_tokens_from_cached_to_computed():
    prompt = with_recompute(layout_documents(PREAMBLE, DOCS, QUESTION), parse_policy("tail:2"))
    assert prompt.recomputed_tokens == 4
    assert prompt.cached_tokens == len(PREAMBLE) + 12 - 4


def test_select_counts_its_share_of_the_moved_documents_beside_the_runs():
    # The moved documents b and c hold 8 tokens (7..14); the engine picks which (pc_cpu.engine.prompts.document_cells).
    prompt = with_recompute(layout_documents(PREAMBLE, DOCS, QUESTION), parse_policy("select:50%"))
    assert (prompt.recomputed, prompt.selected_tokens) == ((), 4)
    assert prompt.cached_tokens == len(PREAMBLE) + 12 - 4
    both = with_recompute(layout_documents(PREAMBLE, DOCS, QUESTION), parse_policy("tail:2,select:25%"))
    assert (both.recomputed_tokens, both.selected_tokens) == (4 + 2, 2)
    # Never more than what the runs leave: relevant:1 takes c (3 tokens), 5 are left for 100%.
    most = with_recompute(layout_documents(PREAMBLE, DOCS, QUESTION), parse_policy("relevant:1,select:100%"))
    assert (most.selected_tokens, most.cached_tokens) == (5, len(PREAMBLE) + 4)
    one_document = with_recompute(layout_documents(PREAMBLE, DOCS[:1], QUESTION), parse_policy("select:50%"))
    assert one_document.selected_tokens == 0  # a first document is at its home: nothing to select from


def test_chosen_positions_join_the_runs():
    prompt = with_recompute(layout_documents(PREAMBLE, DOCS, QUESTION), parse_policy("head:1,select:25%"))
    assert with_runs(prompt, {9, 8, 14}).recomputed == ((7, 10), (12, 13), (14, 15))
    assert with_runs(prompt, {9, 8, 14}).selected_tokens == 0


def test_select_by_module_is_refused_naming_the_policies_documents_take():
    with pytest.raises(PromptCacheError, match="select:R without it, head:K, tail:K"):
        runs("select:10%@module")
