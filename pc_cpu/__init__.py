"""pc_cpu: Prompt Cache (modular attention reuse) on llama.cpp, for CPUs."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from pc_cpu.errors import PromptCacheError

if TYPE_CHECKING:
    from pc_cpu.cache import PromptCache
    from pc_cpu.options import GenerationOptions
    from pc_cpu.pml.compiler import prompt_program
    from pc_cpu.progress import EncodeProgress
    from pc_cpu.result import Result

__all__ = ["EncodeProgress", "GenerationOptions", "PromptCache", "PromptCacheError", "Result", "prompt_program"]
__version__ = "0.1.0"

# Imported on first use: `pc_cpu.cache` loads llama.cpp and numpy (about a second), which `import
# pc_cpu.cli` and `pc-cpu --help` do not need.
_LAZY = {"PromptCache": "pc_cpu.cache", "GenerationOptions": "pc_cpu.options", "prompt_program": "pc_cpu.pml.compiler",
         "EncodeProgress": "pc_cpu.progress", "Result": "pc_cpu.result"}


def __getattr__(name: str):
    """Returns a public name of `_LAZY`, importing its module the first time (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'pc_cpu' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
