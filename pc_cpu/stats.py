"""Gives CacheStats: what a PromptCache holds at one moment, for hosts that run for days (pc-cpu serve's /v1/stats).

Every count here is kept current by its owner (the tiers' byte totals on put and remove, the
scheduler's queues, the tip index), so reading them costs nothing and never walks a store.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class TierStats:
    """One byte tier: how full it is."""

    name: str  # "ram" or "disk"
    bytes_used: int  # payload bytes held
    budget_bytes: int  # the tier never holds more; least recently used entries leave first
    entries: int


@dataclass(frozen=True)
class QueueStats:
    """The scheduler's prompts and background work."""

    active: int  # prompts generating
    waiting: int  # prompts queued for a free slot
    held_streams: int  # free slots whose stream is kept for the next prompt with the same head
    idle_tasks: int  # background work waiting for idle time (exact prefixes, conversation repairs), at most 4


@dataclass(frozen=True)
class CacheStats:
    """What a PromptCache holds now (PromptCache.stats)."""

    tiers: tuple[TierStats, ...]  # fastest first
    resident_cells: int  # library KV cells held by schema encodings
    library_cells: int  # the library context's cells (n_ctx)
    schemas: int  # loaded schemas
    documents: int  # documents in the library
    conversation_tips: int  # conversations' tips this process indexes (at most TipIndex.MAX_TIPS)
    queues: QueueStats

    def to_dict(self) -> dict:
        """Returns the stats as plain JSON-ready values; tiers by name."""
        data = asdict(self)
        data["tiers"] = {tier.name: {k: v for k, v in asdict(tier).items() if k != "name"} for tier in self.tiers}
        return data
