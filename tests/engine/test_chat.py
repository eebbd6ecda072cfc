"""Conversations (PromptCache.chat): each turn reuses its history and answers as the full prefill of its messages."""

from __future__ import annotations

import dataclasses
from array import array

import pytest

from pc_cpu import document_settings
from pc_cpu.engine.prompts import chat_prompt
from pc_cpu.engine.prompts.chat_prompt import Tip, TipIndex
from pc_cpu.errors import ContextOverflowError, PromptCacheError
from pc_cpu.store.disk import DiskStore
from pc_cpu.store.keys import StoreKey
from tests.conftest import cache_factory
from tests.engine.conftest import EVERY_MODEL, model_path

SYSTEM = {"role": "system", "content": "You answer in one short sentence."}
QUESTIONS = ["Name a large city by the sea.", "What is it known for?", "Name another one."]


def talk(cache, questions, *, max_tokens=12, pause=True, **options):
    """Returns the Results of a conversation asking `questions` in turn, each answer sent back as it came."""
    messages, results = [SYSTEM], []
    for question in questions:
        messages.append({"role": "user", "content": question})
        result = cache.chat(messages, max_tokens=max_tokens, **options)
        results.append(result)
        messages.append({"role": "assistant", "content": result.text})
        if pause:
            cache.wait_idle()  # as between a user's turns: the answer's cells are repaired and stored
    return results, messages


@pytest.fixture
def make_tiny(tiny_model_path):
    """PromptCaches on the tiny model: the reuse rules do not depend on the model, and it is fast."""
    yield from cache_factory(tiny_model_path)


@pytest.mark.parametrize("name", EVERY_MODEL)
def test_every_turn_answers_as_the_full_prefill_of_its_messages_and_reuses_the_turns_before(name, tiny_model_path,
                                                                                           make_tiny):
    cache = make_tiny(model_path(name, tiny_model_path), n_ctx=2048)
    results, messages = talk(cache, QUESTIONS)
    for turn, result in enumerate(results):
        history = messages[:2 + 2 * turn]
        baseline = cache.chat(history, max_tokens=12, use_cache=False)
        assert result.token_ids == baseline.token_ids, f"turn {turn + 1}"
        assert result.prompt_tokens == baseline.prompt_tokens and baseline.cached_tokens == 0
    first, *later = results
    assert first.cached_tokens == 0
    for before, result in zip(results, later):
        assert result.cached_tokens >= before.prompt_tokens  # the previous turn, its answer too
        assert result.tiers == {"#conversation": "context"}


def test_a_turn_sent_before_the_repair_computes_the_answer_again_and_answers_as_the_full_prefill(
        make_smollm2_cache, monkeypatch):
    monkeypatch.setattr(chat_prompt, "REPAIR_DELAY_S", 600.0)  # no repair before the next turn, however slow the machine
    cache = make_smollm2_cache(n_ctx=2048)
    results, messages = talk(cache, QUESTIONS, pause=False, max_tokens=8)  # back to back; answers cut by max_tokens
    for turn, result in enumerate(results):
        assert result.token_ids == cache.chat(messages[:2 + 2 * turn], max_tokens=8, use_cache=False).token_ids
    first, second, _ = results
    layout = cache.conversations.prompt(messages[:3], add_generation_prompt=False)
    start, end = layout.answers[-1]
    assert layout.tokens[start:end] == tuple(first.token_ids)  # the text sent back gives the generated tokens
    # Its prompt exactly: the answer's cells as generated are not kept but computed again, as the full prefill does.
    assert second.cached_tokens == first.prompt_tokens and second.tiers == {"#conversation": "context"}


def test_after_edit_reuse_keeps_an_answers_cells_as_generated(make_smollm2_cache):
    cache = make_smollm2_cache(n_ctx=2048)
    results, _ = talk(cache, QUESTIONS[:2], pause=False, max_tokens=8, after_edit="reuse")
    first, second = results
    # Every cell the first turn left: its prompt and its answer but the last token (sampled, never
    # decoded); all of the answer if the repair ran first.
    assert second.cached_tokens >= first.prompt_tokens + len(first.token_ids) - 1
    assert second.tiers == {"#conversation": "context"}


def test_history_comes_back_from_the_disk_tier_in_a_new_process(make_tiny, tmp_path):
    first = make_tiny(n_ctx=2048, store=tmp_path)
    _, messages = talk(first, QUESTIONS[:2])
    first.close()
    messages.append({"role": "user", "content": QUESTIONS[2]})
    cache = make_tiny(n_ctx=2048, store=tmp_path)
    result = cache.chat(messages, max_tokens=12)
    assert result.tiers == {"#conversation": "disk"}
    assert result.cached_tokens == cache.conversations.prompt(messages[:-1], add_generation_prompt=False).answers[-1][1]
    assert result.token_ids == cache.chat(messages, max_tokens=12, use_cache=False).token_ids


def test_interleaved_conversations_each_keep_their_history(make_tiny):
    cache = make_tiny(n_ctx=2048, parallel=3)
    topics = ["rivers", "mountains", "deserts"]
    alone = {}
    for topic in topics:  # each conversation alone, in a fresh cache: what interleaving must not change
        solo = make_tiny(n_ctx=2048, parallel=3, store=False)
        alone[topic] = [r.token_ids for r in talk(solo, [f"Name one of the {topic}.", "And another?"])[0]]
        solo.close()
    histories = {topic: [SYSTEM] for topic in topics}
    for turn, question in enumerate(["Name one of the {}.", "And another?"]):
        for topic in topics:
            history = histories[topic]
            history.append({"role": "user", "content": question.format(topic)})
            result = cache.chat(history, max_tokens=12)
            cache.wait_idle()
            history.append({"role": "assistant", "content": result.text})
            assert result.token_ids == alone[topic][turn]
            if turn:
                assert result.tiers == {"#conversation": "context"} and result.cached_tokens > 0


def test_a_conversation_pushed_out_of_its_slot_comes_back_from_ram(make_tiny):
    cache = make_tiny(n_ctx=2048, parallel=1, store=False)
    _, first = talk(cache, ["Name a river."])
    talk(cache, ["Name a mountain."])  # takes the only slot
    first.append({"role": "user", "content": "How long is it?"})
    result = cache.chat(first, max_tokens=12)
    assert result.tiers == {"#conversation": "ram"} and result.cached_tokens > 0
    assert result.token_ids == cache.chat(first, max_tokens=12, use_cache=False).token_ids


def test_an_edited_earlier_message_reuses_the_turns_before_it(make_tiny):
    cache = make_tiny(n_ctx=2048)
    _, messages = talk(cache, QUESTIONS)
    edited = messages[:3] + [{"role": "user", "content": "What is it famous for, in one word?"}]
    result = cache.chat(edited, max_tokens=12)
    reused_until = cache.conversations.prompt(messages[:3], add_generation_prompt=False).answers[-1][1]
    assert result.cached_tokens == reused_until
    assert result.token_ids == cache.chat(edited, max_tokens=12, use_cache=False).token_ids


def test_an_answer_sent_back_changed_is_matched_on_tokens(make_tiny):
    cache = make_tiny(n_ctx=2048)
    _, messages = talk(cache, QUESTIONS[:1])
    messages[-1]["content"] = "Something else entirely."
    messages.append({"role": "user", "content": QUESTIONS[1]})
    result = cache.chat(messages, max_tokens=12)
    answer_start = cache.conversations.prompt(messages[:3], add_generation_prompt=False).answers[-1][0]
    assert result.cached_tokens == answer_start  # the turn before the changed answer, not the answer
    assert result.token_ids == cache.chat(messages, max_tokens=12, use_cache=False).token_ids


def test_an_answer_stopped_early_keeps_the_turn_computed_so_far(make_tiny):
    cache = make_tiny(n_ctx=2048)
    messages = [SYSTEM, {"role": "user", "content": QUESTIONS[0]}]
    stream = cache.stream_chat(messages, max_tokens=40)
    next(stream)
    stream.close()
    cache.wait_idle()
    again = cache.chat(messages + [{"role": "assistant", "content": "Paris."},
                                   {"role": "user", "content": QUESTIONS[1]}], max_tokens=4)
    assert again.cached_tokens >= cache.conversations.prompt(messages).end - 1 - 8  # at most its last call computed again


def test_a_history_longer_than_the_context_is_refused_naming_the_sizes(make_tiny):
    cache = make_tiny(n_ctx=256)
    with pytest.raises(ContextOverflowError, match=r"the conversation is [\d,]+ tokens and a prompt holds 256"):
        cache.chat([{"role": "user", "content": "word " * 400}])


def test_recompute_does_not_apply_to_a_conversation(make_tiny):
    with pytest.raises(PromptCacheError, match="recompute='tail:4' is for schema prompts and documents"):
        make_tiny().chat([{"role": "user", "content": "x"}], recompute="tail:4")


def test_a_follow_up_over_documents_reuses_the_whole_previous_turn(make_smollm2_cache):
    cache = make_smollm2_cache(n_ctx=2048)
    docs = [cache.add_document("The Calder Light was kept by Agnes Moir from 1931 to 1962.", name="light"),
            cache.add_document("The Kessel viaduct is 212 metres long.", name="viaduct")]
    messages = [{"role": "user", "content": "Who kept the light?"}]
    first = cache.chat(messages, documents=docs, max_tokens=12)
    assert first.tiers["#conversation"] == "encoded" and first.cached_tokens > 0  # the documents' cells
    cache.wait_idle()
    messages += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "How long is the viaduct?"}]
    second = cache.chat(messages, documents=docs, max_tokens=12)
    assert second.cached_tokens >= first.prompt_tokens and second.tiers == {"#conversation": "context"}
    layout = cache.conversations.prompt(messages)
    assert second.prompt_tokens > layout.end  # the documents sit in the prompt too


@pytest.mark.parametrize("encoding", ["preamble", "library"])
def test_documents_in_a_conversation_take_the_encoding_ask_takes_on_the_model(make_smollm2_cache, monkeypatch,
                                                                            tmp_path, encoding):
    measured = document_settings.settings_for("smollm2-135m")
    monkeypatch.setattr(document_settings, "settings_for", lambda model: dataclasses.replace(
        measured, fast=dataclasses.replace(measured.fast, encoding=encoding)))
    cache = make_smollm2_cache(n_ctx=2048, store=tmp_path / "store")  # a store of its own: nothing found
    docs = [cache.add_document("The Calder Light was kept by Agnes Moir from 1931 to 1962.", name="light"),
            cache.add_document("The Kessel viaduct is 212 metres long.", name="viaduct")]
    encoded = cache.documents.encoded
    cache.chat([{"role": "user", "content": "Who kept the light?"}], documents=docs, max_tokens=2)
    # The conversation's preamble, then light after it; viaduct after it too ("preamble"), or after
    # the preamble and light, its stand-in, computed as a context first ("library").
    assert cache.documents.encoded - encoded == {"preamble": 3, "library": 4}[encoding]


# Long enough turns that the ones after an edit hold runs worth moving (pc_cpu.pml.chat.MIN_MOVED_TOKENS).
LONG_QUESTIONS = [f"Here are my notes on {topic}: " + " ".join(f"{topic} fact {i} is worth a line." for i in range(6))
                  + f" What do they say about {topic}?" for topic in ("rivers", "mountains", "deserts")]


def edited_conversation(messages, index, text, question="Which of these is the largest?"):
    """Returns `messages` with message `index`'s content replaced by `text`, and a new user question after them."""
    edited = [dict(m) for m in messages]
    edited[index]["content"] = text
    return edited + [{"role": "user", "content": question}]


@pytest.mark.parametrize("index, text", [(1, "Tell me about lakes."), (3, "Skip the mountains, tell me about hills.")])
def test_after_edit_reuse_moves_the_turns_after_the_edit_and_the_next_turn_is_exact_again(make_tiny, index, text):
    cache = make_tiny(n_ctx=2048)
    _, messages = talk(cache, LONG_QUESTIONS)
    edited = edited_conversation(messages, index, text)
    result = cache.chat(edited, max_tokens=12, after_edit="reuse")
    # The repair computes the moved cells again, as the full prefill does: the next turn answers as it.
    # Waited for before any other prompt: one arriving while it runs stops it part way, for good
    # (Scheduler._stop_idle_run), and whether one did depended on the machine's speed.
    cache.wait_idle()
    # Kept: the calls before the edit; moved: the rest of the old stream the new prompt holds again,
    # its answers included; computed: the edited message, the new question and template markup around them.
    new_text = len(cache.model.tokenize(text, special=False)) + len(cache.model.tokenize(edited[-1]["content"],
                                                                                        special=False))
    assert result.uncached_tokens <= new_text + 16
    assert result.cached_tokens + result.uncached_tokens == cache.conversations.prompt(edited).end
    assert result.tiers == {"#conversation": "context"} and result.token_ids
    baseline = cache.chat(edited, max_tokens=12, use_cache=False)
    assert result.prompt_tokens == baseline.prompt_tokens
    follow_up = edited + [{"role": "assistant", "content": result.text}, {"role": "user", "content": "Why?"}]
    again = cache.chat(follow_up, max_tokens=12, after_edit="reuse")
    assert again.cached_tokens >= result.prompt_tokens
    assert again.token_ids == cache.chat(follow_up, max_tokens=12, use_cache=False).token_ids


def test_after_edit_reuse_finds_the_old_turns_in_ram_when_the_slot_is_gone(make_tiny):
    cache = make_tiny(n_ctx=2048, parallel=1, store=False)
    _, messages = talk(cache, LONG_QUESTIONS)
    talk(cache, ["Name a mountain."])  # takes the only slot
    edited = edited_conversation(messages, 1, "Tell me about lakes.")
    recomputed = cache.chat(edited, max_tokens=12)
    assert recomputed.cached_tokens == 0  # the default: everything after the edit (here, all) is computed
    cache.wait_idle()
    talk(cache, ["Name a mountain."])  # the slot is taken again; the edit's own tip is in RAM now too
    edited = edited_conversation(messages, 1, "Tell me about seas.")
    result = cache.chat(edited, max_tokens=12, after_edit="reuse")
    assert result.tiers == {"#conversation": "ram"}
    assert result.cached_tokens > cache.conversations.prompt(edited).end - 40 and result.token_ids


def test_after_edit_must_be_recompute_or_reuse(make_tiny):
    with pytest.raises(PromptCacheError, match="after_edit='always' is not a choice"):
        make_tiny().chat([{"role": "user", "content": "x"}], after_edit="always")


def test_a_recompute_turn_never_keeps_cells_that_a_reuse_turn_moved(make_tiny, monkeypatch):
    cache = make_tiny(n_ctx=2048)
    _, messages = talk(cache, LONG_QUESTIONS)
    edited = edited_conversation(messages, 1, "Tell me about lakes.")
    monkeypatch.setattr(chat_prompt, "REPAIR_DELAY_S", 600.0)  # its stream is not repaired, however slow the machine
    moved = cache.chat(edited, max_tokens=12, after_edit="reuse")
    result = cache.chat(edited, max_tokens=12)
    assert result.cached_tokens < moved.cached_tokens
    assert result.token_ids == cache.chat(edited, max_tokens=12, use_cache=False).token_ids


def test_a_conversation_is_stored_once_however_many_turns_it_has(make_tiny, tmp_path):
    cache = make_tiny(n_ctx=2048, store=tmp_path)
    _, messages = talk(cache, QUESTIONS)
    cache.close()
    stored = [entry for entry in DiskStore(tmp_path).ls() if entry.key.mode == "chat"]
    whole = make_tiny(n_ctx=2048, store=False).conversations.prompt(messages, add_generation_prompt=False)
    assert [entry.n_tokens for entry in stored] == [whole.answers[-1][1]]  # the last tip: every turn's cells


def test_the_tip_index_keeps_the_newest_tips_and_forgets_only_what_names_the_oldest():
    index = TipIndex()
    index.MAX_TIPS = 2
    tips = [Tip(StoreKey("m", f"t{i}", "chat"), 10, array("i", range(10))) for i in range(3)]
    index.add(tips[0], ("p0", "shared"), ("a0",))
    index.add(tips[1], ("p1",), ("a1",))
    index.add(tips[2], ("p2", "shared"), ())  # "shared" now names the newest tip; tips[0] goes
    assert index.holding_prefix("p1") is tips[1] and index.holding_prefix("p2") is tips[2]  # the newest two
    assert index.holding_prefix("p0") is None and index.holding_answer("a0") is None
    assert index.holding_prefix("shared") is tips[2] and index.holding_answer("a1") is tips[1]
