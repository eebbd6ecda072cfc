"""`pc-cpu chat`: a conversation driven through a pipe, one message per line, history kept, errors one line."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

from tests.test_cli import run_main

TURN = re.compile(r"\[ttft \d+ ms \| (\d+) cached \+ (\d+) computed prompt tokens \((\w+)\)")


def test_each_line_is_a_turn_and_later_turns_reuse_the_history(tiny_model_path, tmp_path, capsys, monkeypatch):
    code, out, err = run_main(["chat", "--model", str(tiny_model_path), "--store", str(tmp_path), "--max-tokens", "5",
                               "--system", "Be brief."], capsys, stdin="first message\n\nsecond one\nthird\n",
                              monkeypatch=monkeypatch)
    assert code == 0
    turns = TURN.findall(err)
    assert len(turns) == 3 and len(out.strip().splitlines()) == 3  # the empty line is no turn
    assert int(turns[0][0]) == 0 and turns[0][2] == "encoded"
    for before, after in zip(turns, turns[1:]):
        assert int(after[0]) >= int(before[0]) + int(before[1])  # the whole previous turn, answer included
        assert after[2] == "context"


def test_a_turn_that_cannot_fit_is_one_error_line_and_the_conversation_goes_on(tiny_model_path, tmp_path, capsys,
                                                                               monkeypatch):
    code, _, err = run_main(["chat", "--model", str(tiny_model_path), "--no-store", "--n-ctx", "128",
                             "--max-tokens", "3"], capsys, stdin="hello\n" + "word " * 200 + "\nhello again\n",
                            monkeypatch=monkeypatch)
    assert code == 0
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and re.search(r"a prompt holds \d+", errors[0])
    assert len(TURN.findall(err)) == 2


def test_a_missing_doc_file_fails_before_the_model_loads(tmp_path, capsys, monkeypatch):
    code, _, err = run_main(["chat", "--doc", str(tmp_path / "nope.txt")], capsys, stdin="", monkeypatch=monkeypatch)
    assert code == 2 and "does not exist" in err


def test_ctrl_c_stops_the_answer_and_ctrl_d_leaves(tiny_model_path, tmp_path):
    env = {**os.environ, "PC_CPU_STORE_DIR": str(tmp_path)}
    chat = subprocess.Popen([sys.executable, "-m", "pc_cpu.cli", "chat", "--model", str(tiny_model_path),
                             "--max-tokens", "100000", "--n-ctx", "4096"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            # A shell without job control starts `pytest &` with SIGINT ignored, and a child
                            # inherits that: Ctrl-C would then never reach it. A terminal's user has it.
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        chat.stdin.write(b"talk for a long time\n")
        chat.stdin.flush()
        # The answer has started: it runs until its 4,096 cells are full, so Ctrl-C comes while it streams.
        assert chat.stdout.read(1)
        chat.send_signal(signal.SIGINT)
        out, err = chat.communicate(b"and now briefly\n", timeout=120)  # then end of input: Ctrl-D
    finally:
        chat.kill()
    err = err.decode()
    assert chat.returncode == 0, err
    assert "[answer stopped]" in err
    turns = TURN.findall(err)
    assert len(turns) == 1 and int(turns[0][0]) > 0  # the second turn reused the stopped one's cells
