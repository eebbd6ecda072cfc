"""Saved cells: computing a segment's cells, storing them in the byte tiers, moving them, assembling a prompt.

Every move of saved cells to other positions goes through relocate.move; every save to and read
from a tier goes through cell_store.CellStore, which checks what it reads.
May import: engine.llama, pc_cpu.pml (segments, plans), pc_cpu.kvstate, pc_cpu.store, pc_cpu.result.
"""
