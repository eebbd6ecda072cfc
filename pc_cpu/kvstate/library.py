"""Finds libpc_native, the compiled C library: the one place that knows where it is installed.

Kept apart from the binding (pc_cpu.kvstate.native, which loads numpy) so the CLI's crash guard
(pc_cpu.crash_guard) can find the library without loading numpy before a command runs.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

LIBRARY_NAMES = ("libpc_native.so", "libpc_native.dylib", "pc_native.dll")


def library_path() -> Path | None:
    """Returns the built library: next to the package, else in the installed pc_cpu distribution.

    The second place matters when tests run from a source checkout: `import pc_cpu` then finds
    the source tree (no compiled library in it) while `pip install .` put the library in
    site-packages.
    """
    package_dir = Path(__file__).resolve().parent.parent
    here = next((package_dir / n for n in LIBRARY_NAMES if (package_dir / n).is_file()), None)
    return here or _installed_library()


def _installed_library() -> Path | None:
    try:
        files = importlib.metadata.distribution("pc_cpu").files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in files:
        if file.name in LIBRARY_NAMES:
            path = Path(file.locate()).resolve()
            if path.is_file():
                return path
    return None
