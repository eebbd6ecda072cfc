"""The engine: the only code that calls llama.cpp (through llama-cpp-python), in five rooms by job.

    llama/      wrappers of llama.cpp: the model, a context, sequence roles, the sampler, grammars, the CPU checks
    cells/      saved cells: computing segments, storing them in the byte tiers, moving them, assembling
    recompute/  computing cached tokens again: CacheBlend-style selection, the probe, the one-pass recompute
    prompts/    the three prompt kinds as the scheduler runs them: schema prompts, questions over
                documents, conversations, each with the cells it keeps
    runtime/    the scheduler (continuous batching over prompt slots), the work it asks of a prompt, the locks

Imports run one way, down this list read bottom-up: llama/ imports no other room; cells/ imports
llama/; recompute/ imports cells/ and llama/; runtime/ imports llama/; prompts/ imports them all.
Nothing here imports pc_cpu's façade (cache, schemas, documents, conversations) or the server.
"""
