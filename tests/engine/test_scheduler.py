"""Many prompts at once: batched in one context, sharing module cells, each with the answer it gets alone."""

from __future__ import annotations

import threading
import time
from typing import Callable

import pytest

from pc_cpu.errors import ContextOverflowError

WAIT_S = 120  # a deadline for what takes seconds at most: generous for a loaded machine, and a failure, not a hang

DOC = "The archive keeps letters, maps and ledgers from the old harbour office. " * 6
SCHEMA = f'<schema name="s"><module name="doc">{DOC}</module><module name="extra">More notes.</module></schema>'
QUESTIONS = [f" Question {i}: what does the archive keep?" for i in range(8)]


def prompt(question: str) -> str:
    return f'<prompt schema="s"><doc/>{question}</prompt>'


def run_in_threads(fn, items):
    results, errors = [None] * len(items), []

    def work(i, item):
        try:
            results[i] = fn(item)
        except Exception as exc:  # surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i, item), daemon=True) for i, item in enumerate(items)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=WAIT_S)
        assert not t.is_alive(), f"a prompt was not answered within {WAIT_S} s"
    assert not errors, errors
    return results


def test_concurrent_prompts_get_their_single_request_answers(make_cache):
    # Batch-invariant decoding (the default): with one batch for all, Qwen2.5-0.5B answered 1 of
    # these 8 otherwise than alone, since llama.cpp's kernels round by the batch's row count.
    cache = make_cache(parallel=8)
    cache.load_schema(SCHEMA)
    alone = [cache.generate(prompt(q), max_tokens=24).token_ids for q in QUESTIONS]
    together = run_in_threads(lambda q: cache.generate(prompt(q), max_tokens=24).token_ids, QUESTIONS)
    assert together == alone
    assert cache.workbench.scheduler.stats.max_batch > 1  # they did run together


def test_concurrent_streams_give_the_streamed_text_and_share_module_cells(make_cache):
    cache = make_cache(parallel=8)
    cache.load_schema(SCHEMA)
    resident = cache.schemas.resident_cells
    texts = run_in_threads(lambda q: "".join(cache.stream(prompt(q), max_tokens=12)), QUESTIONS)
    assert texts == [cache.generate(prompt(q), max_tokens=12).text for q in QUESTIONS]
    assert cache.schemas.resident_cells == resident  # one copy of the module however many prompts read it


@pytest.mark.tiny_only  # counts every token up to max_tokens: a real model ends some answers early
def test_prompts_really_run_together(make_cache):
    cache = make_cache(parallel=4)
    cache.load_schema(SCHEMA)
    # Each request reserves cells for its prompt and max_tokens: 4 x ~170 fit in 1,024.
    streams = [cache.stream(prompt(q), max_tokens=150) for q in QUESTIONS[:4]]
    results = [("".join(s), s.result)[1] for s in streams]
    stats = cache.workbench.scheduler.stats
    assert stats.max_batch == 4
    assert stats.tokens == sum(len(r.token_ids) - 1 for r in results)  # each first token comes from its prefill


def test_closing_a_stream_frees_its_slot_for_the_next_prompt(make_cache):
    cache = make_cache(parallel=1)
    cache.load_schema(SCHEMA)
    stream = cache.stream(prompt(QUESTIONS[0]), max_tokens=500)
    next(iter(stream))
    with cache.workbench.lock:  # between two of its steps, so that the count below is the last it decoded
        stream.close()
        decoded = cache.workbench.scheduler.stats.tokens
    result = cache.generate(prompt(QUESTIONS[1]), max_tokens=4)
    assert len(result.token_ids) == 4
    # Only the next prompt's tokens were decoded since (its first one comes from its prefill).
    assert cache.workbench.scheduler.stats.tokens == decoded + len(result.token_ids) - 1
    assert cache.wait_idle(timeout=WAIT_S) and cache.workbench.scheduler.active == 0


def test_loading_a_schema_while_prompts_run(make_cache):
    cache = make_cache(parallel=2)
    cache.load_schema(SCHEMA)
    stream = cache.stream(prompt(QUESTIONS[0]), max_tokens=64)
    cache.load_schema('<schema name="other"><module name="m">Another schema entirely.</module></schema>')
    assert "".join(stream) == cache.generate(prompt(QUESTIONS[0]), max_tokens=64).text
    assert cache.generate('<prompt schema="other"><m/> and?</prompt>', max_tokens=3).token_ids


def test_a_prompt_that_cannot_fit_fails_alone(make_cache):
    cache = make_cache(parallel=2, n_ctx=256)
    cache.load_schema(SCHEMA)
    ok = cache.stream(prompt(QUESTIONS[0]), max_tokens=8)
    with pytest.raises(ContextOverflowError):
        cache.generate(prompt(" word" * 400), max_tokens=4)
    assert len(list(ok)) > 0 and ok.result.finish_reason in ("stop", "length")


@pytest.mark.tiny_only  # each request must run to max_tokens: a real model ends some answers early
def test_requests_wait_for_a_free_slot_and_then_run(make_cache):
    # Each prompt slot has a stream of its own (n_ctx cells), so four 420-token answers that would
    # not fit in one 1,024-cell pool run side by side in two slots, and the other two wait their turn.
    cache = make_cache(parallel=2)
    cache.load_schema(SCHEMA)
    streams = [cache.stream(prompt(q), max_tokens=400) for q in QUESTIONS[:4]]
    results = [("".join(s), s.result)[1] for s in streams]
    assert all(r.finish_reason == "length" and len(r.token_ids) == 400 for r in results)
    assert cache.workbench.scheduler.stats.max_batch == 2


class PromptDuringWork:
    """A prompt sent from another thread while long work holds cache.workbench.lock; `events` shows when it was answered.

    Call `step(event)` from the work's progress callback, which runs holding the lock between two
    of its steps. The first call sends the prompt and returns once its thread waits for the lock.
    Each later one notes "answered" before the event if the prompt has ended since, and otherwise
    returns once some thread waits for the lock (the prompt's, or the scheduler's running it): when
    the work then gives way, someone is there to take it, however slow the machine. A sleep
    instead only made that likely, and lost the race on a loaded machine.
    """

    def __init__(self, cache, send: Callable[[], object]):
        self._cache, self._send = cache, send  # send() returns the prompt's Stream once the scheduler has it
        self.events: list = []
        self._sent = threading.Event()  # set holding the lock: the scheduler cannot have run the prompt before it
        self._thread: threading.Thread | None = None
        self._raised: list[BaseException] = []

    def step(self, event) -> None:
        lock = self._cache.workbench.lock
        if self._thread is None:
            before = lock.waiting
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
            assert lock.wait_for_waiters(before + 1, WAIT_S), f"the prompt did not ask for the lock within {WAIT_S} s"
        elif "answered" not in self.events:
            # Neither can change until this thread gives way: the prompt is sent, and run, under the lock.
            queue = self._cache.workbench.scheduler.queue_stats()
            if self._sent.is_set() and not (queue.active or queue.waiting):
                self.events.append("answered")
            else:
                assert lock.wait_for_waiters(1, WAIT_S), f"nobody asked for the lock within {WAIT_S} s"
        self.events.append(event)

    def _run(self) -> None:
        try:
            with self._cache.workbench.lock:  # taken again inside send(), which a FairLock allows
                try:
                    stream = self._send()
                finally:
                    self._sent.set()
            "".join(stream)
        except BaseException as exc:  # handed to the test's thread by finish()
            self._raised.append(exc)

    def finish(self) -> list:
        """Returns `events` once the prompt's thread has ended; fails the test if it raised or did not end."""
        assert self._thread is not None, "the work reported no step"
        self._thread.join(timeout=WAIT_S)
        assert not self._thread.is_alive(), f"the prompt was not answered within {WAIT_S} s"
        assert not self._raised, self._raised
        return self.events


def events_while_loading(cache, schema_pml: str, counts) -> list:
    """Returns what happened while `schema_pml` loaded: progress steps and, once, "answered" (PromptDuringWork).

    After the first progress event that `counts` picks, a prompt arrives from another thread.
    """
    during = PromptDuringWork(cache, lambda: cache.stream(prompt(QUESTIONS[0]), max_tokens=3))

    def on_progress(event):
        if not event.finished and counts(event):
            during.step((event.modules_done, event.tokens_done))

    cache.load_schema(schema_pml, progress=on_progress)
    return during.finish()


@pytest.mark.tiny_only  # about scheduling, not the model
def test_a_prompt_runs_between_the_modules_of_a_schema_being_loaded(make_cache):
    cache = make_cache(parallel=2)
    cache.load_schema(SCHEMA)
    many = "".join(f'<module name="m{i}">{DOC}</module>' for i in range(6))
    events = events_while_loading(cache, f'<schema name="big">{many}</schema>', lambda e: e.modules_done > 0)
    # Noted at the first step after the answer: holding the lock for the whole load, there was none.
    assert "answered" in events, events


@pytest.mark.tiny_only  # about scheduling, not the model
def test_give_way_lets_running_prompts_finish_not_just_take_one_step(make_cache):
    # Long work (adding a document) holds the lock and gives way between its batches; taking
    # turns step for step gave a running prompt one token per batch (15.8 s for a 0.45 s answer).
    cache = make_cache(parallel=2)
    cache.load_schema(SCHEMA)
    results = []
    thread = threading.Thread(target=lambda: results.append(cache.generate(prompt(QUESTIONS[0]), max_tokens=300)),
                              daemon=True)
    with cache.workbench.lock:
        # The prompt is let in one turn at a time, so that it has started, and is far from done, when we give way.
        thread.start()
        assert cache.workbench.lock.wait_for_waiters(1, WAIT_S)  # its caller, to plan it
        cache.workbench.lock.yield_turn()
        assert cache.workbench.lock.wait_for_waiters(1, WAIT_S)  # the scheduler, to start it
        cache.workbench.lock.yield_turn()
        assert cache.workbench.scheduler.active and not results
        started = time.monotonic()
        cache.workbench.scheduler.give_way(WAIT_S)
        waited = time.monotonic() - started
        assert not cache.workbench.scheduler.active  # it ran to its end while we gave way...
        thread.join(timeout=WAIT_S)  # ...so its caller needs no more turns (a live request would hang here)
        assert results and len(results[0].token_ids) == 300
    assert waited < WAIT_S  # given way until the prompt ended, not until the deadline


@pytest.mark.tiny_only  # about scheduling, not the model
def test_a_prompt_runs_between_the_batches_of_one_long_module_being_loaded(make_cache):
    cache = make_cache(parallel=2, n_ctx=4096)
    cache.load_schema(SCHEMA)
    long = " ".join(f"Ledger line {i}: {i % 13} crates of tea and {i % 7} of silk." for i in range(180))
    events = events_while_loading(cache, f'<schema name="big"><module name="ledger">{long}</module></schema>',
                                  lambda e: True)
    batches = [e for e in events if e != "answered"]
    assert len(batches) >= 3, events
    assert "answered" in events, events  # noted at a batch after the answer: before the module's last one


@pytest.mark.tiny_only  # about cancelling, not the model
def test_a_cancelled_schema_load_stops_after_a_batch_and_leaves_the_schema_unloaded(make_cache):
    from pc_cpu.errors import CancelledError

    cache = make_cache(parallel=2, n_ctx=4096)
    long = " ".join(f"Ledger line {i}: {i % 13} crates of tea and {i % 7} of silk." for i in range(180))
    pml = f'<schema name="big"><module name="ledger">{long}</module><module name="m">{DOC}</module></schema>'
    cancel, seen = threading.Event(), []

    def on_progress(event):
        seen.append(event.tokens_done)
        cancel.set()

    with pytest.raises(CancelledError, match="loading schema 'big' was cancelled"):
        cache.load_schema(pml, progress=on_progress, cancel=cancel)
    assert len(seen) == 1 and "big" not in cache.schemas.names
    cache.load_schema(pml)  # the workspace was left clean
    assert cache.generate('<prompt schema="big"><ledger/> How many crates?</prompt>', max_tokens=2).token_ids


class _Finished:
    """A finished prompt as _queue_idle sees it: its idle task, or None."""

    def __init__(self, task):
        self.task = task

    def idle_task(self, answer):
        return self.task


def test_an_idle_tasks_delay_counts_from_the_last_answer_not_its_own(make_cache, monkeypatch):
    # Questions sent back to back each go first: a task that became ready while a later prompt
    # generated would otherwise start the moment that prompt ends, and the next question would wait
    # for its chunk (bench/back_to_back.py: ~2 s on SmolLM2).
    from pc_cpu.engine.runtime import scheduler as scheduler_module
    from pc_cpu.engine.runtime.prompt_work import IdleTask

    cache = make_cache()
    scheduler, now = cache.workbench.scheduler, [100.0]
    monkeypatch.setattr(scheduler_module.time, "monotonic", lambda: now[0])
    task = IdleTask("prefix-1", (1, 2, 3), lambda slot: None, skip=lambda: True, delay=0.25)
    scheduler._queue_idle(_Finished(task), None)
    assert scheduler._ready_at["prefix-1"] == 100.25
    now[0] = 101.0  # a later prompt ends: one with no idle task of its own
    scheduler._queue_idle(_Finished(None), None)
    assert scheduler._ready_at["prefix-1"] == 101.25
    now[0] = 102.0
    scheduler._queue_idle(_Finished(IdleTask("prefix-2", (4,), lambda slot: None, skip=lambda: True)), None)
    assert scheduler._ready_at == {"prefix-1": 102.25, "prefix-2": 102.0}
