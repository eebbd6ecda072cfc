"""The C library is built and loadable wherever pc_cpu is installed (so CI tests the C path, not only numpy)."""

from __future__ import annotations

import importlib.metadata

import pytest

from pc_cpu.store import native


def test_installed_package_ships_a_loadable_native_library():
    try:
        importlib.metadata.distribution("pc_cpu")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("pc_cpu is not installed (source tree only): nothing built to check")
    assert native.library_path() is not None, "pip install built no libpc_native: check CMakeLists.txt"
    assert native.available()
