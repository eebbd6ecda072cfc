"""Running prompts: the scheduler (continuous batching over prompt slots), the PromptWork it runs, the locks.

The scheduler knows prompts only through PromptWork (prompt_work), so it imports no prompt kind.
May import: engine.llama, pc_cpu.result, pc_cpu.stats, pc_cpu.errors.
"""
