"""Computing cached tokens again: CacheBlend-style selection (blend), the early-layer probe, the one-pass recompute.

Cached cells were computed apart from what now precedes them; these buy back accuracy by
computing some of their tokens again after it.
May import: engine.cells, engine.llama, pc_cpu.pml, pc_cpu.kvstate.
"""
