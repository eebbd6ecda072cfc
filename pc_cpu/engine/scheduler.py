"""Runs every prompt of one context: continuous batching over prompt slots.

Callers submit Jobs from any thread and read a Request's events. One worker
thread owns the llama.cpp calls. Between decode steps it admits waiting requests
into free prompt slots (their modules made resident and shared in, their own
tokens computed, their first token sampled: that is their time to first token),
then decodes the next token of every active request in one llama_decode. A
request leaves when it ends, fails or is cancelled, and its slot and cells are
reused by the next one.

Modules are shared, never copied: every slot that imports a module holds the
same cells (seq_cp). Cells are reserved per request (its own tokens plus the
tokens it may generate), and encodings that active requests use are pinned, so
admitting a request never evicts what another one is reading.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Union

from pc_cpu.engine.assembler import assemble
from pc_cpu.engine.blend import Blender
from pc_cpu.engine.context import Context
from pc_cpu.engine.generator import TextDecoder
from pc_cpu.engine.modules import ModuleCache
from pc_cpu.engine.sampler import Sampler, SamplingParams
from pc_cpu.engine.turns import FairLock
from pc_cpu.errors import ContextOverflowError, EngineError, PromptCacheError
from pc_cpu.pml.encoding import encoding_runs
from pc_cpu.pml.layout import ROOT, Layout
from pc_cpu.pml.plan import Plan
from pc_cpu.result import Result

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Job:
    """One prompt to answer: what a caller submits."""

    plan: Plan
    layout: Layout
    schema_source: str  # identifies the encodings in the byte tiers
    sampling: SamplingParams
    max_tokens: int
    stop: tuple[str, ...]
    use_cache: bool
    t0: float  # perf_counter() when the caller asked: TTFT counts from here


@dataclass(frozen=True)
class Piece:
    text: str


@dataclass(frozen=True)
class Done:
    result: Result


@dataclass(frozen=True)
class Failed:
    error: BaseException


Event = Union[Piece, Done, Failed]


@dataclass
class SchedulerStats:
    """Counts since the context was made: how much batching actually happened."""

    steps: int = 0  # batched decode steps
    tokens: int = 0  # tokens decoded in those steps
    max_batch: int = 0  # most prompts decoded together in one step


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
    reserved: int = 0  # KV cells held back for it
    ttft_ms: float = 0.0
    tiers: dict[str, str] = field(default_factory=dict)

    def emit(self, text: str) -> None:
        if text:
            self.text.append(text)
            self.events.put(Piece(text))


def prefill_slot(ctx: Context, modules: ModuleCache, plan: Plan, slot: int, *, use_cache: bool,
                 blender: "Blender | None" = None) -> int:
    """Builds `plan`'s KV cache in the empty sequence `slot`; returns the position generation continues at.

    Cached: resident module cells are shared in and only the prompt's own tokens are
    computed (plus, with a `select:` policy, the cells `blender` picks). Baseline: a
    full prefill of the identical tokens at positions 0..n-1.
    """
    if use_cache:
        library_of = lambda key: modules.resident.get((plan.schema, key))  # noqa: E731
        if plan.selected_tokens:
            if blender is None:
                raise EngineError("recompute 'select:…' needs the probe model; use PromptCache.generate")
            blender.assemble(plan, slot, library_of)
        else:
            assemble(ctx, plan, slot, library_of)
        return plan.end
    tokens = plan.tokens
    ctx.seq_rm(slot)
    ctx.decode(tokens, range(len(tokens)), slot)
    return len(tokens)


class Scheduler:
    """Admits, batches and retires the requests of one context; one worker thread does the llama.cpp calls."""

    def __init__(self, ctx: Context, modules: ModuleCache, slots: list[int], lock: FairLock):
        self.ctx = ctx
        self.modules = modules
        self._free = list(reversed(slots))  # pop() hands out the lowest slot first
        self._lock = lock  # the PromptCache's: schema loading waits between steps
        self._wake = threading.Condition()
        self._pending: deque[Request] = deque()
        self._active: list[Request] = []
        self._closing = False
        self._thread: threading.Thread | None = None
        self.stats = SchedulerStats()
        self.blender: Blender | None = None  # set by PromptCache when a prompt first asks for select:

    # --- callers' side --------------------------------------------------------

    def submit(self, job: Job) -> Request:
        """Queues `job`; returns the Request whose events report its text and result."""
        request = Request(job)
        with self._wake:
            if self._closing:
                raise EngineError("this PromptCache is closed")
            self._pending.append(request)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="pc_cpu-scheduler", daemon=True)
                self._thread.start()
            self._wake.notify()
        return request

    def close(self) -> None:
        """Stops the worker; requests still waiting or running fail with EngineError."""
        with self._wake:
            self._closing = True
            self._wake.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    @property
    def active(self) -> int:
        """Returns how many requests are generating now."""
        return len(self._active)

    # --- the worker -------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._wake:
                while not (self._pending or self._active or self._closing):
                    self._wake.wait()
                if self._closing:
                    break
            with self._lock:
                try:
                    self._retire_cancelled()
                    self._admit()
                    if self._active:
                        self._step()
                except BaseException as exc:  # a failed step fails its requests, never the worker
                    log.exception("decode step failed")
                    for request in list(self._active):
                        self._fail(request, exc)
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
                if not self._start(request):
                    return  # waits, in order, until a running request frees cells
            except BaseException as exc:
                self._pop(request)
                self._fail(request, exc)
                continue
            self._pop(request)

    def _pop(self, request: Request) -> None:
        with self._wake:
            if self._pending and self._pending[0] is request:
                self._pending.popleft()

    def _start(self, request: Request) -> bool:
        """Admits `request` into a slot and samples its first token; False when it must wait for cells."""
        job, ctx = request.job, self.ctx
        plan = job.plan
        end = plan.end if job.use_cache else len(plan.tokens)
        new_cells = plan.uncached_tokens + plan.selected_tokens if job.use_cache else len(plan.tokens)
        keys = plan.encodings if job.use_cache else frozenset()
        own_cells = sum(len(r.tokens) for key in keys for r in encoding_runs(job.layout, key, self.modules.mode))
        cap = min(job.max_tokens, ctx.n_ctx - end, ctx.n_ctx - own_cells - new_cells)
        if cap < 1:
            raise ContextOverflowError(
                f"prompt needs {end} positions and {own_cells + new_cells} KV cells; the context has "
                f"{ctx.n_ctx}: raise n_ctx or shorten the prompt")
        others = sum(r.reserved for r in self._active)
        pinned = {(r.job.plan.schema, key) for r in self._active if r.job.use_cache for key in r.job.plan.encodings}
        try:
            request.tiers = self.modules.ensure(job.layout, keys, source=job.schema_source,
                                                reserve=new_cells + cap + others, pinned=pinned)
        except ContextOverflowError as exc:
            if self._active:
                log.debug("prompt waits for KV cells: %s", exc)
                return False
            raise
        request.slot = self._free.pop()
        request.reserved = new_cells + cap
        request.cap = cap
        request.sampler = Sampler(job.sampling)
        request.decoder = TextDecoder(ctx.model, job.stop)
        self._active.append(request)
        request.next_pos = prefill_slot(ctx, self.modules, plan, request.slot, use_cache=job.use_cache,
                                        blender=self.blender)
        token = request.sampler.sample(ctx.handle, -1)
        request.ttft_ms = (time.perf_counter() - job.t0) * 1000
        self._accept(request, token)
        return True

    def _step(self) -> None:
        """Decodes the pending token of every active request in one batch, then samples each one's next."""
        batch = [r for r in self._active if r.pending is not None]
        if not batch:
            return
        self.ctx.decode_each([r.pending for r in batch], [r.next_pos for r in batch], [r.slot for r in batch])
        self.stats.steps += 1
        self.stats.tokens += len(batch)
        self.stats.max_batch = max(self.stats.max_batch, len(batch))
        for i, request in enumerate(batch):
            request.next_pos += 1
            request.pending = None
            self._accept(request, request.sampler.sample(self.ctx.handle, i))

    def _accept(self, request: Request, token: int) -> None:
        """Records a sampled token; ends the request at end-of-generation, a stop string or its cap."""
        if self.ctx.model.is_end_of_generation(token):
            self._finish(request, "stop")
            return
        request.tokens.append(token)
        request.emit(request.decoder.push(token))
        if request.decoder.stopped:
            self._finish(request, "stop")
        elif len(request.tokens) >= request.cap:
            self._finish(request, "length")
        else:
            request.pending = token

    def _finish(self, request: Request, reason: str) -> None:
        request.emit(request.decoder.flush())
        self._release(request)
        job = request.job
        total = (time.perf_counter() - job.t0) * 1000
        plan = job.plan
        result = Result(text="".join(request.text), token_ids=list(request.tokens),
                        ttft_ms=request.ttft_ms or total, total_ms=total,
                        cached_tokens=plan.cached_tokens if job.use_cache else 0,
                        uncached_tokens=plan.uncached_tokens if job.use_cache else len(plan.tokens),
                        finish_reason=reason, use_cache=job.use_cache,
                        modules=[m for m in plan.modules if m != ROOT], tiers=request.tiers)
        request.events.put(Done(result))

    def _fail(self, request: Request, error: BaseException) -> None:
        self._release(request)
        if not isinstance(error, PromptCacheError):
            error = EngineError(f"generation failed: {error}")
        request.events.put(Failed(error))

    def _release(self, request: Request) -> None:
        """Frees the request's slot, cells and sampler (its shared module cells stay with the library)."""
        if request in self._active:
            self._active.remove(request)
        if request.slot >= 0:
            try:
                self.ctx.seq_rm(request.slot)
            finally:
                self._free.append(request.slot)
                request.slot = -1
        if request.sampler is not None:
            request.sampler.close()
            request.sampler = None
