"""pc_cpu: Prompt Cache (modular attention reuse) on llama.cpp, for CPUs."""

from pc_cpu.cache import PromptCache
from pc_cpu.errors import PromptCacheError
from pc_cpu.pml.compiler import prompt_program
from pc_cpu.progress import EncodeProgress
from pc_cpu.result import Result

__all__ = ["EncodeProgress", "PromptCache", "PromptCacheError", "Result", "prompt_program"]
__version__ = "0.1.0"
