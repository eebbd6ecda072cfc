"""TTFT per turn of a conversation: pc_cpu's cached turns against a full prefill and llama-cpp-python's Llama.

Every user turn is a real passage trimmed to ~--turn-tokens tokens followed by a question about it
(NQ-open gold paragraphs read in place from $PC_CPU_EVALDATA, default ../shared/evaldata; the
paragraphs of examples/*.txt when the data is absent), after one system message. Answers are
greedy, at most --answer-tokens tokens, and are sent back as text the next turn, as a client does.

Systems, all on the same messages (pc_cpu's answers as the history), the same model and threads:
- "pc_cpu": PromptCache.stream_chat, Result.ttft_ms; it reuses the conversation's earlier cells;
- "full prefill": the same messages with use_cache=False, through the same PromptCache;
- "Llama": llama_cpp.Llama (one instance, loaded as pc_cpu loads models, flash attention on as
  pc_cpu's llama.cpp default has it), create_chat_completion(stream=True); TTFT is the time to
  the first chunk with content. It reuses the prefix its last call left in its context.

Scenarios (each on passages of its own, so no conversation finds another's cells):
- "single": one conversation of --turns turns;
- "interleaved": --conversations conversations, turns sent round-robin (each conversation's first
  turn, then each one's second, and so on); pc_cpu keeps each in a prompt slot of its own
  (parallel=4), Llama one prefix;
- "edit": the single (pause) conversation's last request, resent with its 2nd user message's
  question changed (message index 3: the system message is message 0): pc_cpu's default
  (after_edit="recompute"), Llama and the full prefill; then the original request again (its
  stream back in the slot, untimed) and the edited one with after_edit="reuse".

Modes:
- "pause": a user reads each answer; pc.wait_idle() runs after every pc_cpu turn (pc_cpu then
  repairs the answer's cells: "repair_ms"), and the other systems' turns for the same step run
  right after it (Llama's previous call is then its previous turn of this conversation: the full
  prefill goes through pc_cpu only and leaves Llama's context alone). The pause is not in any TTFT.
- "back-to-back": every pc_cpu turn is sent as soon as the previous answer is complete (no idle
  time, no repair); Llama and the full prefill then run on the same messages in a second pass
  in the same order, once pc_cpu is idle (nothing of pc_cpu competes with them for the cores).
  Llama has no background work: idle time changes nothing for it.

Token checks, per turn: whether the cached answer's tokens equal the full prefill's on the same
messages, and whether the generated answer's tokens equal the ones the next turn's prompt gives
its text (PromptCache.conversations.prompt(..., add_generation_prompt=False).answers[-1]).

    python bench/chat_turns.py [--model NAME ...] [--threads 2] [--turns 12] [--turn-tokens 150]
        [--answer-tokens 64] [--conversations 4] [--repeats 1] [--modes pause,back-to-back]
        [--scenarios single,interleaved]
        [--out bench/results/chat_turns.json] [--plot bench/conversation_ttft.png] [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pc_cpu import PromptCache
from pc_cpu.benchmarks.evaldata import NQ_FILE, evaldata_dir
from pc_cpu.pml.chat import ChatMessage, common_prefix

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MODELS = ("qwen2.5-coder-0.5b", "smollm2-135m")
MODES = ("pause", "back-to-back")
SYSTEMS = ("pc_cpu", "Llama", "full prefill")
SYSTEM_MESSAGE = "You are a helpful assistant. Read each passage and answer the question about it in a few sentences."
EDITED_QUESTION = "Which people, places or dates does this passage name?"
EDITED_INDEX = 3  # messages[3]: the 2nd user message (messages[0] is the system message)
NOTES = ("TTFT: pc_cpu Result.ttft_ms (call to first sampled token); Llama: call to first chunk with content",
         "pause mode: pc.wait_idle() after each pc_cpu turn (repair_ms), excluded from every TTFT",
         "edit: messages[3], the 2nd user message, question changed")
FALLBACK_QUESTIONS = ("What is this passage about?", "Which numbers does this passage give?",
                      "Who or what is named first here?", "What happened, according to this passage?",
                      "Which place does this passage describe?", "What is the most surprising fact here?")


# --- user turns --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    """One user message: a passage trimmed to its token budget and a question about it."""

    passage: str
    question: str

    @property
    def text(self) -> str:
        return f"{self.passage}\n\nQuestion: {self.question}"


def nq_sources() -> list[tuple[str, str]]:
    """Returns (paragraph, question) pairs of the NQ-open file in file order; [] when it is absent.

    The paragraph is the annotated gold long answer, or the ~100-word gold passage when that is longer.
    """
    path = evaldata_dir() / NQ_FILE
    if not path.is_file():
        return []
    pairs = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            texts = [record["ctxs"][0]["text"], record.get("nq_annotated_gold", {}).get("long_answer") or ""]
            question = record["question"].strip()
            pairs.append((max(texts, key=len).strip(), question[:1].upper() + question[1:] + "?"))
    return pairs


def example_sources() -> list[tuple[str, str]]:
    """Returns (paragraph, question) pairs from the repository's examples/*.txt (the fallback)."""
    sentences = []
    for path in sorted((REPO / "examples").glob("*.txt")):
        text = " ".join(path.read_text(encoding="utf-8").split())
        sentences += re.split(r"(?<=[.!?])\s+", text)
    # Windows of 12 sentences starting at every sentence: overlapping, but each one a different text.
    return [(" ".join(sentences[i:] + sentences[:i])[:4000], FALLBACK_QUESTIONS[i % len(FALLBACK_QUESTIONS)])
            for i in range(len(sentences))]


def trim_to_tokens(tokenize, text: str, budget: int) -> str:
    """Returns the longest word prefix of `text` with at most `budget` tokens."""
    words = text.split()
    lo, hi = 0, len(words)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(tokenize(" ".join(words[:mid]))) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return " ".join(words[:lo])


def user_turns(tokenize, count: int, turn_tokens: int) -> tuple[list[Turn], str]:
    """Returns `count` distinct user turns of ~turn_tokens tokens each, and where their text came from."""
    sources, name = nq_sources(), f"{NQ_FILE} (gold long answers, in file order)"
    if not sources:
        sources, name = example_sources(), "examples/*.txt (no evaluation data found)"
    turns = []
    for passage, question in sources:
        budget = turn_tokens - len(tokenize(f"\n\nQuestion: {question}"))
        if len(tokenize(passage)) < budget:
            continue  # too short to fill a turn
        turns.append(Turn(trim_to_tokens(tokenize, passage, budget), question))
        if len(turns) == count:
            return turns, name
    if not turns:
        raise SystemExit(f"no passage of {turn_tokens} tokens in {name}")
    # Not enough long passages: later turns repeat earlier ones (their conversations still differ).
    return [turns[i % len(turns)] for i in range(count)], name + f", {len(turns)} distinct passages reused"


# --- one request per system ----------------------------------------------------------------------


def pc_turn(pc: PromptCache, messages: list[dict], max_tokens: int, *, use_cache: bool,
            after_edit: str = "recompute") -> dict:
    """Returns one pc_cpu answer's timings, counts, tier and tokens (stream_chat, consumed to its end)."""
    t0 = time.perf_counter()
    stream = pc.stream_chat(messages, max_tokens=max_tokens, use_cache=use_cache, temperature=0.0,
                            after_edit=after_edit)
    first = None
    for _ in stream:
        if first is None:
            first = time.perf_counter()
    r = stream.result
    return {"ttft_ms": round(r.ttft_ms, 1),
            "first_piece_ms": round((first - t0) * 1000, 1) if first else None,
            "total_ms": round(r.total_ms, 1), "cached_tokens": r.cached_tokens, "computed_tokens": r.uncached_tokens,
            "tier": str(r.tiers.get("#conversation", "-")), "answer_tokens": len(r.token_ids),
            "finish_reason": r.finish_reason, "text": r.text, "token_ids": list(r.token_ids)}


class LlamaPeer:
    """llama-cpp-python's Llama, one instance for every turn, and the prompt tokens it makes of messages."""

    def __init__(self, path: str, n_ctx: int, threads: int, flash_attn: bool):
        import llama_cpp.llama_chat_format as chat_format  # the peer, used as its users do

        from pc_cpu.engine.llama.extra_buffers import (
            llama_peer,  # loaded as pc_cpu loads models, for a like comparison
        )

        self.llm = llama_peer(path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, n_batch=512,
                              flash_attn=flash_attn, verbose=False)
        llm = self.llm
        template = llm.metadata.get("tokenizer.chat_template")
        self.formatter = None
        if template and llm.chat_format == "chat_template.default":  # the formatter create_chat_completion uses
            text = lambda t: llm._model.token_get_text(t) if t != -1 else ""
            self.formatter = chat_format.Jinja2ChatFormatter(template, eos_token=text(llm.token_eos()),
                                                             bos_token=text(llm.token_bos()),
                                                             stop_token_ids=[llm.token_eos()])

    def prompt_tokens(self, messages: list[dict]) -> list[int] | None:
        """Returns the tokens create_chat_completion computes for `messages` (None: another chat format)."""
        if self.formatter is None:
            return None
        rendered = self.formatter(messages=messages)
        return self.llm.tokenize(rendered.prompt.encode("utf-8"), add_bos=not rendered.added_special, special=True)

    def turn(self, messages: list[dict], max_tokens: int) -> dict:
        """Returns one streamed answer's TTFT, text, and the prompt tokens it reused and computed."""
        before = self.llm._input_ids.tolist()
        prompt = self.prompt_tokens(messages)
        t0 = time.perf_counter()
        first, pieces, finish = None, [], None
        for chunk in self.llm.create_chat_completion(messages=messages, max_tokens=max_tokens, temperature=0.0,
                                                     stream=True):
            choice = chunk["choices"][0]
            if "content" in choice["delta"]:
                first = first or time.perf_counter()
                pieces.append(choice["delta"]["content"])
            finish = choice.get("finish_reason") or finish
        total = time.perf_counter() - t0
        reused = None
        if prompt is not None:  # what Llama.generate keeps: the common prefix, one token short of the whole prompt
            reused = min(common_prefix(before, prompt), len(prompt) - 1)
        return {"ttft_ms": round((first - t0) * 1000, 1) if first else round(total * 1000, 1),
                "total_ms": round(total * 1000, 1), "prompt_tokens": len(prompt) if prompt else None,
                "cached_tokens": reused, "computed_tokens": None if prompt is None else len(prompt) - reused,
                "finish_reason": finish, "text": "".join(pieces), "_prompt": prompt}

    def close(self) -> None:
        self.llm.close()


# --- token checks --------------------------------------------------------------------------------


def answer_retokenized(pc: PromptCache, messages: list[dict], answer: dict) -> dict:
    """Returns whether the generated answer's tokens are the ones its text gets in the next turn's prompt."""
    history = [ChatMessage(m["role"], m["content"]) for m in messages] + [ChatMessage("assistant", answer["text"])]
    prompt = pc.conversations.prompt(history, add_generation_prompt=False)
    span = prompt.answers[-1] if prompt.answers else (0, 0)
    text_tokens = list(prompt.tokens[span[0]:span[1]])
    generated = answer["token_ids"]
    same = text_tokens == generated
    out = {"same": same, "generated": len(generated), "retokenized": len(text_tokens)}
    if not same:
        at = common_prefix(generated, text_tokens)
        out.update(first_difference=at, at_end=at >= min(len(generated), len(text_tokens)) - 2,
                   generated_pieces=[pc.model.token_text(t) for t in generated[at:at + 3]],
                   retokenized_pieces=[pc.model.token_text(t) for t in text_tokens[at:at + 3]])
    return out


# --- scenarios -----------------------------------------------------------------------------------


@dataclass
class Conversation:
    """A conversation being built: its user turns, and its messages so far (answers appended as they come)."""

    turns: list[Turn]
    messages: list[dict]

    @classmethod
    def of(cls, turns: list[Turn]) -> Conversation:
        return cls(turns, [{"role": "system", "content": SYSTEM_MESSAGE}])


def timed_idle(pc: PromptCache) -> float:
    """Returns the ms pc.wait_idle() took (pc_cpu's background work: an answer's repair)."""
    t0 = time.perf_counter()
    pc.wait_idle()
    return round((time.perf_counter() - t0) * 1000, 1)


def new_tokens(pc: PromptCache, messages: list[dict]) -> tuple[int, int]:
    """Returns (prompt tokens, tokens after the previous answer): the least a turn that reuses its history computes."""
    prompt = pc.conversations.prompt(messages)
    return prompt.end, prompt.end - (prompt.answers[-1][1] if prompt.answers else 0)


def run_scenario(pc: PromptCache, peer: LlamaPeer, conversations: list[Conversation], mode: str,
                 answer_tokens: int, *, full_inline: bool) -> list[dict]:
    """Returns one record per step of the conversations' turns sent round-robin, in `mode`.

    In pause mode Llama runs right after each pc_cpu turn (and the full prefill too when
    `full_inline`); whatever did not run inline runs in a second pass, in the same order.
    """
    steps = [(c, t) for t in range(len(conversations[0].turns)) for c in range(len(conversations))]
    records = []
    for c, t in steps:
        conv = conversations[c]
        conv.messages.append({"role": "user", "content": conv.turns[t].text})
        messages = [dict(m) for m in conv.messages]
        prompt_tokens, new = new_tokens(pc, messages)
        record = {"conversation": c, "turn": t + 1, "prompt_tokens": prompt_tokens, "new_tokens": new,
                  "messages": messages}
        if mode == "pause":
            record["idle_before_ms"] = timed_idle(pc)
        record["pc_cpu"] = pc_turn(pc, messages, answer_tokens, use_cache=True)
        if mode == "pause":
            record["repair_ms"] = timed_idle(pc)
            record["Llama"] = peer.turn(messages, answer_tokens)
            if full_inline:
                record["full prefill"] = pc_turn(pc, messages, answer_tokens, use_cache=False)
        conv.messages.append({"role": "assistant", "content": record["pc_cpu"]["text"]})
        records.append(record)
        print_progress(record)
    pc.wait_idle()
    for record in records:  # the second pass: what did not run inline
        if "Llama" not in record:
            record["Llama"] = peer.turn(record["messages"], answer_tokens)
        if "full prefill" not in record:
            record["full prefill"] = pc_turn(pc, record["messages"], answer_tokens, use_cache=False)
    for record in records:
        finish_checks(pc, record)
    return records


def finish_checks(pc: PromptCache, record: dict) -> None:
    """Adds the token checks to a step's record and trims what the JSON does not need."""
    cached, full, llama = record["pc_cpu"], record["full prefill"], record["Llama"]
    record["checks"] = {
        "cached_answer_equals_full_prefill": cached["token_ids"] == full["token_ids"],
        "answer_retokenized": answer_retokenized(pc, record["messages"], cached),
        "llama_answer_text_equals_pc_cpu": llama["text"] == cached["text"],
        "llama_prompt_equals_pc_cpu": (None if llama["_prompt"] is None
                                       else llama["_prompt"] == list(pc.conversations.prompt(record["messages"]).tokens)),
    }
    for system in (full, llama):
        system.pop("token_ids", None)
        system.pop("_prompt", None)
    record["messages"] = len(record["messages"])  # the texts are in the conversation's turns


def run_edit(pc: PromptCache, peer: LlamaPeer, conversation: Conversation, answer_tokens: int) -> dict:
    """Returns the edited request's counts and TTFTs: the last turn resent with message 3's question changed.

    Run right after the conversation's last turn, so that Llama's context still holds it.
    """
    original = conversation.messages[:-1]  # the last request (the last answer left out)
    edited = [dict(m) for m in original]
    turn = conversation.turns[1]
    assert edited[EDITED_INDEX]["content"] == turn.text
    edited[EDITED_INDEX]["content"] = Turn(turn.passage, EDITED_QUESTION).text
    before, after = pc.conversations.prompt(original).tokens, pc.conversations.prompt(edited).tokens
    first_edited = common_prefix(list(before), list(after))
    message_tokens = len(pc.model.tokenize(edited[EDITED_INDEX]["content"], special=False))
    pc.wait_idle()
    cached = pc_turn(pc, edited, answer_tokens, use_cache=True)
    pc.wait_idle()
    llama = peer.turn(edited, answer_tokens)
    full = pc_turn(pc, edited, answer_tokens, use_cache=False)
    # after_edit="reuse" on the original conversation's stream again (the edit above replaced it there).
    pc_turn(pc, original, answer_tokens, use_cache=True)
    pc.wait_idle()
    reuse = pc_turn(pc, edited, answer_tokens, use_cache=True, after_edit="reuse")
    pc.wait_idle()
    llama.pop("_prompt")
    full_tokens = full.pop("token_ids")
    same = cached.pop("token_ids") == full_tokens
    reuse_same = reuse.pop("token_ids") == full_tokens
    return {"edited_message_index": EDITED_INDEX, "edited_message": "the 2nd user message (message 0 is the system)",
            "edited_question": EDITED_QUESTION, "prompt_tokens": len(after), "first_edited_token": first_edited,
            "edited_message_tokens": message_tokens, "tokens_from_edit_to_end": len(after) - first_edited,
            "pc_cpu": cached, "Llama": llama, "full prefill": full, "pc_cpu after_edit=reuse": reuse,
            "cached_answer_equals_full_prefill": same, "reuse_answer_equals_full_prefill": reuse_same,
            "speedup_vs_full_prefill": round(full["ttft_ms"] / cached["ttft_ms"], 2),
            "reuse_speedup_vs_full_prefill": round(full["ttft_ms"] / reuse["ttft_ms"], 2)}


def print_progress(record: dict) -> None:
    """Prints one line per pc_cpu turn to stderr as it ends."""
    pc = record["pc_cpu"]
    print(f"  conv {record['conversation']} turn {record['turn']:>2}: {record['prompt_tokens']:>5} tokens, "
          f"pc_cpu {pc['ttft_ms']:>7.1f} ms ({pc['computed_tokens']} computed, {pc['tier']}), "
          f"answer {pc['answer_tokens']} tokens", file=sys.stderr, flush=True)


# --- one model -----------------------------------------------------------------------------------


def warm_up(pc: PromptCache, peer: LlamaPeer, turns: list[Turn], answer_tokens: int) -> None:
    """Runs a throwaway two-turn conversation through every system (first-call allocations, page faults)."""
    conv = Conversation.of(turns)
    for turn in turns:
        conv.messages.append({"role": "user", "content": turn.text})
        answer = pc_turn(pc, conv.messages, answer_tokens, use_cache=True)
        pc.wait_idle()
        peer.turn(conv.messages, answer_tokens)
        pc_turn(pc, conv.messages, answer_tokens, use_cache=False)
        conv.messages.append({"role": "assistant", "content": answer["text"]})


def run_model(model: str, args) -> dict:
    """Returns every scenario's records for one model, with the conversations' user turns."""
    store = Path(tempfile.mkdtemp(prefix="pc_cpu_chat_turns_"))  # an empty disk tier: nothing from earlier runs
    pc = PromptCache(model, threads=args.threads, parallel=4, store=store)  # pc_cpu's flash attention; the peer's too
    peer = LlamaPeer(str(pc.model.path), pc.n_ctx, args.threads, pc.flash_attn)  # a prompt's positions
    try:
        tokenize = lambda t: pc.model.tokenize(t, special=False)
        per_repeat = 2 + len(args.modes) * (1 + args.conversations) * args.turns
        turns, source = user_turns(tokenize, per_repeat * args.repeats, args.turn_tokens)
        taken = iter(turns)
        take = lambda n: [next(taken) for _ in range(n)]
        report = {"name": model, "model": pc.model.path.name, "n_ctx": pc.n_ctx, "data": source,
                  "user_turn_tokens": statistics.mean(len(tokenize(t.text)) for t in turns),
                  "llama_chat_format": peer.llm.chat_format, "repeats": []}
        print(f"{report['model']}: warm-up", file=sys.stderr, flush=True)
        warm_up(pc, peer, take(2), args.answer_tokens)
        for repeat in range(args.repeats):
            runs = {"scenarios": {}, "conversations": {}}
            for scenario, count in (("single", 1), ("interleaved", args.conversations)):
                if scenario not in args.scenarios:
                    continue
                for mode in args.modes:
                    name = f"{scenario}/{mode}"
                    print(f"{report['model']}: repeat {repeat + 1}, {name}", file=sys.stderr, flush=True)
                    convs = [Conversation.of(take(args.turns)) for _ in range(count)]
                    runs["scenarios"][name] = run_scenario(pc, peer, convs, mode, args.answer_tokens,
                                                           full_inline=scenario == "single")
                    runs["conversations"][name] = [conv.messages for conv in convs]
                    if name == "single/pause" and args.turns >= 2:  # right after it: Llama still holds it
                        runs["edit"] = run_edit(pc, peer, convs[0], args.answer_tokens)
            report["repeats"].append(runs)
        report["summary"] = summarize(report, args.turns)
        return report
    finally:
        peer.close()
        pc.close()
        shutil.rmtree(store, ignore_errors=True)


# --- summary -------------------------------------------------------------------------------------


def per_turn_medians(records: list[dict], system: str, turns: int) -> list[float]:
    """Returns the median TTFT (ms) of `system` at each turn number 1..turns, over conversations and repeats."""
    return [statistics.median(r[system]["ttft_ms"] for r in records if r["turn"] == t) for t in range(1, turns + 1)]


def scenario_records(report: dict, name: str) -> list[dict]:
    """Returns the step records of scenario/mode `name` over every repeat."""
    return [r for runs in report["repeats"] for r in runs["scenarios"].get(name, [])]


def summarize(report: dict, turns: int) -> dict:
    """Returns per scenario/mode and system: median TTFT over turns 2..N, slope, ratio to Llama; and the checks."""
    summary = {}
    for name in report["repeats"][0]["scenarios"]:
        records = scenario_records(report, name)
        row = {}
        for system in SYSTEMS:
            medians = per_turn_medians(records, system, turns)
            later = [r[system]["ttft_ms"] for r in records if r["turn"] >= 2] or [r[system]["ttft_ms"] for r in records]
            slope = float(np.polyfit(range(2, turns + 1), medians[1:], 1)[0]) if turns >= 3 else None
            computed = [r[system]["computed_tokens"] for r in records if r["turn"] >= 2]
            row[system] = {"median_ttft_ms_turns_2_to_n": round(statistics.median(later), 1),
                           "slope_ms_per_turn": None if slope is None else round(slope, 2),
                           "per_turn_median_ms": [round(m, 1) for m in medians],
                           "mean_computed_tokens_turns_2_to_n": (round(statistics.mean(computed), 1)
                                                                 if computed and None not in computed else None)}
        row["pc_cpu/Llama"] = round(row["pc_cpu"]["median_ttft_ms_turns_2_to_n"]
                                    / row["Llama"]["median_ttft_ms_turns_2_to_n"], 3)
        row["pc_cpu/full prefill"] = round(row["pc_cpu"]["median_ttft_ms_turns_2_to_n"]
                                           / row["full prefill"]["median_ttft_ms_turns_2_to_n"], 3)
        row["mean_new_tokens_turns_2_to_n"] = round(statistics.mean(r["new_tokens"] for r in records if r["turn"] >= 2)
                                                    if turns >= 2 else 0, 1)
        row["checks"] = check_counts(records)
        if "repair_ms" in records[0]:
            row["median_repair_ms"] = round(statistics.median(r["repair_ms"] for r in records), 1)
        summary[name] = row
    if "edit" in report["repeats"][0]:
        edit_systems = SYSTEMS + ("pc_cpu after_edit=reuse",)
        summary["edit"] = [{k: runs["edit"].get(k) for k in ("prompt_tokens", "edited_message_tokens",
                                                              "tokens_from_edit_to_end", "speedup_vs_full_prefill",
                                                              "reuse_speedup_vs_full_prefill",
                                                              "reuse_answer_equals_full_prefill")}
                           | {f"{s} {k}": runs["edit"][s][k] for s in edit_systems if s in runs["edit"]
                              for k in ("ttft_ms", "cached_tokens", "computed_tokens")}
                           for runs in report["repeats"]]
    return summary


def check_counts(records: list[dict]) -> dict:
    """Returns how many answers passed each token check, of how many, and the mean answer length."""
    retok = [r["checks"]["answer_retokenized"] for r in records]
    differ = [c for c in retok if not c["same"]]
    return {"answers": len(records),
            "mean_answer_tokens": round(statistics.mean(r["pc_cpu"]["answer_tokens"] for r in records), 1),
            "answers_at_max_tokens": sum(r["pc_cpu"]["finish_reason"] == "length" for r in records),
            "cached_equals_full_prefill": sum(r["checks"]["cached_answer_equals_full_prefill"] for r in records),
            "generated_equals_retokenized": len(retok) - len(differ),
            "retokenized_differs_only_at_end": sum(c["at_end"] for c in differ),
            "llama_same_answer_text": sum(r["checks"]["llama_answer_text_equals_pc_cpu"] for r in records),
            "llama_same_prompt_tokens": sum(bool(r["checks"]["llama_prompt_equals_pc_cpu"]) for r in records)}


def _or_unknown(value) -> str:
    """Returns the value as text, '?' for None."""
    return "?" if value is None else str(value)


def print_report(report: dict) -> None:
    """Prints the per-turn table of every scenario (first repeat) and the summary."""
    print(f"\n## {report['model']} (n_ctx {report['n_ctx']}, user turns ~{report['user_turn_tokens']:.0f} tokens)")
    for name, records in report["repeats"][0]["scenarios"].items():
        print(f"\n{name}: TTFT ms (computed tokens)")
        print(f"{'conv':>4} {'turn':>4} {'prompt':>6} {'new':>4} | {'pc_cpu':>16} {'tier':>8} | {'Llama':>16} | "
              f"{'full prefill':>16} | {'ans':>3} {'=full':>5} {'=retok':>6}")
        for r in records:
            cells = [f"{r[s]['ttft_ms']:>8.1f} ({_or_unknown(r[s]['computed_tokens']):>5})" for s in SYSTEMS]
            checks = r["checks"]
            print(f"{r['conversation']:>4} {r['turn']:>4} {r['prompt_tokens']:>6} {r['new_tokens']:>4} | "
                  f"{cells[0]:>16} "
                  f"{r['pc_cpu']['tier']:>8} | {cells[1]:>16} | {cells[2]:>16} | {r['pc_cpu']['answer_tokens']:>3} "
                  f"{'yes' if checks['cached_answer_equals_full_prefill'] else 'NO':>5} "
                  f"{'yes' if checks['answer_retokenized']['same'] else 'NO':>6}")
    print(f"\nsummary, {report['model']}: median TTFT over turns 2..N (ms), slope (ms/turn), computed tokens")
    for name, row in report["summary"].items():
        if name == "edit":
            continue
        cells = "  ".join(f"{s}: {row[s]['median_ttft_ms_turns_2_to_n']:.1f} ({row[s]['slope_ms_per_turn']}/turn, "
                          f"{row[s]['mean_computed_tokens_turns_2_to_n']} tok)" for s in SYSTEMS)
        print(f"  {name:<26} {cells}  pc_cpu/Llama {row['pc_cpu/Llama']:.3f}")
        print(f"  {'':<26} checks: {row['checks']}" + (f"  repair {row['median_repair_ms']} ms"
                                                        if "median_repair_ms" in row else ""))
    for edit in report["summary"].get("edit", []):
        print(f"  edit: {edit}")


# --- plot ----------------------------------------------------------------------------------------


def plot(reports: list[dict], path: Path) -> Path | None:
    """Writes TTFT vs turn, one row per model, panels single and interleaved; returns the path (None: no matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
        return None
    fig, axes = plt.subplots(len(reports), 2, figsize=(11, 4 * len(reports)), squeeze=False, sharey="row")
    colors = {"pc_cpu": "C0", "Llama": "C1", "full prefill": "C2"}
    styles = {"pause": "-", "back-to-back": "--"}
    for row, report in zip(axes, reports):
        for ax, scenario in zip(row, ("single", "interleaved")):
            for mode in MODES:
                records = scenario_records(report, f"{scenario}/{mode}")
                if not records:
                    continue
                turns = max(r["turn"] for r in records)
                for system in SYSTEMS:
                    ax.plot(range(1, turns + 1), per_turn_medians(records, system, turns), styles[mode],
                            marker="o", ms=3, color=colors[system], label=f"{system} ({mode})")
            n = len({r["conversation"] for r in scenario_records(report, f"{scenario}/pause")}) or 1
            ax.set(yscale="log", xlabel="turn", ylabel="TTFT (ms)")
            ax.set_title(f"{report['name']}: {scenario}" + (f", {n} conversations (median per turn)" if n > 1 else
                                                             ""), fontsize=10)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.grid(alpha=0.3, which="both")
        row[0].legend(fontsize=7, handlelength=3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# --- main ----------------------------------------------------------------------------------------


def machine() -> dict:
    """Returns the CPU model, core count and platform of this machine."""
    cpu = platform.processor()
    try:
        match = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.MULTILINE)
        cpu = match.group(1) if match else cpu
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()}


def git_commit() -> str | None:
    """Returns `git rev-parse --short HEAD` of the repository (with -dirty when files changed), or None."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                               text=True, check=False).stdout.strip()
        return head + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def parse_args(argv=None) -> argparse.Namespace:
    """Returns the command line's options, --quick applied."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", help=f"a model name or GGUF path, repeatable "
                                                          f"(default: {' and '.join(DEFAULT_MODELS)})")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--turn-tokens", type=int, default=150, help="tokens of each user message")
    parser.add_argument("--answer-tokens", type=int, default=64, help="max_tokens of each answer")
    parser.add_argument("--conversations", type=int, default=4, help="conversations of the interleaved scenario")
    parser.add_argument("--repeats", type=int, default=1, help="each scenario again on new passages")
    parser.add_argument("--keep-text", action="store_true",
                        help="also write the conversations and answers (third-party passages and model outputs: "
                             "never into the repository)")
    parser.add_argument("--modes", default=",".join(MODES), help="pause, back-to-back, or both (comma-separated)")
    parser.add_argument("--scenarios", default="single,interleaved",
                        help="single, interleaved, or both (comma-separated); the edit runs after single/pause")
    parser.add_argument("--out", type=Path, default=REPO / "bench/results/chat_turns.json")
    parser.add_argument("--plot", type=Path, default=REPO / "bench/conversation_ttft.png")
    parser.add_argument("--quick", action="store_true",
                        help="a tiny run: smollm2-135m, 3 turns of 80 tokens, 16-token answers, 2 conversations")
    args = parser.parse_args(argv)
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if set(args.modes) - set(MODES):
        parser.error(f"--modes: choose from {', '.join(MODES)}")
    args.scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    if not args.scenarios or set(args.scenarios) - {"single", "interleaved"}:
        parser.error("--scenarios: choose from single, interleaved")
    if args.quick:
        args.model = args.model or ["smollm2-135m"]
        args.turns, args.turn_tokens, args.answer_tokens, args.conversations = 3, 80, 16, 2
    args.model = args.model or list(DEFAULT_MODELS)
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    started = time.perf_counter()
    out = {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "git_commit": git_commit(),
           "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]) if argv is None else " ".join(argv),
           "machine": machine(),
           "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
           "notes": NOTES,
           "models": []}
    for model in args.model:
        t0 = time.perf_counter()
        report = run_model(model, args)
        report["run_s"] = round(time.perf_counter() - t0, 1)
        out["models"].append(report)
        print_report(report)
        out["run_s"] = round(time.perf_counter() - started, 1)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        kept = out if args.keep_text else without_text(out)
        args.out.write_text(json.dumps(kept, indent=1, default=str))  # after every model: a later crash keeps it
    written = plot(out["models"], args.plot) if args.plot else None
    print(f"\nwrote {args.out}" + (f" and {written}" if written else "") + f" in {out['run_s']:.0f} s")


def without_text(report):
    """Returns a copy of `report` without the conversations and answer texts: timings, counts and checks only.

    The conversations hold the evaluation data's passages, which stay where they are (read in place).
    """
    if isinstance(report, dict):
        return {key: without_text(value) for key, value in report.items()
                if key not in ("conversations", "text", "_prompt")}
    if isinstance(report, list):
        return [without_text(value) for value in report]
    return report


if __name__ == "__main__":
    main()
