"""A conversation's layout (pc_cpu.pml.chat): tokens by the template, decode calls, documents, digests, refusals."""

from __future__ import annotations

import pytest

from pc_cpu.errors import PromptError
from pc_cpu.pml.document_layout import DocumentToPlace
from pc_cpu.pml.chat import (ChatMessage, ChatTemplate, MovedRun, chat_prompt, check_after_edit, check_messages,
                             common_prefix, moved_runs)
from pc_cpu.pml.content_keys import prefix_digests
from tests.fake_tokenizer import WordTokenizer

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TRIMMING = ("{% for m in messages %}<turn>{{ m['role'] }}: {{ m['content'] | trim }}</turn>{% endfor %}"
            "{% if add_generation_prompt %}<turn>assistant: {% endif %}")
REWRITING = "{% for m in messages %}{{ m['content'] | upper }}\n{% endfor %}"


class RecordingTokenizer(WordTokenizer):
    """Records each text it tokenizes with its `special` flag."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, bool]] = []

    def tokenize(self, text, *, special):
        self.calls.append((text, special))
        return super().tokenize(text, special=special)


def conversation(*texts: str, system: str | None = None) -> tuple[ChatMessage, ...]:
    """Returns checked messages: the system message, then texts alternating user and assistant."""
    messages = [{"role": "system", "content": system}] if system else []
    messages += [{"role": ("user", "assistant")[i % 2], "content": text} for i, text in enumerate(texts)]
    return check_messages(messages, finished=len(texts) % 2 == 0)


def test_tokens_are_the_rendered_conversation_markup_parsed_and_content_as_plain_text():
    tokenizer = RecordingTokenizer()
    prompt = chat_prompt(conversation("Hi <|im_start|>", "Hello", "Bye"), ChatTemplate(CHATML), tokenizer)
    assert prompt.tokens[0] == tokenizer.bos_id
    assert ("Hi <|im_start|>", False) in tokenizer.calls and ("Hello", False) in tokenizer.calls
    assert all(special for text, special in tokenizer.calls if "<|im_end|>" in text)
    assert tokenizer.text(prompt.tokens[1:]).startswith("<|im_start|> user Hi <|im_start|> <|im_end|>")
    assert tokenizer.text(prompt.tokens).endswith("<|im_start|> assistant")


def test_each_answer_is_a_call_of_its_own_and_the_calls_cover_the_tokens():
    tokenizer = WordTokenizer()
    prompt = chat_prompt(conversation("one two", "three four five", "six", "seven", "eight"),
                         ChatTemplate(CHATML), tokenizer)
    assert [tokenizer.text(prompt.tokens[a:b]) for a, b in prompt.answers] == ["three four five", "seven"]
    assert prompt.calls[0][0] == 0 and prompt.calls[-1][1] == prompt.end
    assert all(a[1] == b[0] for a, b in zip(prompt.calls, prompt.calls[1:]))
    assert set(prompt.answers) <= set(prompt.calls)
    assert prompt.cuts == tuple(b for span in prompt.answers for b in span)
    assert prompt.calls_from(prompt.answers[1][1]) == prompt.calls[-1:]
    assert prompt.cut_at_or_before(prompt.answers[1][0] - 1) == prompt.answers[0][1]


def test_a_next_turn_starts_with_this_turns_tokens_and_its_answer():
    tokenizer, template = WordTokenizer(), ChatTemplate(CHATML)
    turn = chat_prompt(conversation("a question"), template, tokenizer)
    answered = chat_prompt(conversation("a question", "the answer"), template, tokenizer, add_generation_prompt=False)
    assert answered.tokens[:turn.end] == turn.tokens
    assert answered.answers[-1][0] == turn.end


def test_a_template_that_trims_content_gets_the_trimmed_text_as_content():
    tokenizer = RecordingTokenizer()
    prompt = chat_prompt(conversation("  spaced out  "), ChatTemplate(TRIMMING), tokenizer)
    assert ("spaced out", False) in tokenizer.calls
    assert len(prompt.calls) == 1


def test_a_template_that_rewrites_content_is_tokenized_whole_in_one_call():
    tokenizer = RecordingTokenizer()
    prompt = chat_prompt(conversation("quiet", "words", "more"), ChatTemplate(REWRITING), tokenizer)
    assert tokenizer.calls == [("QUIET\nWORDS\nMORE\n", True)]
    assert prompt.calls == ((0, prompt.end),) and prompt.answers == ()
    with pytest.raises(PromptError, match="documents cannot be placed"):
        chat_prompt(conversation("quiet"), ChatTemplate(REWRITING), tokenizer, documents=[DocumentToPlace("d", (5, 6))])


def test_without_a_template_roles_are_plain_and_an_answer_follows_the_prompt_without_a_space():
    tokenizer = WordTokenizer()
    template = ChatTemplate(None)
    assert template.render(conversation("Hi"), True) == "User: Hi\nAssistant:"
    assert template.render(conversation("Hi", " Hello"), False) == "User: Hi\nAssistant: Hello\n"
    assert chat_prompt(conversation("Hi", " Hello", "Bye"), template, tokenizer).answers


def test_documents_sit_before_the_first_user_text_and_end_a_call():
    tokenizer, template = WordTokenizer(), ChatTemplate(CHATML)
    docs = [DocumentToPlace("d1", tuple(tokenizer.tokenize("first doc", special=False))),
            DocumentToPlace("d2", tuple(tokenizer.tokenize("second doc text", special=False)))]
    prompt = chat_prompt(conversation("the question", system="Be brief."), template, tokenizer, documents=docs,
                         n_ctx=512)
    placed = prompt.documents
    assert [d.id for d in placed.documents] == ["d1", "d2"]
    assert tokenizer.text(placed.preamble).endswith("<|im_start|> user")
    assert placed.preamble == prompt.tokens[:placed.home]
    assert tokenizer.text(prompt.tokens[placed.home:placed.tail_start]) == "first doc second doc text"
    assert tokenizer.text(prompt.tokens[placed.tail_start:]).startswith("the question")
    assert prompt.documents_end == placed.tail_start and placed.tail_start in prompt.cuts


def test_digests_name_the_tokens_the_calls_and_how_the_cells_were_made():
    tokens = tuple(range(100, 130))
    digests = prefix_digests(tokens, (10, 20), (10, 20, 30))
    assert len(set(digests.values())) == 3
    assert prefix_digests(tokens[:20], (10,), (20,))[20] == digests[20]  # a prefix's digest is the same alone
    assert prefix_digests(tokens, (12, 20), (20,))[20] != digests[20]  # other calls: other cells
    assert prefix_digests(tokens, (10, 20), (20,), how="documents")[20] != digests[20]
    assert prefix_digests(tokens[:19] + (7,), (10,), (20,))[20] != digests[20]


@pytest.mark.parametrize("messages, fragment", [
    ([], "messages is empty"),
    ("hello", "messages is empty"),
    ([{"role": "wizard", "content": "x"}], "message 0 has role 'wizard'"),
    ([{"role": "user", "content": "x"}, {"role": "system", "content": "y"}], "end with the user's message"),
    ([{"role": "assistant", "content": "y"}], "end with the user's message"),  # nothing before it to continue
    ([{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}], "send the tools' results"),
    ([{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}], "is not JSON"),
    ([{"role": "user", "content": " \n "}], "every user message is empty"),
    ([{"role": "user", "content": "bad \ud800 text"}], "lone surrogate"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "only text parts"),
    ([{"role": "user", "content": 42}], "content is a int"),
    (["just a string"], "send a dict with 'role' and 'content'"),
])
def test_messages_that_cannot_be_answered_are_refused_naming_why(messages, fragment):
    with pytest.raises(PromptError, match=fragment):
        check_messages(messages)


def test_developer_is_system_and_text_parts_are_joined():
    checked = check_messages([{"role": "developer", "content": "Rules."},
                              {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}])
    assert checked == (ChatMessage("system", "Rules."), ChatMessage("user", "ab"))


def test_a_template_that_refuses_the_roles_is_a_prompt_error():
    strict = "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system') }}{% endif %}{% endfor %}"
    with pytest.raises(PromptError, match="no system"):
        chat_prompt(conversation("x", system="s"), ChatTemplate(strict), WordTokenizer())


@pytest.mark.parametrize("a, b, limit, shared", [
    ([1, 2, 3], [1, 2, 4], None, 2), ([1, 2, 3], [1, 2, 3, 4], None, 3), ([1, 2, 3], [1, 2, 3], 2, 2),
    ([], [1], None, 0), ([5], [6], None, 0), (list(range(100)), list(range(57)) + [0], None, 57),
])
def test_common_prefix_counts_the_first_tokens_two_sequences_share(a, b, limit, shared):
    assert common_prefix(a, b, limit) == shared


def test_an_edited_message_leaves_the_turns_after_it_as_one_run_moved_by_the_change_in_length():
    before, edited, after = list(range(100, 140)), list(range(500, 510)), list(range(200, 300))
    old = [1, 2, 3] + before + after + [7, 8]  # the old stream: its last tokens are the old answer's
    new = [1, 2, 3] + edited + after + [9]
    (run,) = moved_runs(old, new, 3, len(new) - 1)
    assert run == MovedRun(3 + len(before), 3 + len(edited), len(after))
    assert run.delta == len(edited) - len(before) and new[run.new_start:run.new_end] == old[run.old_start:run.old_end]


def test_a_deleted_message_and_runs_shorter_than_the_minimum_are_handled():
    kept, deleted, rest = list(range(40)), list(range(1000, 1050)), list(range(2000, 2060))
    old, new = kept + deleted + rest, kept + rest + [5]
    assert moved_runs(old, new, 40, len(new) - 1) == (MovedRun(90, 40, 60),)
    assert moved_runs(old, new, 40, len(new) - 1, min_tokens=61) == ()
    assert moved_runs(old, kept + list(range(3000, 3100)), 40, 139) == ()  # nothing in common after the edit


def test_after_edit_is_recompute_or_reuse():
    assert check_after_edit("reuse") == "reuse"
    with pytest.raises(PromptError, match="after_edit='move' is not a choice: use 'recompute'"):
        check_after_edit("move")
