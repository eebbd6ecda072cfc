"""Byte tiers that keep computed cells: RAM, then disk (tiers), keyed by content (keys); the document library.

A tier stores opaque entries (entry) under a StoreKey; what the bytes mean is the engine's
(pc_cpu.engine.cells.cell_store). The disk tier's files are written atomically and locked
(atomic, file_lock) so processes can share one store.
May import: pc_cpu.errors, pc_cpu.kvstate (to size entries), pc_cpu.pml (where stand-ins sit); never the engine.
"""
