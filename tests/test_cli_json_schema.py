"""`pc-cpu ask` and `pc-cpu chat` take --json-schema FILE: the answer is JSON the schema admits; a bad file is one error line."""

from __future__ import annotations

import json

import pytest

from tests.test_cli import assert_one_error_line, run_main

COLOUR = {"type": "object", "properties": {"colour": {"enum": ["red", "green"]}}, "required": ["colour"]}


@pytest.fixture
def files(tmp_path):
    (tmp_path / "colour.json").write_text(json.dumps(COLOUR))
    (tmp_path / "note.txt").write_text("Boats in the harbour are red or green.")
    return tmp_path


def test_ask_answers_json_the_schema_admits(tiny_model_path, files, capsys):
    code, out, err = run_main(["ask", "Which colour?", "--doc", str(files / "note.txt"), "--json-schema",
                               str(files / "colour.json"), "--model", str(tiny_model_path), "--no-store",
                               "--max-tokens", "24", "--json"], capsys)
    assert code == 0, err
    assert json.loads(json.loads(out)["text"]) in ({"colour": "red"}, {"colour": "green"})


def test_chat_answers_json_the_schema_admits(tiny_model_path, files, capsys, monkeypatch):
    code, out, err = run_main(["chat", "--json-schema", str(files / "colour.json"), "--model", str(tiny_model_path),
                               "--no-store", "--max-tokens", "24"], capsys, stdin="Pick a colour.\n",
                              monkeypatch=monkeypatch)
    assert code == 0, err
    assert json.loads(out) in ({"colour": "red"}, {"colour": "green"})


@pytest.mark.parametrize("content, fragment", [("{not json", "not JSON"), ('{"type": "nonsense"}', "Unrecognized schema")])
def test_a_schema_file_that_cannot_constrain_an_answer_is_one_error_line(tiny_model_path, files, capsys, content,
                                                                         fragment):
    (files / "bad.json").write_text(content)
    code, _, err = run_main(["ask", "Which colour?", "--doc", str(files / "note.txt"), "--json-schema",
                             str(files / "bad.json"), "--model", str(tiny_model_path), "--no-store"], capsys)
    assert_one_error_line(code, err, "--json-schema", fragment)
