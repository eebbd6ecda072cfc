"""Gives a PromptCache its schemas: each loaded schema's layout, and the encoding of its modules as it loads.

Encoding a long schema takes seconds to minutes, while prompts may be running: each
encoding is computed batch by batch in add_document's stream when it is free, and after
each batch the running prompts get the context for as long as the batch took
(Scheduler.give_way), so loading a schema never stalls them.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from pc_cpu.engine.cells.encoder import Workspace
from pc_cpu.engine.llama.model import Model
from pc_cpu.engine.prompts.schema_cells import ModuleCache
from pc_cpu.engine.runtime.scheduler import Scheduler
from pc_cpu.engine.runtime.locks import ContextLocks
from pc_cpu.errors import CancelledError, ContextOverflowError, PromptCacheError, UnknownSchemaError
from pc_cpu.pml.encoding import check_scaffolds, encode_cells, encoding_keys, encoding_runs
from pc_cpu.pml.fold import fold_layout
from pc_cpu.pml.layout import ROOT, Layout, build_layout
from pc_cpu.pml.roles import RoleMarkup
from pc_cpu.pml.schema import Schema, parse_schema
from pc_cpu.progress import ProgressCallback, ProgressTracker, check_cancel, paced


@dataclass(frozen=True)
class LoadedSchema:
    schema: Schema
    layout: Layout


class Schemas:
    """The schemas one PromptCache has loaded, by name, and how their modules get encoded."""

    def __init__(self, model: Model, markup: RoleMarkup, modules: ModuleCache, scheduler: Scheduler,
                 locks: ContextLocks, *, mode: str, n_ctx: int, adder: Workspace | None):
        self.model = model
        self.markup = markup
        self.modules = modules
        self.mode = mode  # how modules are encoded (pc_cpu.pml.encoding)
        self.n_ctx = n_ctx
        self._scheduler = scheduler
        self._locks = locks  # the PromptCache's
        self._lock = locks.context  # one thread at a time calls into the context
        self._adder = adder  # the stream encodings are computed in between prompts' steps; None: in `ensure`
        self._loaded: dict[str, LoadedSchema] = {}

    @property
    def names(self) -> list[str]:
        """Returns the names of the loaded schemas, in the order they were loaded."""
        return list(self._loaded)

    @property
    def encoded(self) -> int:
        """Returns how many schema encodings (modules, scaffolds) this cache computed; a store hit is not one."""
        return self.modules.encoded

    @property
    def resident_cells(self) -> int:
        """Returns the KV cells the library context holds for encoded modules."""
        return self.modules.resident.cells

    def layout(self, name: str) -> Layout:
        """Returns the layout of a loaded schema."""
        return self.get(name).layout

    def inspect(self, pml: str) -> Layout:
        """Returns the layout of a schema without loading or encoding it."""
        return self.layout_of(parse_schema(pml))

    def cells(self, schema: str, encoding: str) -> bytes:
        """Returns the resident cells of a schema's encoding (a module, or scaffold_key(name)), at its layout positions.

        One state blob of the library context. Raises PromptCacheError when the encoding is not
        resident (load the schema, or generate a prompt importing it, first).
        """
        with self._lock:
            layout = self.get(schema).layout
            seq = self.modules.sequence_of(layout, encoding)
            if seq is None:
                raise PromptCacheError(f"encoding {encoding!r} of schema {schema!r} is not resident; load the schema "
                                       "with encode=True or generate a prompt that imports it first")
            return self.modules.resident_cells(layout, encoding, seq)

    def get(self, name: str) -> LoadedSchema:
        """Returns a loaded schema and its layout.

        Raises:
            UnknownSchemaError: no schema of that name is loaded.
        """
        try:
            return self._loaded[name]
        except KeyError:
            known = ", ".join(self._loaded) or "none"
            raise UnknownSchemaError(f"schema {name!r} is not loaded (loaded: {known}); load it first") from None

    def layout_of(self, schema: Schema) -> Layout:
        """Returns the schema's layout, folded when it spans more positions than a prompt holds (pc_cpu.pml.fold)."""
        limit = min(self.n_ctx, self.model.info.n_ctx_train or self.n_ctx)
        return fold_layout(build_layout(schema, self.model, self.markup), limit)

    def load(self, pml: str, *, encode: bool, progress: ProgressCallback | None,
             cancel: threading.Event | None) -> Schema:
        """Returns the parsed schema after laying it out and (when `encode`) encoding its modules (see PromptCache)."""
        schema = parse_schema(pml)
        with self._lock:
            loaded = self._loaded.get(schema.name)
            if loaded is None or loaded.schema.source != schema.source:
                if loaded is not None:
                    self.unload(schema.name)
                layout = self.layout_of(schema)
                check_scaffolds(layout)
                self._check_fits(layout)
                loaded = LoadedSchema(schema, layout)
                self._loaded[schema.name] = loaded
            if encode:
                try:
                    self._encode(loaded, progress, cancel)
                except CancelledError:
                    if self._loaded.get(schema.name) is loaded:
                        self.unload(schema.name)
                    raise
        return loaded.schema

    def load_attached(self, prompt_pml) -> None:
        """Loads the schema a compiled prompt carries (pc_cpu.pml.compiler), unless it is loaded already."""
        schema_pml = getattr(prompt_pml, "schema_pml", None)
        if schema_pml:
            name = parse_schema(schema_pml).name
            if name not in self._loaded or self._loaded[name].schema.source != schema_pml:
                self.load(schema_pml, encode=True, progress=None, cancel=None)

    def unload(self, name: str) -> None:
        """Drops a schema and frees its modules' cells (the streams idle slots keep hold them too)."""
        with self._lock:
            self.get(name)
            self._scheduler.drop_held()
            self.modules.evict(name)
            del self._loaded[name]

    def _encode(self, loaded: LoadedSchema, progress: ProgressCallback | None,
                cancel: threading.Event | None) -> None:
        """Makes every encoding of a loaded schema resident (and stored), one at a time, reporting progress."""
        layout = loaded.layout
        keys = encoding_keys(layout, self.mode)
        tracker = ProgressTracker(layout.schema, {key: sum(len(run.tokens) for run in encoding_runs(
            layout, key, self.mode)) for key in keys}, progress)
        # One encoding at a time: a schema larger than the context evicts its own earlier
        # modules from the context; they stay in the byte tiers. After each, running prompts get
        # the context for as long as it took (Scheduler.give_way), so a long schema does not stall them.
        for key in keys:
            started = time.perf_counter()
            check_cancel(cancel, f"loading schema {layout.schema!r}", "its caller went away")
            if self._loaded.get(layout.schema) is not loaded:
                return  # unloaded or replaced meanwhile: its encodings are no longer wanted
            self._precompute(layout, key, tracker, cancel)
            if self._loaded.get(layout.schema) is not loaded:
                return  # unloaded or replaced while prompts ran in between
            self.modules.ensure(layout, [key], on_computed=tracker.computed)
            tracker.finished(key)
            self._scheduler.give_way(time.perf_counter() - started)
        if not keys and progress is not None:
            progress(tracker.last)  # nothing to encode: one event, already finished

    def _precompute(self, layout: Layout, key: str, tracker: ProgressTracker,
                    cancel: threading.Event | None) -> None:
        """Computes encoding `key` into the store batch by batch, running prompts decoding in between.

        In add_document's stream, when it is free (never waiting for it while holding the
        context lock: an add holds the stream and waits for the lock). Otherwise, and for
        encodings ModuleCache.precompute leaves to `ensure`, `ensure` computes it in one go.
        """
        if self._adder is None:
            return
        with self._locks.adder_if_free() as taken:
            if not taken:
                return

            def report(n: int) -> None:
                tracker.computed(key, n)
                check_cancel(cancel, f"loading schema {layout.schema!r}", "its caller went away")

            self.modules.precompute(layout, key, self._adder, on_computed=paced(report, self._scheduler.give_way))

    def _check_fits(self, layout: Layout) -> None:
        """Raises ContextOverflowError when a module, or the cells computing one takes, do not fit the context."""
        # Folded or not, every module must lie inside the context (ROOT's closing text is the prompt's).
        last = max((m.end for name, m in layout.modules.items() if name != ROOT), default=layout.preamble_end)
        if last > self.n_ctx:
            raise ContextOverflowError(f"schema {layout.schema!r} has a module that ends at position {last} (after "
                                       f"the preamble) but the context has {self.n_ctx}; raise n_ctx or split "
                                       "the module")
        needed = max((encode_cells(layout, key, self.mode) for key in encoding_keys(layout, self.mode)), default=0)
        if needed > self.n_ctx:
            raise ContextOverflowError(
                f"schema {layout.schema!r} has an encoding that needs {needed} KV cells to compute, but the "
                f"context has {self.n_ctx}; raise n_ctx or split the module")
