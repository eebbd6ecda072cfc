"""The Python-to-PML compiler's public face: `@pc_cpu.prompt_program` (see pc_cpu.pml.compiler)."""

from pc_cpu.pml.compiler import CompiledPrompt, PromptProgram, prompt_program

__all__ = ["CompiledPrompt", "PromptProgram", "prompt_program"]
