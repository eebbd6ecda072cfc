"""Opens what a PromptCache runs on: the model's two llama.cpp contexts, the byte tiers and library, the RoPE of saved cells.

Each opener closes what it opened when a later step fails, so a refused configuration leaks no
model or context.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

from pc_cpu.engine.cells.streams import open_prompt_streams
from pc_cpu.engine.llama.context import Context, ContextConfig
from pc_cpu.engine.llama.model import Model
from pc_cpu.engine.llama.sequences import SequenceRoles
from pc_cpu.errors import ConfigError, ContextBeyondTrainingError, PromptCacheError, StoreUnavailableError
from pc_cpu.kvstate.rope import RopeParams
from pc_cpu.store.disk import DiskStore, default_store_dir
from pc_cpu.store.document_library import DocumentLibrary, library_directory
from pc_cpu.store.ram import RamStore
from pc_cpu.store.remote import DEFAULT_REMOTE_BYTES, RemoteStore
from pc_cpu.store.tiers import TieredStore

log = logging.getLogger(__name__)


def open_contexts(model: Model, roles: SequenceRoles,
                   config_of: Callable[[Model], ContextConfig]) -> tuple[Model, Context, Context]:
    """Returns the model, its library context and its prompt context; on failure closes what it opened.

    The prompt context has a stream per prompt slot, then the encoders' workspace, then the one
    add_document computes in, batch by batch between the scheduler's steps (SequenceRoles).
    """
    try:
        config = config_of(model)
        check_training_context(config.n_ctx, model)
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


def check_training_context(n_ctx: int, model: Model) -> None:
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


def cache_ropes(model: Model) -> tuple[RopeParams, ...] | None:
    """Returns the RoPE of each KV cache in a saved state (moved cells are relocated with them), or None.

    None, for a RoPE the relocator does not know (pc_cpu.kvstate.rope.RopeMode) or a
    sliding-window architecture whose second base was not checked: cells are moved with
    llama.cpp's seq_add instead (pc_cpu.engine.prompts.document_cells, pc_cpu.engine.cells.relocate.copy_moved).
    """
    try:
        return model.cache_ropes()
    except ValueError:
        return None


STORE_FALLBACKS = (None, "local")


def open_store(store, *, ram_bytes: int, disk_bytes: int, remote: str | None = None,
               remote_bytes: int = DEFAULT_REMOTE_BYTES, fallback: str | None = None) -> TieredStore:
    """Returns the byte tiers: RAM (unless its budget is 0), then disk unless `store` is False, then `remote` if given.

    Args:
        remote: the URL of a shared Redis (pc_cpu.store.remote); it must answer now, unless
            `fallback` is "local": then a warning, and the local tiers serve until it does.

    Raises:
        StoreUnavailableError: `remote` does not answer (without fallback="local").
    """
    if fallback not in STORE_FALLBACKS:
        raise ConfigError(f"store_fallback={fallback!r}: give None (a shared store that is down at start is an error) "
                          "or \"local\" (serve from the local tiers until it is back)")
    if ram_bytes == 0 and store is False and remote is None:
        raise PromptCacheError("ram_bytes=0 with store=False leaves nowhere to keep encoded cells; give the RAM "
                               "tier a budget or keep the disk store")
    tiers: list = [RamStore(ram_bytes)] if ram_bytes else []
    if store is not False:
        directory = default_store_dir() if store in (None, True) else Path(store).expanduser()
        disk = DiskStore(directory, budget_bytes=disk_bytes)
        disk.check_writable()
        tiers.append(disk)
    if remote is not None:
        tiers.append(open_remote(remote, budget_bytes=remote_bytes, fallback=fallback))
    return TieredStore(tiers)


def open_remote(url: str, *, budget_bytes: int, fallback: str | None) -> RemoteStore:
    """Returns the shared Redis tier at `url`, checked to answer (or, with fallback "local", down until it does)."""
    remote = RemoteStore(url, budget_bytes=budget_bytes)
    try:
        remote.check_reachable()
    except StoreUnavailableError as exc:
        if fallback != "local":
            remote.close()
            raise
        log.warning("%s; serving from the local tiers (store_fallback=\"local\") and trying it again", exc)
        remote.start_down(exc)
    return remote


def open_library(store: TieredStore, *, max_documents: int) -> DocumentLibrary:
    """Returns the document library where the store keeps it: in the shared Redis, beside the disk tier, or in memory."""
    remote = next((tier for tier in store.tiers if isinstance(tier, RemoteStore)), None)
    if remote is not None:
        return DocumentLibrary(max_documents=max_documents, shelf=remote.library_shelf())
    disk = next((tier for tier in store.tiers if isinstance(tier, DiskStore)), None)
    return DocumentLibrary(library_directory(disk) if disk is not None else None, max_documents=max_documents)
