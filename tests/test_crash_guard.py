"""A fatal signal inside native code ends the CLI with one `error:` line, not a silent exit 139.

Each case crashes a child Python process for real (a read of address 0 through ctypes), the
way llama.cpp's AMX matmul crashes on some CPUs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from pc_cpu.crash_guard import _lib

pytestmark = pytest.mark.skipif(_lib() is None or os.name != "posix",
                                reason="the guard lives in pc_native, on POSIX systems")


def run_python(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONFAULTHANDLER"}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          timeout=120, stdin=subprocess.DEVNULL)


def test_a_segfault_after_install_prints_the_message_and_exits_2():
    done = run_python("""
        import ctypes
        from pc_cpu import crash_guard
        assert crash_guard.install()
        crash_guard.set_message("while testing; set SOMETHING=off")
        ctypes.string_at(0)
    """)
    assert done.returncode == 2
    assert done.stderr.splitlines() == ["error: llama.cpp crashed (SIGSEGV) while testing; set SOMETHING=off"]


def test_without_the_guard_the_same_crash_is_silent():
    # What users saw before: the test above would pass vacuously if a crash printed this line anyway.
    done = run_python("import ctypes; ctypes.string_at(0)")
    assert done.returncode == -11 and "error:" not in done.stderr


CRASH_WHILE_LOADING = """
    import ctypes, sys
    import pc_cpu.engine.llama.model as model

    def crash(self, path, **kwargs):
        from pc_cpu import crash_guard
        from pc_cpu.engine.llama.extra_buffers import ExtraBuffers
        crash_guard.set_message(model._crash_advice("m.gguf", ExtraBuffers(True, "AMX check passed")))
        ctypes.string_at(0)

    model.Model.__init__ = crash
    from pc_cpu.cli import main
    main(["run", '<prompt schema="s"><user>hi</user></prompt>', "--schema", '<schema name="s">x</schema>']
         + sys.argv[1:])
"""


def test_the_cli_turns_a_crash_in_model_loading_into_one_error_line_naming_the_override(tmp_path):
    done = run_python(CRASH_WHILE_LOADING)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "error: llama.cpp crashed (SIGSEGV) while running m.gguf with CPU extra buffers on (AMX check passed); "
        "this is how llama.cpp's AMX path fails on some CPUs: set PC_CPU_EXTRA_BUFFERS=off and run again"]


def test_verbose_adds_the_python_traceback_before_the_error_line(tmp_path):
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(CRASH_WHILE_LOADING), "--verbose"],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and "Fatal Python error: Segmentation fault" in done.stderr
    assert lines[-1].startswith("error: llama.cpp crashed (SIGSEGV) while running m.gguf")
