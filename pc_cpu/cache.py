"""PromptCache: load PML schemas once, then answer prompts that reuse their encoded modules.

    pc = PromptCache()                      # default model, see pc_cpu.model_path
    pc.load_schema(open("trip.pml").read())  # encodes every module once
    result = pc.generate('<prompt schema="trip"><paris/><user>Where to eat?</user></prompt>')
    print(result.text, result.ttft_ms)

The façade: it opens the model and two llama.cpp contexts, then hands each job to its owner:
schemas to pc_cpu.schemas (layouts, encoding as they load), documents to pc_cpu.documents
(library, tokens, encoders, removal), encodings to pc_cpu.engine.prompts.schema_cells.ModuleCache (resident
cells, byte tiers), prompts to pc_cpu.engine.runtime.scheduler (one worker thread, continuous batching).

The library context (one unified KV cache) keeps encoded modules resident and assembles prompts
from them; the prompt context gives each prompt slot a stream of its own, where an assembled
prompt is moved in position order, its text computed and its answer generated
(pc_cpu.engine.cells.streams). Which sequence id plays which role in each is decided once, in
pc_cpu.engine.llama.sequences.SequenceRoles.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, Sequence

from pc_cpu import document_settings
from pc_cpu.allocator import map_large_blocks_apart
from pc_cpu.documents import Documents
from pc_cpu.engine.recompute.blend import Blender, LazyBlender
from pc_cpu.engine.cells.cell_store import CellStore
from pc_cpu.engine.prompts.chat_prompt import ChatWork, ConversationCells
from pc_cpu.engine.prompts.document_prompt import DocumentWork
from pc_cpu.engine.llama.context import Context, ContextConfig, default_flash_attn
from pc_cpu.engine.cells.encoder import Workspace
from pc_cpu.engine.llama.model import Model
from pc_cpu.engine.prompts.schema_cells import ModuleCache
from pc_cpu.engine.recompute.recompute_pass import LibraryRoom
from pc_cpu.engine.llama.sampler import SamplingParams
from pc_cpu.engine.runtime.scheduler import Failed, Job, Request, Scheduler, Text
from pc_cpu.engine.prompts.schema_prompt import SchemaPrompt
from pc_cpu.engine.llama.sequences import SequenceRoles
from pc_cpu.engine.cells.streams import full_prefill, open_prompt_streams
from pc_cpu.engine.runtime.locks import ContextLocks, FairLock
from pc_cpu.errors import ContextBeyondTrainingError, ContextOverflowError, PromptCacheError
from pc_cpu.kvstate import ops
from pc_cpu.kvstate.rope import RopeParams
from pc_cpu.memory import DEFAULT_DISK_BYTES, DEFAULT_PARALLEL, DEFAULT_RAM_BYTES, STATE_BUFFERS, MemoryUse
from pc_cpu.model_path import resolve_model_path
from pc_cpu.options import GenerationOptions
from pc_cpu.pml.chat import ChatMessage, ChatPrompt, ChatTemplate, chat_prompt, check_after_edit, check_messages
from pc_cpu.pml.document_layout import (DocumentPrompt, check_document_policy, check_encoding, check_prefix,
                                        preamble_tokens)
from pc_cpu.pml.encoding import check_mode
from pc_cpu.pml.layout import Layout
from pc_cpu.pml.plan import Plan, build_plan
from pc_cpu.pml.prompt import parse_prompt
from pc_cpu.pml.recompute import RecomputePolicy, parse_policy
from pc_cpu.pml.roles import markup_from_template
from pc_cpu.pml.schema import Schema, parse_schema
from pc_cpu.progress import ProgressCallback, paced
from pc_cpu.result import AddedDocument, Result
from pc_cpu.schemas import LoadedSchema, Schemas
from pc_cpu.stats import CacheStats, TierStats
from pc_cpu.store.disk import DiskStore, default_store_dir
from pc_cpu.store.document_library import DEFAULT_MAX_DOCUMENTS, Document, DocumentLibrary, check_max_documents, library_directory
from pc_cpu.store.ram import RamStore
from pc_cpu.store.resident import ResidentTier
from pc_cpu.store.tiers import TieredStore

PROMPT_SEQ = 0  # the first prompt slot (tests and `prefill` use it by hand)


@dataclasses.dataclass(frozen=True)
class EngineParts:
    """The engine a PromptCache drives, for tests and benchmarks of the machinery itself (PromptCache.engine).

    Not the library's API: these objects change with the engine. What a caller reads of a cache's
    cells has a public view on PromptCache (prefilled, prefilled_ask, full_prefill, document_cells,
    encoding_cells); a test that needs more than that tests the engine, and reaches it here.
    """

    ctx: Context  # the library context: resident schema encodings, the probe, one-pass recomputation
    prompts: Context  # the prompt context: a stream per prompt slot, the workspaces
    roles: SequenceRoles  # which sequence id plays which role in each
    modules: ModuleCache  # a schema's encodings, resident and in the byte tiers
    documents: Documents  # the document library and its encoder (documents.encoder)


class PromptCache:
    """A model, one llama.cpp context, and the schemas whose modules are encoded in it."""

    def __init__(self, model: str | os.PathLike | None = None, *, n_ctx: int | None = None,
                 threads: int | None = None, n_seq_max: int = 64, parallel: int = DEFAULT_PARALLEL,
                 encoding: str = "preamble",
                 flash_attn: bool | None = None, store: str | os.PathLike | bool | None = None,
                 ram_bytes: int = DEFAULT_RAM_BYTES, disk_bytes: int = DEFAULT_DISK_BYTES, batch_invariant: bool = True,
                 max_documents: int = DEFAULT_MAX_DOCUMENTS, verbose: bool = False):
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
            flash_attn: None: off, except on sliding-window models, where llama.cpp chooses (on, on a
                CPU; pc_cpu.engine.llama.context.default_flash_attn). Off, a cached prompt's few tokens over
                thousands of cached cells decode ~1.5-2x faster, and each generated token 15-24% faster;
                a long prefill (new text, an encoding) costs about the same on SmolLM2 but 15-41% more on
                Qwen2.5-Coder-0.5B (docs/performance.md). True suits whoever mostly prefills new text.
                Cells stored with and without it are kept apart (their V layouts differ).
            store: directory of the disk tier; None: $PC_CPU_STORE_DIR or the user cache dir; False: RAM only.
            ram_bytes, disk_bytes: byte budgets of the RAM and disk tiers (1 GiB and 16 GiB); ram_bytes=0
                keeps no RAM tier (the disk tier, and the OS's page cache, serve restores). What the
                cache's memory comes to: `memory()`, README "Memory".
            batch_invariant: True decodes each running prompt's token in a batch of its own, so its
                answer is the one it gets alone; False decodes them in one batch, for more tokens per
                second, and an answer can then change with the prompts beside it (pc_cpu.engine.runtime.scheduler).
            max_documents: documents the library holds at most (pc_cpu.store.document_library); adding a new
                text beyond them is refused (DocumentLimitError).
            verbose: show llama.cpp's own log.
        """
        self.encoding = check_mode(encoding)
        check_max_documents(max_documents)  # before the model loads: a mistake fails fast
        map_large_blocks_apart()  # freed blobs of cells go back to the OS (pc_cpu.allocator)
        roles = SequenceRoles.for_contexts(parallel, n_seq_max)  # before the model loads, too
        self.model, self._ctx, self._prompts = _open_contexts(
            Model(resolve_model_path(model), verbose=verbose), roles,
            lambda model: ContextConfig(n_ctx=n_ctx or min(model.info.n_ctx_train or 8192, 8192),
                                        n_seq_max=n_seq_max, threads=threads,
                                        flash_attn=default_flash_attn(model.info) if flash_attn is None else flash_attn))
        self.markup = markup_from_template(self.model.chat_template(), bos_token=self.model.bos_text(),
                                           eos_token=self.model.eos_text())
        self._roles = roles
        self._resident = ResidentTier(list(roles.libraries))
        self.store = _open_store(store, ram_bytes=ram_bytes, disk_bytes=disk_bytes)
        disk = next((tier for tier in self.store.tiers if isinstance(tier, DiskStore)), None)
        ropes = _cache_ropes(self.model)
        self._blender = LazyBlender(self._ctx, self._resident.idle_seqs, roles.scratch)  # probe: on first select:
        self._documents = Documents(self.model, self.markup, self._prompts, roles, self.store, ropes,
                                    library_dir=library_directory(disk) if disk is not None else None,
                                    max_documents=max_documents,
                                    library_room=LibraryRoom(self._ctx, roles.slots, self._resident.idle_seqs,
                                                             together=1 if self.model.info.n_swa else None),
                                    probe=lambda: self._blender.get().probe)
        # Sliding-window models compute modules in the library context: their long runs need the hold there.
        workspace = None if self.model.info.n_swa else Workspace(self._prompts, roles.workspace)
        # load_schema computes modules here, giving way to running prompts between batches (_precompute).
        adder = None if workspace is None else Workspace(self._prompts, roles.adder)
        self._modules = ModuleCache(self._ctx, self._resident, self.store, roles, mode=self.encoding,
                                    workspace=workspace, rope=ropes)
        self._locks = ContextLocks()
        self._lock = self._locks.context  # one thread at a time calls into the context, in arrival order
        self._scheduler = Scheduler(self._ctx, self._prompts, roles, self._lock, batch_invariant=batch_invariant)
        self.chat_template = ChatTemplate(self.model.chat_template(), eos_token=self.model.eos_text())
        self._conversations = ConversationCells(CellStore(self._prompts, self.store), self._prompts.cells_id,
                                                can_cut=not self.model.info.n_swa, mover=self._documents.encoder)
        self.schemas = Schemas(self.model, self.markup, self._modules, self._scheduler, self._locks,
                               mode=self.encoding, n_ctx=self._ctx.n_ctx, adder=adder)

    # --- lifecycle ----------------------------------------------------------

    def close(self) -> None:
        """Stops the scheduler, then frees the contexts, then the model."""
        self._scheduler.close()
        self._blender.close()
        self._prompts.close()
        self._ctx.close()
        self.model.close()

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

        The prompt streams idle slots keep for reuse are emptied too (an exact prefix being computed
        in the background starts again later). The modules stay in the RAM and disk tiers: the next
        prompt restores them instead of encoding.
        """
        with self._lock:
            self._scheduler.drop_held()  # the free prompt slots' streams, kept for reuse
            return self._modules.evict(schema)

    def inspect_schema(self, pml: str) -> Layout:
        """Returns the layout of a schema without loading or encoding it."""
        return self.schemas.layout_of(parse_schema(pml))

    def layout(self, name: str) -> Layout:
        """Returns the layout of a loaded schema."""
        return self.schemas.get(name).layout

    @property
    def schema_names(self) -> list[str]:
        return self.schemas.names

    @property
    def resident_cells(self) -> int:
        """Returns the KV cells held by encoded modules."""
        return self._resident.cells

    @property
    def flash_attn(self) -> bool:
        """Returns whether llama.cpp runs flash attention here (None, llama.cpp's choice, is on on a CPU)."""
        return self._ctx.config.flash_attn is not False

    @property
    def n_ctx(self) -> int:
        """Returns the cells the library context holds (the n_ctx asked for, or the model's default)."""
        return self._ctx.n_ctx

    def _loaded(self, name: str) -> LoadedSchema:
        return self.schemas.get(name)

    def _paced(self, report: Callable[[int], None]) -> Callable[[int], None]:
        """Returns the after-batch callback of a long encoding: `report`, then running prompts' turn (give_way)."""
        return paced(report, self._scheduler.give_way)

    # --- prompts ------------------------------------------------------------

    def plan(self, prompt_pml: str, *, recompute: "str | float | RecomputePolicy | None" = None) -> Plan:
        """Returns the Plan of a prompt against its (loaded) schema (see pc_cpu.pml.recompute for `recompute`)."""
        self._load_attached_schema(prompt_pml)
        prompt = parse_prompt(prompt_pml)
        layout = self._loaded(prompt.schema).layout
        return build_plan(layout, prompt, self.model, self.markup, parse_policy(recompute))

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
        sampling = _sampling(options)
        with self._lock:
            plan = self._plan_of(prompt, options.recompute)
            loaded = self._loaded(plan.schema)
            if plan.selected_tokens and options.use_cache:
                self._blender.get()  # loads the probe here, so that a failure is the caller's
        work = SchemaPrompt(plan, loaded.layout, options.use_cache, self._prompts, self._modules, self._blender.get)
        return self._submit(work, sampling, options, t0)

    def _plan_of(self, prompt: "str | Plan", recompute) -> Plan:
        """Returns the plan of a PML prompt, or the Plan given (made by `plan`, so a caller plans once)."""
        if not isinstance(prompt, Plan):
            return self.plan(prompt, recompute=recompute)
        if recompute is not None:
            raise PromptCacheError(f"recompute={recompute!r} was given with a Plan, which has its policy already; "
                                   "give it to plan() instead")
        self._loaded(prompt.schema)  # a plan of a schema unloaded since is refused by name
        return prompt

    def _submit(self, work, sampling: SamplingParams, options: GenerationOptions, t0: float) -> "Stream":
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

        The document is computed one batch at a time, and after each batch prompts that are
        running get the context for as long as it took (Scheduler.give_way): adding a long
        document slows them down at most by half, and never stalls them for more than a batch. It is registered
        in the library only once its encoding is stored: a failed or cancelled add leaves nothing.

        Raises:
            DocumentError: no printable text, text too long for the context, a name already used for other
                text, or one that cannot name a document (pc_cpu.store.document_library.check_name).
            DocumentLimitError: a name too long, or one name or one document more than the library takes.
            AddCancelledError: `cancel` was set before the encoding finished.
        """
        new = self._documents.check_addable(text, name, system)  # before waiting for the stream: refusals come fast
        with self._locks.adding():
            return self._documents.add(new, encoding=self._default_encoding(), pace=self._paced, progress=progress,
                                       cancel=cancel)

    def remove_document(self, id_or_name: str) -> Document:
        """Returns the document it forgot, after deleting its encodings from every tier; other documents are untouched.

        Raises:
            UnknownDocumentError: nothing has this id or name.
        """
        with self._lock:
            return self._documents.remove(id_or_name)

    def list_documents(self) -> list[Document]:
        """Returns every document of the library (id, text, names, added), oldest first."""
        return self.library.all()

    @property
    def library(self) -> DocumentLibrary:
        """Returns the document library (texts and names, beside the disk tier)."""
        return self._documents.library

    def ask(self, question: str, options: GenerationOptions | None = None, *, documents: Sequence[str],
            system: str | None = None, order: str | None = None, setting: str | None = None,
            prefix: str | None = None, encoding: str | None = None, **overrides) -> Result:
        """Returns the model's answer to `question` over `documents` (ids or names), in the order given.

        The documents' cells are restored from their encodings and moved into place; only
        the question is computed. Generation options as for `generate`. use_cache=False is the
        baseline: a full prefill of the identical tokens. Result.modules lists the document ids;
        Result.tiers says which tier served each (and "#preamble" the system message's).
        recompute: which document tokens to compute again after the documents before them,
        as for `generate` ("tail:32", "10%", "relevant:1", "all", "select:10%": the 10% of the moved
        documents' tokens whose early-layer K/V deviate most; not "select:…@module"); see
        pc_cpu.pml.document_layout.with_recompute. Documents are encoded apart, and this buys back
        some of what that costs in answers at the price of computing those tokens.
        order: "given" (the default), or "relevant-first" / "relevant-last" to move the document
        most like the question to the first or last place (pc_cpu.pml.document_layout.order_documents);
        the baseline uses the same order.
        setting: "fast" or "accurate", a recompute policy, order and prefix measured on this model, by
        name (pc_cpu.document_settings, which also says what each loses); instead of recompute and
        order (a prefix given wins over the setting's).
        prefix: when the exact prefix (the system message and documents in this order, computed
        together as the baseline computes them) is computed; a question whose exact prefix is
        stored restores it, computes only the question, and answers as the baseline does:
        "background" (the default): a new combination answers from documents encoded apart, and
        its exact prefix is computed once nothing else runs (`wait_idle`), for the next question;
        "first": the first question computes it (as slow as the baseline), the next ones reuse it;
        "off": never (every question is assembled from documents encoded apart).
        encoding: what a document's cells were computed after, besides the system message:
        "library" the documents the library added before it (up to 4, their last 512 tokens;
        pc_cpu.pml.document_layout.stand_in_places), as a document in a list is computed, or
        "preamble" the system message alone. The first document of a prompt always takes the
        preamble's (where the full prefill computes it). None: the model's measured choice (its
        "fast" setting, pc_cpu.document_settings; "library" on models not measured).
        add_document computes the encodings the model's choice needs; a question asking for the
        other computes its documents' cells once, on first use, and stores them.
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
        sampling = _sampling(options)
        work = self._document_work(question, documents, system=system, order=order, setting=setting,
                                   recompute=options.recompute, prefix=prefix, encoding=encoding,
                                   use_cache=options.use_cache)
        return self._submit(work, sampling, options, t0)

    def _document_work(self, question: str, documents: Sequence[str], *, system: str | None, order: str | None,
                       setting: str | None, recompute, prefix: str | None, encoding: str | None,
                       use_cache: bool) -> DocumentWork:
        """Returns the question over `documents` as `ask` runs it, its arguments checked (see `ask`)."""
        recompute, order, prefix, encoding = self._document_setting(setting, recompute, order, prefix, encoding)
        policy = check_document_policy(parse_policy(recompute))  # refused even for the baseline
        check_prefix(prefix)  # likewise
        check_encoding(encoding)
        with self._lock:  # as every library read of the façade; tokenizing needs no lock and waits for no step
            docs = self._documents.resolve(documents)
            before = self._documents.before(docs) if encoding == "library" else None
            if policy.select and use_cache:
                self._blender.get()  # loads the probe here, so that a failure is the caller's
        return self._documents.work(question, docs, names=documents, system=system, order=order, policy=policy,
                                    use_cache=use_cache, prefix=prefix, before=before)

    def chat(self, messages: Sequence, options: GenerationOptions | None = None, *,
             documents: Sequence[str] | None = None, after_edit: str = "recompute", **overrides) -> Result:
        """Returns the model's answer to a conversation: OpenAI-style messages, the last one the user's.

        messages: dicts {"role": "system" | "developer" | "user" | "assistant", "content": str}
        (content may also be a list of {"type": "text", "text": ...} parts), oldest first. They are
        rendered by the model's own chat template (pc_cpu.pml.chat), as a full prefill of them would be.

        Each turn reuses the cells of the conversation's earlier turns, so it computes only its new
        messages: from a prompt slot that still holds them (`parallel` conversations at once), else
        from the RAM or disk tier, where each answer's turn is stored once the scheduler is idle
        (pc_cpu.engine.prompts.chat_prompt). Send the assistant's answers back as they were returned.
        Result.cached_tokens counts the reused tokens; Result.tiers["#conversation"] says where they
        came from. use_cache=False is the baseline: a full prefill of the same tokens, in the same
        decode calls; a turn whose history was stored answers token for token as it does.
        Generation options as for `generate` (recompute does not apply).

        documents: ids or names of documents (add_document), placed at the start of the first user
        message, before its text, as `ask` places them before the question. The first turn takes
        their cells as `ask` does (the exact prefix when one is stored, else the documents encoded
        apart, with the model's default encoding); a follow-up reuses that whole turn, documents,
        question and answer. Send the same documents with every turn of the conversation.

        after_edit: what a turn does when an earlier message was edited or deleted since the
        conversation's cells were kept. "recompute" (the default): the turns before the edit are
        reused and everything after it is computed again, so the answer is the full prefill's.
        "reuse": the turns after the edit are reused too, their cells moved to their new
        positions, and only the edited message and the new one are computed; faster, but those
        cells were computed after the old message, so the answer can differ from the full
        prefill's (bench/RESULTS.md, "Conversations", measures how often). Same process only: the
        turns after an edit are found through an index kept in memory.

        Raises:
            PromptError: no messages, an unknown role, a last message that is not the user's, text
                UTF-8 cannot encode, messages the chat template refuses, or an unknown after_edit.
            ContextOverflowError: the conversation and one answer token need more positions than a
                prompt holds (n_ctx); drop its oldest turns (keep the system message) or raise n_ctx.
        """
        stream = self.stream_chat(messages, GenerationOptions.of(options, overrides, method="chat"),
                                  documents=documents, after_edit=after_edit)
        for _ in stream:
            pass
        return stream.result

    def stream_chat(self, messages: Sequence, options: GenerationOptions | None = None, *,
                    documents: Sequence[str] | None = None, after_edit: str = "recompute", **overrides) -> "Stream":
        """Returns an iterator of the answer's text pieces, as `stream` does for PML prompts; see `chat`.

        Closing it early (a client that went away) keeps the turn's cells computed so far for the next turn.
        """
        t0 = time.perf_counter()
        options = GenerationOptions.of(options, overrides, method="stream_chat")
        if options.recompute is not None:
            raise PromptCacheError(f"recompute={options.recompute!r} is for schema prompts and documents; a "
                                   "conversation reuses its earlier turns as they were computed: leave it out")
        sampling = _sampling(options)
        check_after_edit(after_edit)
        checked = check_messages(messages)
        placed, before = (), None
        if documents:
            if options.use_cache:
                self._documents.check_supported()
            with self._lock:  # as every library read of the façade
                docs = self._documents.resolve(documents)
                if self._default_encoding() == "library":  # as `ask` encodes them on this model
                    before = self._documents.before(docs)
            placed = tuple((doc.id, self._documents.tokens(doc.text)) for doc in docs)
        prompt = chat_prompt(checked, self.chat_template, self.model, documents=placed)
        if prompt.documents is not None and before is not None:
            prompt = dataclasses.replace(prompt, documents=self._documents.after_stand_ins(prompt.documents, before))
        if prompt.end + 1 > self._prompts.n_ctx:
            raise ContextOverflowError(
                f"the conversation is {prompt.end:,} tokens and a prompt holds {self._prompts.n_ctx:,} with its "
                "answer: drop its oldest turns (keep the system message), or raise n_ctx")

        def answered(text: str) -> ChatPrompt | None:
            try:
                return chat_prompt(checked + (ChatMessage("assistant", text),), self.chat_template, self.model,
                                   documents=placed, add_generation_prompt=False)
            except PromptCacheError:
                return None

        document_work = None
        if prompt.documents is not None:
            document_work = DocumentWork(prompt.documents, self._documents.encoder, options.use_cache, "background")
        work = ChatWork(prompt, self._conversations, answered, options.use_cache, document_work, after_edit)
        return self._submit(work, sampling, options, t0)

    def chat_prompt(self, messages: Sequence, *, add_generation_prompt: bool = True) -> ChatPrompt:
        """Returns a conversation's tokens and decode calls as `chat` lays them out (pc_cpu.pml.chat); computes nothing.

        add_generation_prompt=False lays out a finished conversation (its last message may be the
        assistant's): where a next turn finds each answer's tokens (ChatPrompt.answers).
        """
        checked = check_messages(messages, finished=not add_generation_prompt)
        return chat_prompt(checked, self.chat_template, self.model, add_generation_prompt=add_generation_prompt)

    def _document_setting(self, setting: str | None, recompute, order: str | None, prefix: str | None,
                          encoding: str | None = None) -> tuple:
        """Returns the (recompute, order, prefix, encoding) `ask` uses: the named setting's for this model, else the ones given.

        A prefix or encoding given wins over the setting's (a benchmark measuring the setting on
        documents encoded apart gives prefix "off"). Without a setting, the encoding is the one
        measured best on this model (its "fast" setting's).
        """
        if setting is None:
            encoding = encoding or self._default_encoding()
            return recompute, order or "given", prefix or "background", encoding
        if recompute is not None or order is not None:
            raise PromptCacheError(f"setting={setting!r} chooses recompute and order itself; give either setting "
                                   "or recompute/order, not both")
        chosen = document_settings.setting(self.model.path.name, setting)
        return chosen.recompute, chosen.order, prefix or chosen.prefix, encoding or chosen.encoding

    def _default_encoding(self) -> str:
        """Returns the encoding questions over documents take on this model unless told otherwise (its "fast" setting's)."""
        return document_settings.settings_for(self.model.path.name).fast.encoding

    def document_prompt(self, question: str, texts: Sequence[str], *, system: str | None = None,
                        names: Sequence[str] | None = None, order: str = "given") -> DocumentPrompt:
        """Returns the layout of `question` over documents of these texts, as `ask` lays it out; encodes nothing.

        It only tokenizes (once per text: `add_document` and `ask` reuse the tokens), so a caller
        can refuse a question that cannot fit before spending minutes encoding its documents.
        `ask` runs the same check on the documents it is given.

        Args:
            question: the question; it needs a printable character (pc_cpu.pml.document_layout.has_text).
            texts: the documents' texts, in the order the prompt places them.
            system: the system message, or None.
            names: one name per text for the error message (default: the documents' ids).
            order: "given", "relevant-first" or "relevant-last" (pc_cpu.pml.document_layout.order_documents).

        Raises:
            PromptCacheError: an empty question.
            ContextOverflowError: the prompt and one answer token need more positions than a prompt holds (n_ctx).
        """
        return self._documents.prompt(question, texts, system=system, names=names, order=order)

    def document_tokens(self, text: str) -> tuple[int, ...]:
        """Returns the tokens a document's text contributes to a prompt, tokenized once per text."""
        return self._documents.tokens(text)

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
        contexts = (self._ctx, self._prompts)
        kv = sum(c.buffers.kv for c in contexts)
        streams = 1 + self._prompts.n_stream
        kv_cell = kv // (streams * self._ctx.n_ctx)
        ram = next((tier.budget_bytes for tier in self.store.tiers if isinstance(tier, RamStore)), 0)
        return MemoryUse(weights=self.model.path.stat().st_size, kv=kv,
                         compute=sum(c.buffers.compute + c.buffers.output for c in contexts),
                         state_buffers=STATE_BUFFERS * kv_cell * self._ctx.n_ctx, ram_tier=ram, kv_cell=kv_cell,
                         streams=streams)

    def stats(self) -> CacheStats:
        """Returns what this cache holds now: each byte tier's bytes and entries, resident cells, documents, tips, queues.

        Cheap (every count is kept current by its owner), so a long-running host can poll it.
        """
        tiers = tuple(TierStats(tier.name, tier.bytes_used, tier.budget_bytes, len(tier)) for tier in self.store.tiers)
        return CacheStats(tiers=tiers, resident_cells=self._resident.cells, library_cells=self._ctx.n_ctx,
                          schemas=len(self.schemas.names), documents=len(self._documents.library),
                          conversation_tips=len(self._conversations.tips), queues=self._scheduler.queue_stats())

    @property
    def modules_encoded(self) -> int:
        """Returns how many schema encodings (modules, scaffolds) this instance computed; a store hit is not one."""
        return self._modules.encoded

    @property
    def documents_encoded(self) -> int:
        """Returns how many preambles and documents this instance computed (a warm store keeps it at 0)."""
        return self._documents.encoded

    def prepare(self, plan: Plan, *, use_cache: bool, reserve: int = 1) -> dict[str, str]:
        """Makes the plan's encodings resident with room for the prompt; returns the tier that served each.

        For tests and tools that drive one prompt by hand (with `prefill`) while nothing else runs.
        """
        with self._lock:
            loaded = self._loaded(plan.schema)
            new_cells = plan.uncached_tokens + plan.selected_tokens if use_cache else 0
            keys = plan.encodings if use_cache else ()
            return self._modules.ensure(loaded.layout, keys, reserve=new_cells + reserve)

    def prefill(self, plan: Plan, *, use_cache: bool) -> int:
        """Builds the prompt's KV cache in stream PROMPT_SEQ of `prompts`; returns the position generation continues at.

        For tests and tools, while nothing else runs; makes the plan's encodings resident
        first. `prompts.logits()` then gives the last token's logits.
        """
        with self._lock:
            self._scheduler.drop_held()  # stream PROMPT_SEQ is about to be overwritten
            self.prepare(plan, use_cache=use_cache)
            work = SchemaPrompt(plan, self._loaded(plan.schema).layout, use_cache, self._prompts, self._modules,
                                self._blender.get)
            return work.prefill(PROMPT_SEQ)

    def prefilled(self, plan: Plan, *, use_cache: bool) -> "PrefilledPrompt":
        """Returns the prompt's cells built as `generate` builds them (see `prefill`), to read and then close.

        For tests and tools: `with cache.prefilled(plan, use_cache=True) as prompt: prompt.logits()`.
        """
        return PrefilledPrompt(self.prefill(plan, use_cache=use_cache), self._prompts, self._lock)

    def full_prefill(self, tokens: Sequence[int], *, batch_starts: Sequence[int] = ()) -> "PrefilledPrompt":
        """Returns `tokens` computed at positions 0..n-1 of stream PROMPT_SEQ, to read and then close.

        The baseline a cached prompt is held to, computed where prompts are (an empty stream of
        the prompt context). `batch_starts`: token indices where a new llama_decode batch
        starts, as a cached prompt's runs did (some models' kernels round by batch); otherwise
        llama.cpp's own batches. For tests and tools, while nothing else runs.
        """
        tokens = list(tokens)
        if not tokens:
            raise PromptCacheError("full_prefill: no tokens given; pass the prompt's token ids")
        wrong = [s for s in batch_starts if not 0 <= s < len(tokens)]
        if wrong:
            raise PromptCacheError(f"full_prefill: batch starts {wrong} lie outside the {len(tokens)} tokens; "
                                   f"give token indices in 0..{len(tokens) - 1}")
        with self._lock:
            self._scheduler.drop_held()  # stream PROMPT_SEQ is about to be overwritten
            end = full_prefill(self._prompts, tokens, PROMPT_SEQ, batch_starts)
        return PrefilledPrompt(end, self._prompts, self._lock)

    def prefilled_ask(self, question: str, *, documents: Sequence[str], system: str | None = None,
                      recompute: "str | float | RecomputePolicy | None" = None, order: str | None = None,
                      encoding: str | None = None, prefix: str = "off", use_cache: bool = True) -> "PrefilledPrompt":
        """Returns the question's cells built as `ask` builds them, to read and then close.

        The arguments are `ask`'s; `prefix` defaults to "off" (documents encoded apart and moved,
        the path a new combination takes), and a stored exact prefix is used only if asked for.
        For tests and tools, while nothing else runs: `with cache.prefilled_ask(q, documents=ids) as p: p.logits()`.
        """
        work = self._document_work(question, documents, system=system, order=order, setting=None,
                                   recompute=recompute, prefix=prefix, encoding=encoding, use_cache=use_cache)
        with self._lock:
            self._scheduler.drop_held()  # stream PROMPT_SEQ is about to be overwritten
            work.prepare()
            end = work.prefill(PROMPT_SEQ)
            selected = self._documents.encoder.last_selected if work.prompt.select else ()
        return PrefilledPrompt(end, self._prompts, self._lock, selected=selected)

    def document_cells(self, document: str, *, system: str | None = None) -> bytes:
        """Returns a document's cells as computed after the system message alone (its home), as a state blob.

        `document`: an id or name of the library. The cells come from the tiers, or are computed
        (and stored) if no tier holds them: the bytes a prompt placing the document first restores.
        """
        with self._lock:
            (doc,) = self._documents.resolve([document])
            preamble = preamble_tokens(system, self.model, self.markup)
            blob, _ = self._documents.encoder.document_blob(preamble, doc.id, self._documents.tokens(doc.text))
            return blob

    def encoding_cells(self, schema: str, encoding: str) -> bytes:
        """Returns the resident cells of a schema's encoding (a module, or scaffold_key(name)), at its layout positions.

        One state blob of the library context. Raises PromptCacheError when the encoding is not
        resident (load the schema, or generate a prompt importing it, first).
        """
        with self._lock:
            layout = self._loaded(schema).layout
            seq = self._modules.sequence_of(layout, encoding)
            if seq is None:
                raise PromptCacheError(f"encoding {encoding!r} of schema {schema!r} is not resident; load the schema "
                                       "with encode=True or generate a prompt that imports it first")
            return self._modules.resident_cells(layout, encoding, seq)

    @property
    def engine(self) -> EngineParts:
        """Returns the engine's parts, for tests and benchmarks of the machinery itself; see EngineParts."""
        return EngineParts(self._ctx, self._prompts, self._roles, self._modules, self._documents)

    @property
    def blender(self) -> Blender | None:
        """Returns the selector of `select:` recomputation once a prompt has loaded it, else None (tests, tools)."""
        return self._blender.loaded

    @property
    def scheduler(self) -> Scheduler:
        """Returns the scheduler that runs every prompt (its stats, active count), for tests and tools."""
        return self._scheduler

    @property
    def lock(self) -> FairLock:
        """Returns the lock every call into the contexts holds, in arrival order; hold it to drive them by hand."""
        return self._lock

    def _load_attached_schema(self, prompt_pml) -> None:
        # Prompts made by pc_cpu.pml.compiler carry their schema; load it on first use.
        self.schemas.load_attached(prompt_pml)


def _open_contexts(model: Model, roles: SequenceRoles,
                   config_of: Callable[[Model], ContextConfig]) -> tuple[Model, Context, Context]:
    """Returns the model, its library context and its prompt context; on failure closes what it opened.

    The prompt context has a stream per prompt slot, then the encoders' workspace, then the one
    add_document computes in, batch by batch between the scheduler's steps (SequenceRoles).
    """
    try:
        config = config_of(model)
        _check_training_context(config.n_ctx, model)
        ctx = Context(model, config)
    except Exception:
        model.close()
        raise
    try:
        return model, ctx, open_prompt_streams(ctx, roles.prompt_streams)
    except Exception:
        ctx.close()
        model.close()
        raise


def _check_training_context(n_ctx: int, model: Model) -> None:
    """Raises ContextBeyondTrainingError when n_ctx exceeds the positions the model was trained on (0: unknown).

    n_ctx is also the positions of one prompt, and past its training context a model answers
    nonsense (llama.cpp only logs a warning): refused here, before any cell is allocated.
    """
    trained = model.info.n_ctx_train
    if trained and n_ctx > trained:
        raise ContextBeyondTrainingError(
            f"n_ctx={n_ctx:,} is more than the {trained:,} positions model {model.path.name!r} was trained on, "
            f"and its answers past them are meaningless; use n_ctx={trained} or less (--n-ctx {trained} on the "
            "command line), or a model trained on a longer context (pc-cpu models)")


def _sampling(options: GenerationOptions) -> SamplingParams:
    """Returns the sampler's parameters of `options`, checked before the prompt is queued."""
    sampling = SamplingParams(temperature=options.temperature, top_k=options.top_k, top_p=options.top_p,
                              seed=options.seed)
    sampling.validate()
    return sampling


def _cache_ropes(model: Model) -> tuple[RopeParams, ...] | None:
    """Returns the RoPE of each KV cache in a saved state (moved cells are relocated with them), or None.

    None, for a RoPE the relocator does not know (pc_cpu.kvstate.rope.RopeMode) or a
    sliding-window architecture whose second base was not checked: cells are moved with
    llama.cpp's seq_add instead (pc_cpu.engine.prompts.document_cells, pc_cpu.engine.cells.relocate.copy_moved).
    """
    try:
        return model.cache_ropes()
    except ValueError:
        return None


def _open_store(store, *, ram_bytes: int, disk_bytes: int) -> TieredStore:
    """Returns the byte tiers: RAM (unless its budget is 0), then disk unless `store` is False."""
    if ram_bytes == 0 and store is False:
        raise PromptCacheError("ram_bytes=0 with store=False leaves nowhere to keep encoded cells; give the RAM "
                               "tier a budget or keep the disk store")
    tiers = [RamStore(ram_bytes)] if ram_bytes else []
    if store is not False:
        directory = default_store_dir() if store in (None, True) else Path(store).expanduser()
        disk = DiskStore(directory, budget_bytes=disk_bytes)
        disk.check_writable()
        tiers.append(disk)
    return TieredStore(tiers)


class PrefilledPrompt:
    """A prompt's cells in stream PROMPT_SEQ, built by hand (PromptCache.prefilled): what can be read of them.

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


class Stream:
    """Iterates over a prompt's generated text pieces; `.result` holds the Result once it ends."""

    def __init__(self, request: Request):
        self._request = request
        self.result: Result | None = None
        self._done = False

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        if self._done:
            raise StopIteration
        event = self._request.events.get()
        if isinstance(event, Text):
            return event.text
        self._done = True
        if isinstance(event, Failed):
            raise event.error
        self.result = event.result
        raise StopIteration

    def close(self) -> None:
        """Cancels the prompt if it is still running (its slot and cells are freed)."""
        if not self._done:
            self._request.cancelled.set()
            self._done = True

    def __del__(self) -> None:
        self.close()
