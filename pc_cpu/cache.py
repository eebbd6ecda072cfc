"""PromptCache: a model, its two llama.cpp contexts, and the owners of what it caches: schemas, documents, conversations.

    pc = PromptCache()                      # default model, see pc_cpu.model_path
    pc.load_schema(open("trip.pml").read())  # encodes every module once
    result = pc.generate('<prompt schema="trip"><paris/><user>Where to eat?</user></prompt>')
    print(result.text, result.ttft_ms)

The façade: it opens the model and two contexts, then hands each job to its owner: schemas to
pc_cpu.schemas (layouts, encoding as they load), documents to pc_cpu.documents (library, tokens,
encoders, questions), conversations to pc_cpu.conversations (chat turns), prompts to the scheduler
(pc_cpu.engine.runtime.scheduler: one worker thread, continuous batching), and prompts driven by
hand to pc_cpu.workbench. The library context (one unified KV cache) keeps encoded modules
resident; the prompt context gives each prompt slot a stream of its own, where a prompt is
assembled in position order, its text computed and its answer generated. Which sequence id plays
which role in each is decided once, in pc_cpu.engine.llama.sequences.SequenceRoles.
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from typing import Sequence

from pc_cpu.allocator import map_large_blocks_apart
from pc_cpu.conversations import Conversations, Tools
from pc_cpu.documents import Documents
from pc_cpu.engine.cells.encoder import Workspace
from pc_cpu.engine.llama.context import ContextConfig, default_flash_attn
from pc_cpu.engine.llama.model import Model
from pc_cpu.engine.llama.sampler import SamplingParams
from pc_cpu.engine.llama.sequences import SequenceRoles
from pc_cpu.engine.prompts.schema_cells import ModuleCache
from pc_cpu.engine.prompts.schema_prompt import SchemaPrompt
from pc_cpu.engine.recompute.blend import LazyBlender
from pc_cpu.engine.recompute.recompute_pass import LibraryRoom
from pc_cpu.engine.runtime.locks import ContextLocks
from pc_cpu.engine.runtime.prompt_work import PromptWork
from pc_cpu.engine.runtime.scheduler import Job, Scheduler
from pc_cpu.errors import PromptCacheError
from pc_cpu.memory import DEFAULT_DISK_BYTES, DEFAULT_PARALLEL, DEFAULT_RAM_BYTES, MemoryUse, memory_use
from pc_cpu.model_path import resolve_model_path
from pc_cpu.opening import cache_ropes, open_contexts, open_library, open_store
from pc_cpu.options import GenerationOptions
from pc_cpu.pml.encoding import check_mode
from pc_cpu.pml.plan import Plan, build_plan
from pc_cpu.pml.prompt import parse_prompt
from pc_cpu.pml.recompute import RecomputePolicy, parse_policy
from pc_cpu.pml.roles import markup_from_template
from pc_cpu.pml.schema import Schema
from pc_cpu.progress import ProgressCallback, paced
from pc_cpu.result import AddedDocument, Result
from pc_cpu.schemas import Schemas
from pc_cpu.stats import CacheStats, TierStats
from pc_cpu.store.document_library import DEFAULT_MAX_DOCUMENTS, Document, check_max_documents
from pc_cpu.store.redis_link import remote_url
from pc_cpu.store.remote import DEFAULT_REMOTE_BYTES
from pc_cpu.store.resident import ResidentTier
from pc_cpu.stream import Stream, ToolCallStream
from pc_cpu.workbench import PROMPT_SEQ, PrefilledPrompt, Workbench

__all__ = ["PromptCache", "Stream", "PrefilledPrompt", "PROMPT_SEQ"]  # the last three kept here for older imports

class PromptCache:
    """A model, one llama.cpp context, and the schemas whose modules are encoded in it."""

    def __init__(self, model: str | os.PathLike | None = None, *, n_ctx: int | None = None,
                 threads: int | None = None, n_seq_max: int = 64, parallel: int = DEFAULT_PARALLEL,
                 encoding: str = "preamble",
                 flash_attn: bool | None = None, store: str | os.PathLike | bool | None = None,
                 ram_bytes: int = DEFAULT_RAM_BYTES, disk_bytes: int = DEFAULT_DISK_BYTES, batch_invariant: bool = True,
                 max_documents: int = DEFAULT_MAX_DOCUMENTS, remote_store: str | bool | None = None,
                 remote_bytes: int = DEFAULT_REMOTE_BYTES, store_fallback: str | None = None, verbose: bool = False):
        """Loads the model and creates the context.

        Args:
            model: a model name (pc_cpu.models, e.g. "qwen2.5-coder-0.5b") or a GGUF path; None uses
                $PC_CPU_MODEL or the default, smollm2-135m.
            n_ctx: KV cells of the library (resident modules), and positions of one prompt: each of the
                `parallel` prompt slots has a stream of n_ctx cells of its own. None: the model's training
                context, at most 8192. More than the training context is refused (ContextBeyondTrainingError).
            threads: CPU threads for every computation; None: every core for prompts and encodings
                (batches), half of them for generating one token at a time (memory-bound; fewer threads
                stall less when other programs share the cores; pc_cpu.engine.llama.context).
            n_seq_max: sequence ids (up to 256): prompt slots, a scratch, the pin, and libraries of
                modules (union members each need their own library sequence).
            parallel: prompts generating at once (their steps interleaved); more wait their turn.
            encoding: "preamble" (modules see the schema text before them), "independent", or "chain"
                (also the cells of the module before them; pc_cpu.pml.encoding).
            flash_attn: None: off, except on sliding-window models, where llama.cpp chooses (on, on a CPU;
                pc_cpu.engine.llama.context.default_flash_attn). Off, cached prompts answer sooner; on
                suits whoever mostly prefills new text (docs/performance.md).
            store: directory of the disk tier; None: $PC_CPU_STORE_DIR or the user cache dir; False: RAM only.
            ram_bytes, disk_bytes: byte budgets of the RAM and disk tiers (1 GiB and 16 GiB); ram_bytes=0
                keeps no RAM tier (the disk tier, and the OS's page cache, serve restores). What the
                cache's memory comes to: `memory()`, docs/memory.md.
            batch_invariant: True decodes each running prompt's token in a batch of its own, so its
                answer is the one it gets alone; False decodes them in one batch, for more tokens per
                second, and an answer can then change with the prompts beside it (pc_cpu.engine.runtime.scheduler).
            max_documents: documents the library holds at most (pc_cpu.store.document_library); adding a new
                text beyond them is refused (DocumentLimitError).
            remote_store: a Redis (or Valkey) URL shared with other servers, a tier below RAM and disk
                (pc_cpu.store.remote): redis://host:6379/0, rediss:// for TLS, redis://user:password@host
                for AUTH. Every new encoding is written through to it and a local miss reads it; the
                document library lives there. None: $PC_CPU_REMOTE_STORE if set; False: none.
            remote_bytes: pc_cpu's bytes in that Redis at most (8 GiB), least recently used evicted by pc_cpu.
            store_fallback: None: a remote store that does not answer at start is an error
                (StoreUnavailableError); "local": a warning, and the local tiers serve until it answers.
            verbose: show llama.cpp's own log.
        """
        mode = check_mode(encoding)
        check_max_documents(max_documents)  # before the model loads: a mistake fails fast
        map_large_blocks_apart()  # freed blobs of cells go back to the OS (pc_cpu.allocator)
        roles = SequenceRoles.for_contexts(parallel, n_seq_max)  # before the model loads, too
        # Before the model loads: a store that cannot open (a disk not writable, a Redis down) fails fast.
        self.store = open_store(store, ram_bytes=ram_bytes, disk_bytes=disk_bytes, remote=remote_url(remote_store),
                                remote_bytes=remote_bytes, fallback=store_fallback)
        try:
            self.model, self._ctx, self._prompts = open_contexts(
                Model(resolve_model_path(model), verbose=verbose), roles,
                lambda model: ContextConfig(n_ctx=n_ctx or min(model.info.n_ctx_train or 8192, 8192),
                                            n_seq_max=n_seq_max, threads=threads,
                                            flash_attn=default_flash_attn(model.info) if flash_attn is None else flash_attn))
        except Exception:
            self.store.close()
            raise
        markup = markup_from_template(self.model.chat_template(), bos_token=self.model.bos_text(),
                                      eos_token=self.model.eos_text())
        resident = ResidentTier(list(roles.libraries))
        ropes = cache_ropes(self.model)
        self._locks = ContextLocks()
        self._lock = self._locks.context  # one thread at a time calls into the contexts, in arrival order
        self._blender = LazyBlender(self._ctx, resident.idle_seqs, roles.scratch)  # probe: on first select:
        self.documents = Documents(self.model, markup, self._prompts, roles, self.store, ropes, self._lock,
                                   library=open_library(self.store, max_documents=max_documents),
                                   library_room=LibraryRoom(self._ctx, roles.slots, resident.idle_seqs,
                                                            together=1 if self.model.info.n_swa else None),
                                   probe=lambda: self._blender.get().probe)
        # Sliding-window models compute modules in the library context: their long runs need the hold there.
        workspace = None if self.model.info.n_swa else Workspace(self._prompts, roles.workspace)
        # load_schema computes modules here, giving way to running prompts between batches (Schemas._precompute).
        adder = None if workspace is None else Workspace(self._prompts, roles.adder)
        self._modules = ModuleCache(self._ctx, resident, self.store, roles, mode=mode, workspace=workspace, rope=ropes)
        self._scheduler = Scheduler(self._ctx, self._prompts, roles, self._lock, batch_invariant=batch_invariant)
        self.schemas = Schemas(self.model, markup, self._modules, self._scheduler, self._locks,
                               mode=mode, n_ctx=self._ctx.n_ctx, adder=adder)
        self.conversations = Conversations(self.model, self._prompts, self.store, self.documents,
                                           document_encoding=self.documents.default_encoding())
        self.workbench = Workbench(self._prompts, self.schemas, self._modules, self.documents, self._scheduler,
                                   self._lock, self._blender, self.documents.question)

    # --- lifecycle ----------------------------------------------------------

    def close(self) -> None:
        """Stops the scheduler, then frees the contexts, then the model."""
        self._scheduler.close()
        self._blender.close()
        self._prompts.close()
        self._ctx.close()
        self.model.close()
        self.store.close()

    def __enter__(self) -> "PromptCache":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- schemas ------------------------------------------------------------

    def load_schema(self, pml: str, *, encode: bool = True, progress: ProgressCallback | None = None,
                    cancel: threading.Event | None = None) -> Schema:
        """Returns the parsed schema after laying it out and (by default) encoding its modules.

        Loading a schema with a name already loaded replaces it (unchanged text is a no-op).

        Args:
            pml: the schema's PML text.
            encode: False only lays it out; prompts then encode the modules they import.
            progress: called with an EncodeProgress (pc_cpu.progress) after each batch of computed
                tokens and each encoding done, in this thread; the last event has `finished` set.
            cancel: set it (from another thread) to stop encoding after the current batch; the
                schema is then unloaded (the encodings already stored stay in the tiers).

        Raises:
            CancelledError: `cancel` was set before every encoding was done.
        """
        return self.schemas.load(pml, encode=encode, progress=progress, cancel=cancel)

    def unload_schema(self, name: str) -> None:
        """Drops a schema and frees its modules' cells."""
        self.schemas.unload(name)

    def evict(self, schema: str | None = None) -> int:
        """Frees the KV cells of encoded modules (of one schema when given); returns the library cells freed.

        The streams idle prompt slots keep for reuse are emptied too. The modules stay in the RAM and
        disk tiers: the next prompt restores them instead of encoding.
        """
        with self._lock:
            self._scheduler.drop_held()  # the free prompt slots' streams, kept for reuse
            return self._modules.evict(schema)

    @property
    def flash_attn(self) -> bool:
        """Returns whether llama.cpp runs flash attention here (None, llama.cpp's choice, is on on a CPU)."""
        return self._ctx.config.flash_attn is not False

    @property
    def n_ctx(self) -> int:
        """Returns the cells the library context holds (the n_ctx asked for, or the model's default)."""
        return self._ctx.n_ctx

    # --- prompts ------------------------------------------------------------

    def plan(self, prompt_pml: str, *, recompute: "str | float | RecomputePolicy | None" = None) -> Plan:
        """Returns the Plan of a prompt against its (loaded) schema (see pc_cpu.pml.recompute for `recompute`)."""
        self.schemas.load_attached(prompt_pml)  # a prompt made by pc_cpu.pml.compiler carries its schema
        prompt = parse_prompt(prompt_pml)
        layout = self.schemas.layout(prompt.schema)
        return build_plan(layout, prompt, self.model, self.schemas.markup, parse_policy(recompute))

    def generate(self, prompt: "str | Plan", options: GenerationOptions | None = None, **overrides) -> Result:
        """Returns the model's answer to a PML prompt (or its Plan, from `plan`), with timings and cache counts.

        Options (pc_cpu.options.GenerationOptions), as keywords or one GenerationOptions: max_tokens=256,
        temperature=0.0, top_k=0, top_p=1.0, seed=0, stop=(), use_cache=True, recompute=None.
        use_cache=False is the baseline: a full prefill of the identical tokens, through the same generator.
        recompute: which cached module tokens to compute again in this prompt, e.g. "tail:32" or "10%"
        (pc_cpu.pml.recompute); None keeps every cached cell, as in the paper.
        """
        stream = self.stream(prompt, GenerationOptions.of(options, overrides, method="generate"))
        for _ in stream:
            pass
        return stream.result

    def stream(self, prompt: "str | Plan", options: GenerationOptions | None = None, **overrides) -> "Stream":
        """Returns an iterator of text pieces as they are generated; `.result` is set when it ends.

        Takes what `generate` takes. A Plan already carries its recompute policy: giving one again is refused.
        Safe to call from many threads: prompts run together, batched in one context.
        Closing the stream early cancels the prompt and frees its cells.
        """
        t0 = time.perf_counter()
        options = GenerationOptions.of(options, overrides, method="stream")
        sampling = options.sampling(self.model)
        with self._lock:
            plan = self._plan_of(prompt, options.recompute)
            layout = self.schemas.layout(plan.schema)
            if plan.selected_tokens and options.use_cache:
                self._blender.get()  # loads the probe here, so that a failure is the caller's
        work = SchemaPrompt(plan, layout, options.use_cache, self._prompts, self._modules, self._blender.get)
        return self._submit(work, sampling, options, t0)

    def _plan_of(self, prompt: "str | Plan", recompute) -> Plan:
        """Returns the plan of a PML prompt, or the Plan given (made by `plan`, so a caller plans once)."""
        if not isinstance(prompt, Plan):
            return self.plan(prompt, recompute=recompute)
        if recompute is not None:
            raise PromptCacheError(f"recompute={recompute!r} was given with a Plan, which has its policy already; "
                                   "give it to plan() instead")
        self.schemas.get(prompt.schema)  # a plan of a schema unloaded since is refused by name
        return prompt

    def _submit(self, work: PromptWork, sampling: SamplingParams, options: GenerationOptions, t0: float) -> Stream:
        """Returns the Stream of a prompt handed to the scheduler."""
        return Stream(self._scheduler.submit(Job(work, sampling, options.max_tokens, options.stop, t0)))

    # --- documents ------------------------------------------------------------

    def add_document(self, text: str, *, name: str | None = None, system: str | None = None,
                     progress: ProgressCallback | None = None,
                     cancel: threading.Event | None = None) -> AddedDocument:
        """Returns the document's id after encoding it once (the same text always gets the same id).

        The id is an AddedDocument: a str whose `tiers` say where the cells came from, e.g.
        {"doc-1a2b...": "disk"} for a document a tier held, or {"doc-...": "encoded",
        "#preamble": "ram"} for one this call computed after its system message's cells.

        The encoding goes to the store, so later processes sharing it encode nothing. A
        document is encoded after its preamble (pc_cpu.pml.document_layout): `system` encodes it
        for the system message that `ask` will be given (None: no system message); asking
        with another system message encodes it for that one on first use. On a model whose
        questions take encoding="library" (see `ask`), it is also encoded after the documents
        the library added before it, so that any place a question gives it is ready.

        Args:
            text: the document; it needs a printable character (pc_cpu.pml.document_layout.has_text).
            name: an alias of the id (a file name, say); messages and progress events name the document by it.
            system: the system message to encode it after.
            progress: called with an EncodeProgress (kind "document", pc_cpu.progress) after each batch
                of the document's tokens computed and once it is done, in this thread. A document a
                tier already holds is not encoded, and reports nothing.
            cancel: set it (from another thread) to stop the encoding after the current batch.

        Running prompts get the context between its batches (Documents.add); a failed or
        cancelled add leaves nothing in the library.

        Raises:
            DocumentError: no printable text, text too long for the context, a name already used for other
                text, or one that cannot name a document (pc_cpu.store.document_library.check_name).
            DocumentLimitError: a name too long, or one name or one document more than the library takes.
            AddCancelledError: `cancel` was set before the encoding finished.
        """
        new = self.documents.check_addable(text, name, system)  # before waiting for the stream: refusals come fast
        with self._locks.adding():
            pace = lambda report: paced(report, self._scheduler.give_way)  # noqa: E731 (running prompts' turn)
            return self.documents.add(new, encoding=self.documents.default_encoding(), pace=pace, progress=progress,
                                      cancel=cancel)

    def remove_document(self, id_or_name: str) -> Document:
        """Returns the document it forgot, after deleting its encodings from every tier; other documents are untouched.

        Raises:
            UnknownDocumentError: nothing has this id or name.
        """
        with self._lock:
            return self.documents.remove(id_or_name)

    def list_documents(self) -> list[Document]:
        """Returns every document of the library (id, text, names, added), oldest first, as it is now.

        Servers sharing a Redis add and remove documents too: the library is read again when one
        did (one GET tells); while Redis is down, as last read.
        """
        library = self.documents.library
        with self._lock:
            library.catch_up()
            return library.all()

    def ask(self, question: str, options: GenerationOptions | None = None, *, documents: Sequence[str],
            system: str | None = None, order: str | None = None, setting: str | None = None,
            prefix: str | None = None, encoding: str | None = None, **overrides) -> Result:
        """Returns the model's answer to `question` over `documents` (ids or names), in the order given.

        The documents' cells are restored from their encodings and moved into place; only the
        question is computed. Generation options as for `generate`; use_cache=False is the baseline,
        a full prefill of the identical tokens. Result.modules lists the document ids; Result.tiers
        says which tier served each (and "#preamble" the system message's).

        recompute: document tokens to compute again after the documents before them ("tail:32",
            "10%", "relevant:1", "all", "select:10%"; pc_cpu.pml.document_layout.with_recompute).
        order: "given" (default), "relevant-first" or "relevant-last" (the baseline uses the same order).
        setting: "fast" or "accurate": a recompute policy, order and prefix measured on this model
            (pc_cpu.document_settings), instead of recompute and order.
        prefix: when the exact prefix (system message and documents computed together, as the
            baseline does) is computed, so that a question restoring it answers as the baseline:
            "background" (default: once nothing else runs, `wait_idle`), "first" (by the first
            question, as slow as the baseline) or "off".
        encoding: what a document's cells were computed after besides the system message:
            "library" (the documents added before it) or "preamble" (nothing else); None: the
            model's measured choice (its "fast" setting). The other is computed on first use and stored.
        """
        stream = self.stream_ask(question, GenerationOptions.of(options, overrides, method="ask"),
                                 documents=documents, system=system, order=order, setting=setting, prefix=prefix,
                                 encoding=encoding)
        for _ in stream:
            pass
        return stream.result

    def stream_ask(self, question: str, options: GenerationOptions | None = None, *, documents: Sequence[str],
                   system: str | None = None, order: str | None = None, setting: str | None = None,
                   prefix: str | None = None, encoding: str | None = None, **overrides) -> "Stream":
        """Returns an iterator of the answer's text pieces, as `stream` does for PML prompts; see `ask`."""
        t0 = time.perf_counter()
        options = GenerationOptions.of(options, overrides, method="stream_ask")
        sampling = options.sampling(self.model)
        work = self.documents.question(question, documents, system=system, order=order, setting=setting,
                                       recompute=options.recompute, prefix=prefix, encoding=encoding,
                                       use_cache=options.use_cache)
        return self._submit(work, sampling, options, t0)

    def chat(self, messages: Sequence, options: GenerationOptions | None = None, *,
             documents: Sequence[str] | None = None, after_edit: str = "recompute", tools: Sequence[dict] | None = None,
             tool_choice: "str | dict | None" = None, parallel_tool_calls: bool | None = None,
             **overrides) -> Result:
        """Returns the model's answer to a conversation: OpenAI-style messages, the last one the user's or a tool's.

        messages: dicts {"role": "system" | "developer" | "user" | "assistant" | "tool", "content": str}
        (content may also be a list of {"type": "text", "text": ...} parts), oldest first. They are
        rendered by the model's own chat template (pc_cpu.pml.chat), as a full prefill of them would be.
        A last assistant message is continued: the answer starts with its text.

        tools: OpenAI-style function tools ({"type": "function", "function": {"name", "description",
        "parameters"}}), rendered by the chat template (pc_cpu.pml.tools); tool_choice "auto" (the
        default with tools), "none", "required" or {"type": "function", "function": {"name": ...}};
        parallel_tool_calls=False: one call at most. Result.tool_calls then holds the calls the answer
        made (OpenAI's shape), Result.text the rest, finish_reason "tool_calls". Send them back as the
        assistant's message ({"role": "assistant", "content": None, "tool_calls": [...]}) followed by one
        {"role": "tool", "tool_call_id": ..., "content": result} per call: the next step computes only those.

        Each turn reuses the cells of its earlier turns (from a prompt slot that still holds them,
        else from the RAM or disk tier; pc_cpu.engine.prompts.chat_prompt) and computes only its new
        messages; send the assistant's answers back as they were returned. Result.cached_tokens
        counts the reused tokens, Result.tiers["#conversation"] says where they came from.
        use_cache=False is the baseline, a full prefill in the same decode calls; a turn whose
        history was stored answers token for token as it does. Options as for `generate` (no recompute).

        documents: ids or names (add_document), placed at the start of the first user message, as
        `ask` places them before the question; send the same documents with every turn.
        after_edit: when an earlier message was edited or deleted, "recompute" (default) computes
        everything after the edit again (the full prefill's answer); "reuse" moves the later turns'
        cells to their new positions and computes only the edited message and the new one: faster,
        and the answer can differ (bench/RESULTS.md measures how often; same process only).

        Raises:
            PromptError: no messages, an unknown role, a last message that is not the user's, text
                UTF-8 cannot encode, messages the chat template refuses, or an unknown after_edit.
            ContextOverflowError: the conversation and one answer token need more positions than a
                prompt holds (n_ctx); drop its oldest turns (keep the system message) or raise n_ctx.
        """
        stream = self.stream_chat(messages, GenerationOptions.of(options, overrides, method="chat"),
                                  documents=documents, after_edit=after_edit, tools=tools, tool_choice=tool_choice,
                                  parallel_tool_calls=parallel_tool_calls)
        for _ in stream:
            pass
        return stream.result

    def stream_chat(self, messages: Sequence, options: GenerationOptions | None = None, *,
                    documents: Sequence[str] | None = None, after_edit: str = "recompute",
                    tools: Sequence[dict] | None = None, tool_choice: "str | dict | None" = None,
                    parallel_tool_calls: bool | None = None, **overrides) -> "Stream | ToolCallStream":
        """Returns an iterator of the answer's text pieces, as `stream` does for PML prompts; see `chat`.

        With tools, the pieces are the answer's text before its first call; its calls are in `.result.tool_calls`.
        Closing it early (a client that went away) keeps the turn's cells computed so far for the next turn.
        """
        t0 = time.perf_counter()
        options = GenerationOptions.of(options, overrides, method="stream_chat")
        if options.recompute is not None:
            raise PromptCacheError(f"recompute={options.recompute!r} is for schema prompts and documents; a "
                                   "conversation reuses its earlier turns as they were computed: leave it out")
        tools = Tools.of(tools, tool_choice, parallel_tool_calls)
        sampling = self.conversations.tool_sampling(options.sampling(self.model), tools)
        work = self.conversations.work(messages, documents=documents, after_edit=after_edit,
                                       use_cache=options.use_cache, tools=tools)
        stream = self._submit(work, sampling, options, t0)
        if not tools.functions or tools.choice.mode == "none":
            return stream
        return ToolCallStream(stream, [tool["function"]["name"] for tool in tools.functions])

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Returns True once no prompt waits or runs and no background work is left; False if `timeout` seconds pass first.

        Background work: the exact prefixes `ask(..., prefix="background")` computes after a
        question (see `ask`). Tests and benchmarks wait here before a question that should reuse one.
        """
        return self._scheduler.wait_idle(timeout)

    def memory(self) -> MemoryUse:
        """Returns this cache's large allocations in bytes, and the bound they stay under (pc_cpu.memory).

        The sizes of llama.cpp's buffers are the ones it reported when the contexts opened.
        """
        return memory_use(self.model, self._ctx, self._prompts, self.store)

    def stats(self) -> CacheStats:
        """Returns what this cache holds now: each byte tier's bytes and entries, resident cells, documents, tips, queues.

        Cheap (every count is kept current by its owner), so a long-running host can poll it.
        """
        tiers = tuple(TierStats(tier.name, tier.bytes_used, tier.budget_bytes, len(tier)) for tier in self.store.tiers)
        return CacheStats(tiers=tiers, resident_cells=self.schemas.resident_cells, library_cells=self._ctx.n_ctx,
                          schemas=len(self.schemas.names), documents=len(self.documents.library),
                          conversation_tips=self.conversations.tips, queues=self._scheduler.queue_stats())

    def __getattr__(self, name: str):
        """Returns what an older name of this façade now names on its owner, with a DeprecationWarning."""
        if name in _MOVED:
            owner, new = _MOVED[name]
            warnings.warn(f"PromptCache.{name} is now PromptCache.{owner}.{new}", DeprecationWarning, stacklevel=2)
            return getattr(getattr(self, owner), new)
        if name == "engine":
            raise AttributeError("PromptCache.engine is gone: tests of the machinery build it (tests/engine/conftest.py); "
                                 "read cells through PromptCache.schemas, .documents and .workbench")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")




# Names this façade had before its owners did, and where each lives now: (attribute, name on it).
_MOVED = {name: ("schemas", new) for name, new in (
    ("layout", "layout"), ("schema_names", "names"), ("inspect_schema", "inspect"), ("resident_cells", "resident_cells"),
    ("modules_encoded", "encoded"), ("encoding_cells", "cells"), ("encoding", "mode"), ("markup", "markup"))}
_MOVED |= {name: ("documents", new) for name, new in (("library", "library"), ("document_prompt", "prompt"),
           ("document_tokens", "tokens"), ("documents_encoded", "encoded"), ("document_cells", "cells"))}
_MOVED |= {"chat_prompt": ("conversations", "prompt"), "chat_template": ("conversations", "template")}
_MOVED |= {name: ("workbench", name) for name in ("prepare", "prefill", "prefilled", "full_prefill", "prefilled_ask",
                                                   "scheduler", "lock", "blender")}
