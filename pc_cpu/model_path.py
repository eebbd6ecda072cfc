"""Gives the path of the GGUF model to load, without touching the network.

`model` is a path to a .gguf file or a model name of pc_cpu.models (e.g. "qwen2.5-coder-0.5b").
Order: the argument, then $PC_CPU_MODEL, then the default model (SmolLM2-135M, the `model` extra).
"""

from __future__ import annotations

import os
from pathlib import Path

from pc_cpu.errors import ModelError
from pc_cpu.model_files import model_file
from pc_cpu.models import DEFAULT_MODEL, MODELS, install_hint, missing_packages

ENV_VAR = "PC_CPU_MODEL"


def resolve_model_path(model: str | os.PathLike | None = None) -> Path:
    """Returns the model file to load, from a path or a model name.

    Raises:
        ModelError: no such file or name, a named model is not installed (names its extra) or fails
            its hash check, or nothing was given and the default is not installed.
    """
    if model:
        return _resolve(str(model), "model")
    env = os.environ.get(ENV_VAR)
    if env:
        return _resolve(env, f"${ENV_VAR}")
    default = MODELS[DEFAULT_MODEL]
    if missing_packages(default):
        raise ModelError(f"no model given and the default ({DEFAULT_MODEL}) is not installed: "
                         f"{install_hint(default)}; or pass --model NAME or a path to a GGUF file")
    return model_file(default)


def _resolve(value: str, source: str) -> Path:
    if value in MODELS:
        return model_file(MODELS[value])
    path = Path(value).expanduser()
    if not path.is_file() and (os.sep in value or value.endswith(".gguf")):
        raise ModelError(f"{source}: model file {value!r} does not exist; pass the path of a .gguf file or a "
                         f"model name ({', '.join(MODELS)})")
    if not path.is_file():
        raise ModelError(f"{source} {value!r} is neither a model name ({', '.join(MODELS)}) nor an existing "
                         f"file; pass one of those names or the path of a .gguf file")
    return path
