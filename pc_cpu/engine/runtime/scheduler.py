"""Runs every prompt of one context: continuous batching over prompt slots.

Callers submit Jobs from any thread and read a Request's events. One worker
thread owns the llama.cpp calls. Between decode steps it admits waiting requests
into free prompt slots (their modules made resident and shared in, their own
tokens computed, their first token sampled: that is their time to first token),
then decodes the next token of every active request. A request leaves when it
ends, fails or is cancelled, and its slot and cells are reused by the next one.

Batch invariance: by default each request's token is decoded in a llama_decode of
its own. llama.cpp's CPU matmuls pick their kernel and accumulation order by the
batch's row count (repacked Q4_K runs 4-row GEMM tiles and a GEMV for the rest),
so a token decoded beside others gets other logits than alone, and a near-tie
flips: measured on Qwen2.5-0.5B, 1 of 8 concurrent greedy answers differed from
the same prompt alone. One token per call is exactly what a prompt alone gets.
`batch_invariant=False` decodes every request in one batch: more tokens per
second, answers that can depend on the company (bench/RESULTS.md).

A prompt is assembled in the library context, where its modules' cells are
shared (seq_cp), then moved into its own stream of the prompt context in
position order, where its own text is computed and its tokens generated
(pc_cpu.engine.cells.streams: the same tokens then give the same answer whatever the
tier or the library held). A prompt holds library cells only while it is being
assembled, so requests wait for a free slot, never for library cells. What a
prompt is, the scheduler does not know: it runs any PromptWork
(pc_cpu.engine.runtime.prompt_work; schema_prompt and document_prompt are the two kinds).

Idle time: a finished prompt may leave an IdleTask (a question over documents leaves the
computation of its exact prefix, pc_cpu.engine.prompts.document_prompt). When no request waits or
runs, the worker computes the oldest task one n_batch chunk per loop in a free slot's stream,
and gives the slot up (the task waits again) when a request arrives before a chunk: a request
waits at most one chunk for it. Once computed, the cells are stored and the slot keeps them as
a held head, for the next prompt with that head. `wait_idle` returns once none is left.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Union

from pc_cpu.engine.llama.context import Context
from pc_cpu.engine.runtime.generator import TextDecoder
from pc_cpu.engine.runtime.prompt_work import Answer, Head, IdleTask, PromptWork
from pc_cpu.engine.llama.sequences import SequenceRoles
from pc_cpu.engine.llama.sampler import Sampler, SamplingParams, TokenLogprob, token_logprob
from pc_cpu.engine.runtime.locks import FairLock
from pc_cpu.errors import ContextOverflowError, EngineError, PromptCacheError
from pc_cpu.result import Result, Tier
from pc_cpu.stats import QueueStats

log = logging.getLogger(__name__)

_GIVE_WAY_POLL_S = 0.002  # how long give_way leaves the lock at a time: a decode step asks for it within that
IDLE_TASKS_KEPT = 4  # idle tasks waiting at most: the latest prompts' (an older one is dropped)


@dataclass(frozen=True)
class Job:
    """One prompt to answer: what a caller submits."""

    work: PromptWork
    sampling: SamplingParams
    max_tokens: int
    stop: tuple[str, ...]
    t0: float  # perf_counter() when the caller asked: TTFT counts from here


@dataclass(frozen=True)
class Text:
    """The next piece of an answer's text, as a stream hands it out."""

    text: str
    # With logprobs asked for: those of the tokens whose text this piece completes (Result.logprobs' shape)
    logprobs: tuple[dict, ...] = ()


@dataclass(frozen=True)
class Done:
    result: Result


@dataclass(frozen=True)
class Failed:
    error: BaseException


Event = Union[Text, Done, Failed]


@dataclass
class SchedulerStats:
    """Counts since the context was made: how much batching actually happened."""

    steps: int = 0  # decode steps: each advances every running prompt by one token
    tokens: int = 0  # tokens decoded in those steps
    max_batch: int = 0  # most prompts advanced in one step
    decode_calls: int = 0  # llama_decode calls of those steps: one per prompt when batch-invariant


@dataclass(eq=False)
class Request:
    """A Job in flight. The worker owns every field but `events` and `cancelled`."""

    job: Job
    events: "queue.Queue[Event]" = field(default_factory=queue.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    slot: int = -1
    sampler: Sampler | None = None
    decoder: TextDecoder | None = None
    tokens: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    pending: int | None = None  # the sampled token still to be decoded
    next_pos: int = 0
    cap: int = 0  # most tokens this request may generate
    ttft_ms: float = 0.0
    tiers: dict[str, Tier] = field(default_factory=dict)
    prompt_end: int = 0  # where the prompt ends in its stream: generated tokens' cells follow
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per generated token, when the job asks
    logprobs_sent: int = 0  # how many of them went out with a piece

    def emit(self, text: str, logprobs: Callable[[list[TokenLogprob]], list[dict]] | None = None) -> None:
        """Hands out a piece of text (none when empty), with the logprobs of its tokens not handed out yet."""
        if text:
            self.text.append(text)
            fresh = self.logprobs[self.logprobs_sent:]
            self.logprobs_sent = len(self.logprobs)
            self.events.put(Text(text, tuple(logprobs(fresh)) if logprobs and fresh else ()))


@dataclass
class IdleRun:
    """The idle task being computed: its slot (out of the free list meanwhile) and the tokens done."""

    task: IdleTask
    slot: int | None  # None: library work, which takes no stream
    done: int = 0


class Scheduler:
    """Admits, batches and retires the requests of one context; one worker thread does the llama.cpp calls."""

    def __init__(self, ctx: Context, prompts: Context, roles: SequenceRoles, lock: FairLock, *,
                 batch_invariant: bool = True):
        self.ctx = ctx  # the library context: where prompts are assembled (slot i stages stream i)
        self.prompts = prompts  # one stream per slot: where prompts are finished and generated
        self._free = list(reversed(roles.slots))  # pop() hands out the lowest slot first
        # What each free slot's stream still holds from its last prompt (PromptWork.kept_head), for reuse.
        self._held: dict[int, Head] = {}
        self._released: dict[int, int] = {}  # slot -> when it was last freed (a counter): the oldest is reused first
        self._releases = 0
        self._lock = lock  # the PromptCache's: schema loading waits between steps
        self._wake = threading.Condition()
        self._pending: deque[Request] = deque()
        self._active: list[Request] = []
        self._idle: deque[IdleTask] = deque(maxlen=IDLE_TASKS_KEPT)  # waiting for idle time, oldest first
        self._ready_at: dict = {}  # an idle task's key -> the monotonic time it may start (IdleTask.delay)
        self._idle_run: IdleRun | None = None  # the task being computed
        self._closing = False
        self._thread: threading.Thread | None = None
        self.stats = SchedulerStats()
        self.batch_invariant = batch_invariant  # see the module docstring

    # --- callers' side --------------------------------------------------------

    def submit(self, job: Job) -> Request:
        """Queues `job`; returns the Request whose events report its text and result."""
        request = Request(job)
        with self._wake:
            if self._closing:
                raise EngineError("this PromptCache is closed")
            self._pending.append(request)
            self._start_worker()
            self._wake.notify_all()  # all: wait_idle's callers wait on it too
        return request

    def _start_worker(self) -> None:
        """Starts the worker thread on the first request (call holding `_wake`)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="pc_cpu-scheduler", daemon=True)
            self._thread.start()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Returns True once no request waits or runs and no idle task is left; False when `timeout` seconds pass first.

        A closed scheduler is idle: its tasks are dropped.
        """
        with self._wake:
            return self._wake.wait_for(lambda: self._closing or not self._busy(), timeout)

    def _busy(self) -> bool:
        """Returns whether the worker has anything to do (call holding `_wake`)."""
        return bool(self._pending or self._active or self._idle or self._idle_run)

    def close(self) -> None:
        """Stops the worker; requests still waiting or running fail with EngineError."""
        with self._wake:
            self._closing = True
            self._wake.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    @property
    def active(self) -> int:
        """Returns how many requests are generating now."""
        return len(self._active)

    def queue_stats(self) -> QueueStats:
        """Returns the prompts running and waiting, the streams kept for reuse and the background work waiting."""
        with self._wake:
            # A request being prefilled is active already and leaves the queue once its prefill returns.
            active = {id(r) for r in self._active}
            waiting = sum(id(r) not in active for r in self._pending)
            return QueueStats(active=len(active), waiting=waiting, held_streams=len(self._held),
                              idle_tasks=len(self._idle) + (self._idle_run is not None))

    def give_way(self, seconds: float) -> None:
        """Returns once the prompts running or waiting have had `seconds` of the context, or none is left.

        For long work that holds the context lock and can stop between steps (encoding a document
        batch by batch): giving way for as long as its last step took, it leaves running prompts at
        least half of the time, where taking turns step for step gave them one token per batch.
        Called holding the lock; returns holding it.
        """
        if self._lock.nested:
            return  # an outer holder expects no interruption: pausing would only spin
        deadline = time.monotonic() + seconds
        self._lock.yield_turn()  # whoever waits already goes first
        while (self._active or self._pending) and time.monotonic() < deadline:
            self._lock.pause(_GIVE_WAY_POLL_S)

    # --- the worker -------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._closing and not (self._pending or self._active or self._idle_run):
                    if self._idle:  # only tasks that wait for their delay: sleep until the first may start
                        wait = min(self._ready_at.get(t.key, 0.0) for t in self._idle) - time.monotonic()
                        if wait <= 0:
                            break
                        self._wake.wait(wait)
                        continue
                    self._wake.notify_all()  # wait_idle's callers: nothing is left
                    self._wake.wait()
                if self._closing:
                    break
            with self._lock:
                try:
                    self._retire_cancelled()
                    if self._pending:
                        self._stop_idle_run()  # its slot goes to the request
                    self._admit()
                    if self._active:
                        self._step()
                except BaseException as exc:  # a failed step fails its requests, never the worker
                    log.exception("decode step failed")
                    for request in list(self._active):
                        self._fail(request, exc)
                if not self._active:
                    self._idle_step()
        with self._lock:
            error = EngineError("the PromptCache was closed before this prompt finished")
            for request in list(self._active) + list(self._pending):
                self._fail(request, error)
            self._pending.clear()

    def _retire_cancelled(self) -> None:
        for request in [r for r in self._active if r.cancelled.is_set()]:
            self._finish(request, "cancelled")

    def _admit(self) -> None:
        while self._free:
            with self._wake:
                if not self._pending:
                    return
                request = self._pending[0]
            if request.cancelled.is_set():
                self._pop(request)
                continue
            try:
                self._start(request)
            except BaseException as exc:
                self._pop(request)
                self._fail(request, exc)
                continue
            self._pop(request)

    def _pop(self, request: Request) -> None:
        with self._wake:
            if self._pending and self._pending[0] is request:
                self._pending.popleft()

    def _start(self, request: Request) -> None:
        """Admits `request` into a free slot, builds its KV cache and samples its first token."""
        job, prompts = request.job, self.prompts
        end = job.work.positions()
        cap = min(job.max_tokens, prompts.n_ctx - end)
        if cap < 1:
            raise ContextOverflowError(
                f"prompt needs {end} positions and a prompt slot holds {prompts.n_ctx}: raise n_ctx or shorten "
                "the prompt")
        reuse, held = self._reusable_slot(job.work)
        if reuse is not None:  # the stream already holds the prompt's first cells: no restore, no library work
            request.tiers = job.work.held_tiers()
            self._free.remove(reuse)
            request.slot = reuse
        else:
            request.tiers = job.work.prepare()
            request.slot = self._pick_free_slot()
        self._held.pop(request.slot, None)
        request.cap = cap
        request.sampler = Sampler(job.sampling, prompts.model)
        request.decoder = TextDecoder(prompts.model, job.stop)
        self._active.append(request)
        request.next_pos = (job.work.prefill_tail(request.slot, held) if reuse is not None
                            else job.work.prefill(request.slot))
        request.prompt_end = request.next_pos
        token = request.sampler.sample(prompts.handle, -1)
        request.ttft_ms = (time.perf_counter() - job.t0) * 1000
        self._accept(request, token, self._logprob(request, token, -1))

    def _step(self) -> None:
        """Decodes the pending token of every active request, then samples each one's next.

        One batch per request when batch-invariant (the module docstring says why), else one for all.
        """
        ready = [r for r in self._active if r.pending is not None]
        if not ready:
            return
        self.stats.steps += 1
        self.stats.tokens += len(ready)
        self.stats.max_batch = max(self.stats.max_batch, len(ready))
        for batch in ([r] for r in ready) if self.batch_invariant else [ready]:
            self.prompts.decode_each([r.pending for r in batch], [r.next_pos for r in batch],
                                     [r.slot for r in batch])
            self.stats.decode_calls += 1
            for i, request in enumerate(batch):  # sampled before the next batch overwrites the logits
                request.next_pos += 1
                request.pending = None
                token = request.sampler.sample(self.prompts.handle, i)
                self._accept(request, token, self._logprob(request, token, i))

    def _logprob(self, request: Request, token: int, index: int) -> TokenLogprob | None:
        """Returns the sampled token's log probability from output `index`'s logits, when the job asks for them."""
        top = request.job.sampling.logprobs
        return None if top is None else token_logprob(self.prompts.logits(index), token, top)

    def _accept(self, request: Request, token: int, logprob: TokenLogprob | None = None) -> None:
        """Records a sampled token; ends the request at end-of-generation, a stop string or its cap."""
        if self.prompts.model.is_end_of_generation(token):
            self._finish(request, "stop")
            return
        request.tokens.append(token)
        if logprob is not None:
            request.logprobs.append(logprob)
        request.emit(request.decoder.push(token), self._logprob_dicts)
        if request.decoder.stopped:
            self._finish(request, "stop")
        elif len(request.tokens) >= request.cap:
            self._finish(request, "length")
        else:
            request.pending = token

    def _reusable_slot(self, work: PromptWork) -> tuple[int | None, Head | None]:
        """Returns the free slot whose stream serves most of the prompt (PromptWork.reusable) and what it holds."""
        best, keep = None, 0
        for slot in self._free:
            held = self._held.get(slot)
            n = work.reusable(held) if held is not None else 0
            if n > keep:
                best, keep = slot, n
        return best, None if best is None else self._held[best]

    def _finish(self, request: Request, reason: str) -> None:
        request.emit(request.decoder.flush(), self._logprob_dicts)
        answer = Answer(tuple(request.tokens), request.next_pos - request.prompt_end, "".join(request.text), reason)
        if reason != "cancelled":
            self._queue_idle(request.job.work, answer)  # before the caller hears of it: wait_idle then sees the task
        self._release(request, kept=self._kept_head(request.job.work, answer))
        job = request.job
        total = (time.perf_counter() - job.t0) * 1000
        counts = job.work.counts()
        result = Result(text="".join(request.text), token_ids=list(request.tokens),
                        ttft_ms=request.ttft_ms or total, total_ms=total, cached_tokens=counts.cached,
                        uncached_tokens=counts.uncached, finish_reason=reason, use_cache=job.work.use_cache,
                        modules=list(counts.modules), tiers=request.tiers,
                        logprobs=self._logprobs_of(request))
        request.events.put(Done(result))

    def _logprobs_of(self, request: Request) -> list[dict] | None:
        """Returns the Result's logprobs: per generated token, its text and log probability and the likeliest others."""
        if request.job.sampling.logprobs is None:
            return None
        return self._logprob_dicts(request.logprobs)

    def _logprob_dicts(self, logprobs: list[TokenLogprob]) -> list[dict]:
        """Returns TokenLogprobs as Result.logprobs has them: each token's bytes, log probability and the likeliest others."""
        piece = self.prompts.model.piece
        return [{"token_id": lp.token, "bytes": list(piece(lp.token)), "logprob": lp.logprob,
                 "top": [{"token_id": t, "bytes": list(piece(t)), "logprob": p} for t, p in lp.top]}
                for lp in logprobs]

    def _fail(self, request: Request, error: BaseException) -> None:
        self._release(request)
        if not isinstance(error, PromptCacheError):
            error = EngineError(f"generation failed: {error}")
        request.events.put(Failed(error))

    # --- idle time ----------------------------------------------------------------

    @staticmethod
    def _kept_head(work: PromptWork, answer: Answer) -> Head | None:
        """Returns what a finished prompt's stream keeps for reuse (None: it is emptied); never fails the answer."""
        try:
            return work.kept_head(answer)
        except Exception:
            log.exception("could not tell what a finished prompt's stream holds; emptied")
            return None

    def _queue_idle(self, work: PromptWork, answer: Answer) -> None:
        """Queues the idle task of a finished prompt, unless one with its key waits or runs already."""
        try:
            task = work.idle_task(answer)
        except Exception:  # never fails the answer it follows
            log.exception("could not plan idle work")
            task = None
        with self._wake:
            queued = [t.key for t in self._idle] + ([self._idle_run.task.key] if self._idle_run else [])
            if task is not None and task.key not in queued:
                self._idle.append(task)  # maxlen: the oldest waiting task is dropped
            # A task's delay counts from the last answer, not its own: questions sent back to back each
            # go first, instead of waiting for an earlier one's task that became ready meanwhile.
            now = time.monotonic()
            self._ready_at = {t.key: max(self._ready_at.get(t.key, 0.0), now + t.delay) for t in self._idle}

    def _idle_step(self) -> None:
        """Computes the next chunk of the idle task (starting the oldest one), unless a request waits.

        Call holding the lock, with no request active. A failure drops the task, never the worker.
        """
        with self._wake:
            if self._pending or self._closing:
                return
            run = self._idle_run or self._next_idle_run()
        if run is None:
            return
        if run.slot is None:  # library work: one step, no stream
            try:
                run.task.save(None)
            except Exception:
                log.exception("idle work failed; dropped")
            self._idle_run = None
            return
        try:
            task, lo = run.task, run.done
            start, tokens = task.start, task.tokens
            call_end = min((c for c in task.calls if c > start + lo), default=start + len(tokens)) - start
            hi = min(call_end, lo + self.prompts.n_batch)
            self.prompts.decode(tokens[lo:hi], range(start + lo, start + hi), run.slot, logits_last=False)
            run.done = hi
            if hi == len(tokens):
                head = run.task.save(run.slot)
                if head is not None:
                    self._held[run.slot] = head
                self._end_idle_run(keep=head is not None)
        except Exception:
            log.exception("idle work failed; dropped")
            self._end_idle_run(keep=False)

    def _next_idle_run(self) -> IdleRun | None:
        """Returns the oldest idle task still to do, started in its stream (call holding `_wake`).

        That is the free slot holding the task's base, cut at its start, or an emptied free slot.
        """
        now = time.monotonic()
        while self._free:
            task = next((t for t in self._idle if self._ready_at.get(t.key, 0.0) <= now), None)
            if task is None:
                return None
            self._idle.remove(task)
            if task.skip():
                continue
            if not task.tokens and task.base is None:
                self._idle_run = IdleRun(task, None)
                return self._idle_run
            if task.base is not None:
                slot = next((s for s in self._free if self._held.get(s) == task.base), None)
                if slot is None:  # its stream was reused meanwhile: nothing to continue
                    continue
                self._free.remove(slot)
                self._held.pop(slot)
                self.prompts.seq_rm(slot, task.start, -1)
            else:
                slot = self._pick_free_slot()
                self._held.pop(slot, None)
                self.prompts.seq_rm(slot)
            self._idle_run = IdleRun(task, slot)
            return self._idle_run
        return None

    def _stop_idle_run(self) -> None:
        """Gives up the idle task being computed (its slot emptied and freed); it waits again, first in line."""
        run = self._idle_run
        if run is None:
            return
        if run.task.base is not None:  # the stream keeps what was computed; the task is not resumed
            head = run.task.stopped(run.task.start + run.done)
            if head is not None:
                self._held[run.slot] = head
            self._end_idle_run(keep=head is not None)
            return
        self._end_idle_run(keep=False)
        with self._wake:
            if len(self._idle) < IDLE_TASKS_KEPT:
                self._idle.appendleft(run.task)

    def _end_idle_run(self, *, keep: bool) -> None:
        """Frees the idle task's slot; its stream keeps the computed cells when `keep` (its head is held)."""
        run, self._idle_run = self._idle_run, None
        if not keep:
            self._held.pop(run.slot, None)
            self.prompts.seq_rm(run.slot)
        self._free_slot(run.slot)

    def drop_held(self) -> int:
        """Empties the streams that free slots keep for reuse; returns their cells. Call with the PromptCache's lock.

        An idle task being computed gives its stream up too (it starts again later).
        """
        self._stop_idle_run()
        cells = 0
        for slot, head in list(self._held.items()):
            self.prompts.seq_rm(slot)
            cells += head.end
        self._held.clear()
        return cells

    def _pick_free_slot(self) -> int:
        """Returns a free slot, preferring one whose stream holds nothing worth keeping (the lowest), then the
        one freed longest ago (its held cells are the least recently used)."""
        empty = [slot for slot in self._free if slot not in self._held]
        slot = min(empty) if empty else min(self._free, key=lambda s: self._released.get(s, -1))
        self._free.remove(slot)
        return slot

    def _free_slot(self, slot: int) -> None:
        self._releases += 1
        self._released[slot] = self._releases
        self._free.append(slot)

    def _release(self, request: Request, *, kept: Head | None = None) -> None:
        """Frees the request's slot and sampler; its stream keeps `kept` (for reuse), or is emptied.

        The library keeps the module cells either way.
        """
        if request in self._active:
            self._active.remove(request)
        if request.slot >= 0:
            try:
                if kept is not None:
                    self._held[request.slot] = kept  # the next prompt's prefill_tail drops what it does not keep
                else:
                    self._held.pop(request.slot, None)
                    self.prompts.seq_rm(request.slot)
                self.ctx.seq_rm(request.slot)  # staging: empty unless assembly failed half-way
            finally:
                self._free_slot(request.slot)
                request.slot = -1
        if request.sampler is not None:
            request.sampler.close()
            request.sampler = None
