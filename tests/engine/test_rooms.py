"""The engine's rooms import one way, as pc_cpu/engine/__init__.py says: no arrow runs back up.

llama/ imports no other room; cells/ imports llama/; recompute/ imports cells/ and llama/;
runtime/ imports llama/; prompts/ imports them all. Nothing in the engine imports the façade
(cache, schemas, documents, conversations, workbench) or the server. Read from the source, so a
new import that breaks the order fails here, not in a newcomer's head.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ENGINE = pathlib.Path(__file__).resolve().parents[2] / "pc_cpu" / "engine"
MAY_IMPORT = {
    "llama": set(),
    "cells": {"llama"},
    "recompute": {"cells", "llama"},
    "runtime": {"llama"},
    "prompts": {"recompute", "cells", "llama", "runtime"},
}
ABOVE_THE_ENGINE = ("pc_cpu.cache", "pc_cpu.schemas", "pc_cpu.documents", "pc_cpu.conversations",
                    "pc_cpu.workbench", "pc_cpu.server", "pc_cpu.cli")


def imported_modules(path: pathlib.Path) -> set[str]:
    """Returns the modules a file imports (`from X import y` gives X, and X.y when y is a module of pc_cpu)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def test_every_engine_file_lives_in_a_room():
    assert sorted(p.name for p in ENGINE.glob("*.py")) == ["__init__.py"]
    assert sorted(p.name for p in ENGINE.iterdir() if p.is_dir() and p.name != "__pycache__") == sorted(MAY_IMPORT)


@pytest.mark.parametrize("room", sorted(MAY_IMPORT))
def test_a_room_imports_only_the_rooms_below_it(room):
    for path in sorted((ENGINE / room).glob("*.py")):
        for name in imported_modules(path):
            if name.startswith("pc_cpu.engine."):
                other = name.split(".")[2]
                assert other == room or other in MAY_IMPORT[room], f"{path.name} imports {name}"
            assert not name.startswith(ABOVE_THE_ENGINE), f"{path.name} imports {name}, above the engine"


def test_a_room_says_what_it_does_and_may_import():
    for room in MAY_IMPORT:
        doc = ast.get_docstring(ast.parse((ENGINE / room / "__init__.py").read_text()))
        assert doc and "May import" in doc, room
