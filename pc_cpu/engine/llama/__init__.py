"""llama.cpp, wrapped: the model, a context and its calls, sequence roles, the sampler and its grammars, the CPU checks.

One owner per llama.cpp object (a Model owns llama_model*, a Context its llama_context*), every
argument checked before it reaches C, where a wrong position or sequence id aborts the process.
May import: pc_cpu.errors, pc_cpu.kvstate, pc_cpu.crash_guard, pc_cpu.store.disk (the cache dir); no other engine room.
"""
