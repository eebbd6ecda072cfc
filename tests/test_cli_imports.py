"""The CLI starts without the heavy modules: llama.cpp, numpy and the benchmarks load only in the commands that use them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

HEAVY = ("llama_cpp", "numpy", "pc_cpu.benchmarks", "pc_cpu.cache")


def heavy_modules_loaded_by(code: str) -> list[str]:
    """Returns the modules of HEAVY that running `code` in a fresh interpreter has imported."""
    script = f"import json, sys\n{code}\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def test_importing_the_cli_loads_neither_llama_cpp_nor_numpy_nor_the_benchmarks():
    assert heavy_modules_loaded_by("import pc_cpu.cli") == []


def test_the_help_of_every_top_level_command_loads_none_of_them():
    code = ("from pc_cpu.cli import main\n"
            "for args in (['--help'], ['run', '--help'], ['ask', '--help'], ['store', '--help']):\n"
            "    try:\n        main(args)\n    except SystemExit:\n        pass")
    assert heavy_modules_loaded_by(code) == []


def test_the_bench_group_loads_its_commands_when_listed():
    assert "pc_cpu.benchmarks" in heavy_modules_loaded_by(
        "from pc_cpu.cli import main\ntry:\n    main(['bench', '--help'])\nexcept SystemExit:\n    pass")


def test_bench_help_lists_every_bench_command():
    from pc_cpu.benchmarks.command import bench as commands
    from pc_cpu.cli import cli

    result = CliRunner().invoke(cli, ["bench", "--help"])
    assert result.exit_code == 0, result.output
    listed = {line.split()[0] for line in result.output.split("Commands:")[1].splitlines() if line.strip()}
    assert listed == set(commands.commands) >= {"latency", "accuracy", "peers", "recompute", "documents", "summary"}
    recompute = CliRunner().invoke(cli, ["bench", "recompute", "--help"])
    assert all(name in recompute.output for name in ("run", "summarize", "compare"))


def test_the_package_names_import_on_first_use():
    import pc_cpu
    from pc_cpu import PromptCache, Result, prompt_program  # noqa: F401  (each must resolve)
    from pc_cpu.cache import PromptCache as defined

    assert PromptCache is defined and pc_cpu.PromptCache is defined
    assert set(pc_cpu.__all__) <= set(dir(pc_cpu))
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        pc_cpu.Nothing  # noqa: B018


def test_the_serve_limit_on_documents_is_the_librarys():
    from pc_cpu.cli import cli
    from pc_cpu.store.document_library import DEFAULT_MAX_DOCUMENTS

    defaults = {p.name: p.default for p in cli.commands["serve"].params}
    assert defaults["max_documents"] == DEFAULT_MAX_DOCUMENTS
