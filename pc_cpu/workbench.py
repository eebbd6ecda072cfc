"""Workbench: a PromptCache's prompts driven by hand, one at a time, for tests, benchmarks and tools.

Each call builds a prompt's cells in stream PROMPT_SEQ of the prompt context, exactly as the
scheduler builds them for `generate`, `ask` and `chat`, and hands back a PrefilledPrompt to read
(logits, cells, positions) before closing it. Use it while nothing else runs: it overwrites the
stream the first prompt slot uses.
"""

from __future__ import annotations

from typing import Callable, Sequence

from pc_cpu.documents import Documents
from pc_cpu.engine.cells.streams import full_prefill
from pc_cpu.engine.llama.context import Context
from pc_cpu.engine.prompts.document_prompt import DocumentWork
from pc_cpu.engine.prompts.schema_cells import ModuleCache
from pc_cpu.engine.prompts.schema_prompt import SchemaPrompt
from pc_cpu.engine.recompute.blend import Blender, LazyBlender
from pc_cpu.engine.runtime.locks import FairLock
from pc_cpu.engine.runtime.scheduler import Scheduler
from pc_cpu.errors import PromptCacheError
from pc_cpu.kvstate import ops
from pc_cpu.pml.plan import Plan
from pc_cpu.schemas import Schemas

PROMPT_SEQ = 0  # the first prompt slot's stream, where a prompt driven by hand is built


class Workbench:
    """Builds one prompt's cells by hand, as the scheduler would, and reads them (PromptCache.workbench)."""

    def __init__(self, prompts: Context, schemas: Schemas, modules: ModuleCache, documents: Documents,
                 scheduler: Scheduler, lock: FairLock, blender: LazyBlender,
                 document_work: Callable[..., DocumentWork]):
        self._prompts = prompts
        self._schemas = schemas
        self._modules = modules
        self._documents = documents
        self._blender = blender
        self._document_work = document_work  # PromptCache's: a question's arguments checked as `ask` checks them
        self.scheduler = scheduler  # runs every prompt: its stats, active count, give_way
        self.lock = lock  # every call into the contexts holds it, in arrival order; hold it to drive them by hand

    @property
    def blender(self) -> Blender | None:
        """Returns the selector of `select:` recomputation once a prompt has loaded it, else None."""
        return self._blender.loaded

    def prepare(self, plan: Plan, *, use_cache: bool, reserve: int = 1) -> dict[str, str]:
        """Makes the plan's encodings resident with room for the prompt; returns the tier that served each."""
        with self.lock:
            layout = self._schemas.layout(plan.schema)
            new_cells = plan.uncached_tokens + plan.selected_tokens if use_cache else 0
            keys = plan.encodings if use_cache else ()
            return self._modules.ensure(layout, keys, reserve=new_cells + reserve)

    def prefill(self, plan: Plan, *, use_cache: bool) -> int:
        """Builds the prompt's KV cache in stream PROMPT_SEQ; returns the position generation continues at.

        Makes the plan's encodings resident first.
        """
        with self.lock:
            self.scheduler.drop_held()  # stream PROMPT_SEQ is about to be overwritten
            self.prepare(plan, use_cache=use_cache)
            work = SchemaPrompt(plan, self._schemas.layout(plan.schema), use_cache, self._prompts, self._modules,
                                self._blender.get)
            return work.prefill(PROMPT_SEQ)

    def prefilled(self, plan: Plan, *, use_cache: bool) -> "PrefilledPrompt":
        """Returns the prompt's cells built as `generate` builds them, to read and then close.

        `with cache.workbench.prefilled(plan, use_cache=True) as prompt: prompt.logits()`.
        """
        return PrefilledPrompt(self.prefill(plan, use_cache=use_cache), self._prompts, self.lock)

    def full_prefill(self, tokens: Sequence[int], *, batch_starts: Sequence[int] = ()) -> "PrefilledPrompt":
        """Returns `tokens` computed at positions 0..n-1 of stream PROMPT_SEQ, to read and then close.

        The baseline a cached prompt is held to, computed where prompts are (an empty stream of
        the prompt context). `batch_starts`: token indices where a new llama_decode batch
        starts, as a cached prompt's runs did (some models' kernels round by batch); otherwise
        llama.cpp's own batches.
        """
        tokens = list(tokens)
        if not tokens:
            raise PromptCacheError("full_prefill: no tokens given; pass the prompt's token ids")
        wrong = [s for s in batch_starts if not 0 <= s < len(tokens)]
        if wrong:
            raise PromptCacheError(f"full_prefill: batch starts {wrong} lie outside the {len(tokens)} tokens; "
                                   f"give token indices in 0..{len(tokens) - 1}")
        with self.lock:
            self.scheduler.drop_held()  # stream PROMPT_SEQ is about to be overwritten
            end = full_prefill(self._prompts, tokens, PROMPT_SEQ, batch_starts)
        return PrefilledPrompt(end, self._prompts, self.lock)

    def prefilled_ask(self, question: str, *, documents: Sequence[str], system: str | None = None,
                      recompute=None, order: str | None = None, encoding: str | None = None, prefix: str = "off",
                      use_cache: bool = True) -> "PrefilledPrompt":
        """Returns the question's cells built as `ask` builds them, to read and then close.

        The arguments are `ask`'s; `prefix` defaults to "off" (documents encoded apart and moved,
        the path a new combination takes), and a stored exact prefix is used only if asked for.
        """
        work = self._document_work(question, documents, system=system, order=order, setting=None,
                                   recompute=recompute, prefix=prefix, encoding=encoding, use_cache=use_cache)
        with self.lock:
            self.scheduler.drop_held()  # stream PROMPT_SEQ is about to be overwritten
            work.prepare()
            end = work.prefill(PROMPT_SEQ)
            selected = self._documents.encoder.last_selected if work.prompt.select else ()
        return PrefilledPrompt(end, self._prompts, self.lock, selected=selected)


class PrefilledPrompt:
    """A prompt's cells in stream PROMPT_SEQ, built by hand (Workbench): what can be read of them.

    Closing it (or leaving its `with` block) frees the stream. Read it while nothing else runs.
    """

    def __init__(self, end: int, prompts: Context, lock: FairLock, *, selected: tuple[int, ...] = ()):
        self.end = end  # the position generation would continue at
        self.selected = selected  # the positions a `select:` policy chose to compute again (prefilled_ask)
        self._prompts = prompts
        self._lock = lock

    def logits(self):
        """Returns the logits after the prompt's last token (a numpy array over the vocabulary)."""
        with self._lock:
            return self._prompts.logits()

    def cells(self) -> bytes:
        """Returns the prompt's cells as a llama.cpp state blob (pc_cpu.kvstate.ops reads it)."""
        with self._lock:
            return self._prompts.state_get(PROMPT_SEQ)

    def positions(self) -> list[int]:
        """Returns the positions the prompt holds cells at (its first KV cache's), sorted."""
        with self._lock:
            if self._prompts.seq_pos_max(PROMPT_SEQ) < 0:
                return []
            return sorted(int(p) for p in ops.section_positions(self._prompts.state_get(PROMPT_SEQ))[0])

    def close(self) -> None:
        """Frees the prompt's stream."""
        with self._lock:
            self._prompts.seq_rm(PROMPT_SEQ)

    def __enter__(self) -> "PrefilledPrompt":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
