"""The C library is built and loadable wherever pc_cpu is installed (so CI tests the C path, not only numpy)."""

from __future__ import annotations

import ctypes
import importlib.metadata

import pytest

from pc_cpu.kvstate import native


def test_installed_package_ships_a_loadable_native_library():
    try:
        importlib.metadata.distribution("pc_cpu")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("pc_cpu is not installed (source tree only): nothing built to check")
    assert native.library_path() is not None, "pip install built no libpc_native: check CMakeLists.txt"
    assert native.available()


def test_the_library_is_resolved_and_loaded_once_per_process(monkeypatch):
    resolved, loaded = [], []
    real_path, real_cdll = native.library_path, ctypes.CDLL
    monkeypatch.setattr(native, "library_path", lambda: resolved.append(1) or real_path())
    monkeypatch.setattr(ctypes, "CDLL", lambda *args, **kwargs: loaded.append(1) or real_cdll(*args, **kwargs))
    native._lib.cache_clear()  # forget the load of earlier tests, so this one sees the first call
    try:
        first = native._lib()
        for _ in range(3):
            native.available()
        assert native._lib() is first
        assert len(resolved) == 1 and len(loaded) == (1 if real_path() else 0)
    finally:
        native._lib.cache_clear()  # the next caller loads through the real functions
