"""The machinery a PromptCache drives, built from the constructors PromptCache.__init__ wires: for tests and benches.

    with Engine("smollm2-135m", n_ctx=2048) as engine:
        layout = engine.load(schema_pml)             # encoded and resident, as load_schema leaves it
        engine.modules.sequence_of(layout, "doc")    # the ModuleCache's library sequence of a module
        doc = engine.add(text)                       # a document's cells, as add_document computes them
        work = engine.question("Why?", [doc])        # a DocumentWork, as `ask` makes it

Nothing here is the façade's: a test of what a caller sees opens a PromptCache and reads its public
views (schemas, documents, conversations, workbench). tests/engine/conftest.py gives `make_engine`
and `engine` fixtures; bench scripts that time the machinery import Engine from here.
"""

from __future__ import annotations

import contextlib
import time

from pc_cpu.allocator import map_large_blocks_apart
from pc_cpu.engine.cells.encoder import Workspace
from pc_cpu.engine.llama.context import ContextConfig, default_flash_attn
from pc_cpu.engine.llama.model import Model
from pc_cpu.engine.llama.sampler import SamplingParams
from pc_cpu.engine.llama.sequences import SequenceRoles
from pc_cpu.engine.prompts.document_cells import DocumentEncoder
from pc_cpu.engine.prompts.document_prompt import DocumentWork
from pc_cpu.engine.prompts.schema_cells import ModuleCache
from pc_cpu.engine.prompts.schema_prompt import SchemaPrompt
from pc_cpu.engine.recompute.blend import LazyBlender
from pc_cpu.engine.recompute.recompute_pass import LibraryRoom
from pc_cpu.engine.runtime.locks import FairLock
from pc_cpu.engine.runtime.scheduler import Done, Failed, Job, Scheduler
from pc_cpu.memory import DEFAULT_DISK_BYTES, DEFAULT_PARALLEL, DEFAULT_RAM_BYTES
from pc_cpu.model_path import resolve_model_path
from pc_cpu.opening import cache_ropes, open_contexts, open_store
from pc_cpu.pml.document_layout import (check_document_policy, document_id, document_tokens, layout_documents,
                                        preamble_tokens, tail_tokens, with_recompute)
from pc_cpu.pml.encoding import check_scaffolds, encoding_keys
from pc_cpu.pml.fold import fold_layout
from pc_cpu.pml.layout import build_layout
from pc_cpu.pml.plan import build_plan
from pc_cpu.pml.prompt import parse_prompt
from pc_cpu.pml.recompute import parse_policy
from pc_cpu.pml.roles import markup_from_template
from pc_cpu.pml.schema import parse_schema
from pc_cpu.store.resident import ResidentTier


class Engine:
    """The machinery a PromptCache drives, built from the constructors PromptCache.__init__ wires (pc_cpu/cache.py).

    Its options are PromptCache's, with the same defaults. ctx: the library context (resident
    encodings, the probe, one-pass recomputation); prompts: the prompt context (a stream per slot,
    the workspace, the adder's); roles: which sequence plays which role in each; resident: the
    library's sequences and what they hold; store: the byte tiers; modules: the ModuleCache of ctx;
    encoder: the DocumentEncoder questions are assembled with (the workspace, the library room, the
    probe); adder: the one add_document computes with (its own stream); blender: the probe, loaded
    on first `select:`. Layouts and plans come from the pure functions of pc_cpu.pml, with the model
    as tokenizer; `scheduler` (made on first use) runs prompts as PromptCache runs them.
    """

    def __init__(self, model=None, *, n_ctx: int | None = None, threads: int | None = None, n_seq_max: int = 64,
                 parallel: int = DEFAULT_PARALLEL, encoding: str = "preamble", flash_attn: bool | None = None,
                 store=None, ram_bytes: int = DEFAULT_RAM_BYTES, disk_bytes: int = DEFAULT_DISK_BYTES,
                 batch_invariant: bool = True):
        self._scheduler = None
        self._batch_invariant = batch_invariant
        self.texts: dict[str, str] = {}  # document id -> text, of the documents `add` encoded
        map_large_blocks_apart()  # freed blobs of cells go back to the OS, as in a PromptCache (pc_cpu.allocator)
        self.roles = SequenceRoles.for_contexts(parallel, n_seq_max)
        self.model, self.ctx, self.prompts = open_contexts(
            Model(resolve_model_path(model)), self.roles,
            lambda model: ContextConfig(n_ctx=n_ctx or min(model.info.n_ctx_train or 8192, 8192),
                                        n_seq_max=n_seq_max, threads=threads,
                                        flash_attn=default_flash_attn(model.info) if flash_attn is None else flash_attn))
        with contextlib.ExitStack() as opened:  # on a failure, closes what was opened
            opened.callback(self.model.close)
            opened.callback(self.ctx.close)
            opened.callback(self.prompts.close)
            self.markup = markup_from_template(self.model.chat_template(), bos_token=self.model.bos_text(),
                                               eos_token=self.model.eos_text())
            self.resident = ResidentTier(list(self.roles.libraries))
            self.store = open_store(store, ram_bytes=ram_bytes, disk_bytes=disk_bytes)
            self.ropes = cache_ropes(self.model)  # None: llama.cpp's seq_add moves cells (a RoPE the relocator lacks)
            self.blender = LazyBlender(self.ctx, self.resident.idle_seqs, self.roles.scratch)
            opened.callback(self.blender.close)
            room = LibraryRoom(self.ctx, self.roles.slots, self.resident.idle_seqs,
                               together=1 if self.model.info.n_swa else None)
            self.encoder = DocumentEncoder(self.prompts, self.roles.workspace, self.store, self.ropes, room,
                                           lambda: self.blender.get().probe)
            self.adder = DocumentEncoder(self.prompts, self.roles.adder, self.store, self.ropes)
            # Sliding-window models compute modules in the library context (PromptCache.__init__).
            workspace = None if self.model.info.n_swa else Workspace(self.prompts, self.roles.workspace)
            self.adder_workspace = None if workspace is None else Workspace(self.prompts, self.roles.adder)
            self.modules = ModuleCache(self.ctx, self.resident, self.store, self.roles, mode=encoding,
                                       workspace=workspace, rope=self.ropes)
            self.lock = FairLock()
            self._close = opened.pop_all()

    @property
    def mode(self) -> str:
        return self.modules.mode

    # --- schemas (pc_cpu.schemas does the same for a PromptCache) ---

    def layout(self, pml: str):
        """Returns a schema's layout, folded to what a prompt holds (pc_cpu.schemas.Schemas.layout_of)."""
        limit = min(self.ctx.n_ctx, self.model.info.n_ctx_train or self.ctx.n_ctx)
        layout = fold_layout(build_layout(parse_schema(pml), self.model, self.markup), limit)
        check_scaffolds(layout)
        return layout

    def load(self, pml: str):
        """Returns a schema's layout after making each of its encodings resident, one at a time, as load_schema does."""
        layout = self.layout(pml)
        for key in encoding_keys(layout, self.mode):
            if self.adder_workspace is not None:  # computed in the adder's stream, then restored (Schemas._precompute)
                self.modules.precompute(layout, key, self.adder_workspace)
            self.modules.ensure(layout, [key])
        return layout

    def evict(self, schema: str | None = None) -> int:
        """Frees the resident cells of encodings (one schema's, when given), as PromptCache.evict; returns how many."""
        self.drop_held()
        return self.modules.evict(schema)

    def plan(self, layout, prompt_pml: str, recompute=None):
        """Returns the Plan of a PML prompt against `layout` (PromptCache.plan)."""
        return build_plan(layout, parse_prompt(prompt_pml), self.model, self.markup, parse_policy(recompute))

    def prefill(self, layout, plan, *, use_cache: bool = True, slot: int = 0) -> int:
        """Builds the plan's prompt in stream `slot` of `prompts` as the scheduler does; returns where generation goes.

        The last token's logits are then `prompts.logits()`; `prompts.seq_rm(slot)` frees the stream.
        """
        self.drop_held()
        work = SchemaPrompt(plan, layout, use_cache, self.prompts, self.modules, self.blender.get)
        work.prepare()
        return work.prefill(slot)

    def prefill_logits(self, layout, plan, *, use_cache: bool = True):
        """Returns the last-token logits of the plan's prompt built in stream 0 (freed again)."""
        self.prefill(layout, plan, use_cache=use_cache)
        try:
            return self.prompts.logits()
        finally:
            self.prompts.seq_rm(0)

    # --- documents (pc_cpu.documents does the same for a PromptCache) ---

    def add(self, text: str, *, system: str | None = None) -> str:
        """Returns a document's id once its cells after the preamble alone are stored (computed in the adder's stream)."""
        doc_id = document_id(text)
        self.adder.document_blob(preamble_tokens(system, self.model, self.markup), doc_id,
                                 document_tokens(text, self.model))
        self.texts[doc_id] = text
        return doc_id

    def document_prompt(self, question: str, ids, *, system: str | None = None):
        """Returns the DocumentPrompt of `question` over documents `add` encoded, each after the preamble alone."""
        return self.texts_prompt(question, [self.texts[d] for d in ids], system=system)

    def texts_prompt(self, question: str, texts, *, system: str | None = None):
        """Returns the DocumentPrompt of `question` over documents of these texts, in order, each after the preamble alone.

        As Documents.prompt lays them out (order "given", encoding="preamble"); nothing is encoded.
        """
        return layout_documents(preamble_tokens(system, self.model, self.markup),
                                [(document_id(text), document_tokens(text, self.model)) for text in texts],
                                tail_tokens(question, self.model, self.markup))

    def question(self, question: str, ids, *, recompute=None, use_cache: bool = True, prefix: str = "off",
                 system: str | None = None):
        """Returns the DocumentWork of `question` over `ids` (as `ask` makes it, with encoding="preamble")."""
        prompt = self.document_prompt(question, ids, system=system)
        if use_cache:
            prompt = with_recompute(prompt, check_document_policy(parse_policy(recompute)))
        return DocumentWork(prompt, self.encoder, use_cache, prefix)

    # --- running prompts (the scheduler PromptCache runs them with) ---

    @property
    def scheduler(self):
        """Returns the Scheduler of these contexts, made on first use (closed with the engine)."""
        if self._scheduler is None:
            self._scheduler = Scheduler(self.ctx, self.prompts, self.roles, self.lock,
                                        batch_invariant=self._batch_invariant)
        return self._scheduler

    def drop_held(self) -> None:
        """Empties the streams the scheduler keeps for reuse (if it ran): a prompt built by hand takes stream 0."""
        if self._scheduler is not None:
            with self.lock:
                self._scheduler.drop_held()

    def answer(self, work, *, max_tokens: int, t0: float | None = None):
        """Returns the Result of a PromptWork (a DocumentWork, a SchemaPrompt) run by the scheduler, greedy.

        `t0`: the perf_counter() its TTFT counts from (default: now).
        """
        job = Job(work, SamplingParams(), max_tokens, (), time.perf_counter() if t0 is None else t0)
        request = self.scheduler.submit(job)
        while True:
            event = request.events.get()
            if isinstance(event, Done):
                return event.result
            if isinstance(event, Failed):
                raise event.error

    def generate(self, layout, prompt_pml: str, *, max_tokens: int, use_cache: bool = True, recompute=None):
        """Returns the Result of a PML prompt against `layout` run by the scheduler, greedy, as `generate` runs it.

        Its TTFT counts from this call, planning included, as `generate`'s does.
        """
        t0 = time.perf_counter()
        plan = self.plan(layout, prompt_pml, recompute)
        return self.answer(SchemaPrompt(plan, layout, use_cache, self.prompts, self.modules, self.blender.get),
                           max_tokens=max_tokens, t0=t0)

    def close(self) -> None:
        """Stops the scheduler (if one ran), then frees the probe, the contexts and the model."""
        if self._scheduler is not None:
            self._scheduler.close()
            self._scheduler = None
        self._close.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
