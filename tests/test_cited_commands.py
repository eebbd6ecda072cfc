"""The `pc-cpu` command lines that bench/RESULTS.md, its history, README and docs/ cite still parse.

A figure cites the command that made it; an option renamed or removed would leave the figure
unreproducible without anyone noticing. Each line is parsed by the CLI as a user would type it
(without running it): an unknown command or option fails here. bench/history/ holds how each
figure was reached, moved there verbatim: its commands are checked too, since they say how to
run those measurements again.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from pc_cpu.cli import cli

ROOT = Path(__file__).resolve().parents[1]
CITING = [ROOT / "bench" / "RESULTS.md", *sorted((ROOT / "bench" / "history").glob("*.md")), ROOT / "README.md",
          *sorted((ROOT / "docs").glob("*.md"))]


INLINE = re.compile(r"`(pc-cpu [^`]*)`")


def cited_commands(text: str) -> list[str]:
    """Returns the `pc-cpu ...` command lines of a Markdown text: inline code (also when a paragraph wraps
    it over lines), and code lines, continuations joined.

    Comments, shell redirections and pipes are cut.
    """
    joined = re.sub(r"\\\n\s*", " ", text)
    spans = [" ".join(span.split()) for span in INLINE.findall(joined)]
    spans += [line.strip() for line in INLINE.sub("", joined).splitlines() if line.strip().startswith("pc-cpu ")]
    commands = []
    for span in spans:
        span = re.split(r"\s+#\s", span)[0]
        commands.append(re.split(r"\s[>|]\s", span)[0])
    return commands


def parse_only(command: str) -> list[str]:
    """Parses `command` down to its last subcommand; returns what was left over.

    Raises:
        click.UsageError: a command or an option the CLI does not have. (Parsing is resilient, so
            that files the line names need not exist; unknown options are checked here instead.)
    """
    # A usage synopsis ("[--doc FILE ...]", "fast|accurate") reads as its first choice; `CMD` as any command.
    synopsis = re.sub(r"([^\s|]+)(\|[^\s|]+)+", r"\1", command.replace("[", " ").replace("]", " "))
    args = [a for a in shlex.split(synopsis)[1:] if a != "..."]  # "..." stands for repeated options
    command_object: click.Command = cli
    known = {"--help", "-h"}
    context = cli.make_context("pc-cpu", list(args), resilient_parsing=True)
    while True:
        known |= {opt for param in command_object.params for opt in (*param.opts, *param.secondary_opts)}
        if not isinstance(command_object, click.Group):
            break
        rest = [*getattr(context, "_protected_args", []), *context.args]
        if not rest:  # the group itself ("pc-cpu bench")
            break
        name, command_object, rest = command_object.resolve_command(context, rest)
        if command_object is None:
            raise click.UsageError(f"`{command}`: no command {name!r}")
        context = command_object.make_context(name, rest, parent=context, resilient_parsing=True)
    unknown = [a.split("=")[0] for a in args if re.match(r"^--?[A-Za-z]", a) and a.split("=")[0] not in known]
    if unknown:
        raise click.UsageError(f"`{command}`: no option {unknown[0]}")
    return list(context.args)


CASES = [(path.relative_to(ROOT).as_posix(), command) for path in CITING
         for command in cited_commands(path.read_text(encoding="utf-8")) if " CMD" not in command]


def test_the_results_cite_commands():
    """RESULTS.md cites the command behind its figures (42 when it was last reorganized), its history the rest."""
    assert sum(path == "bench/RESULTS.md" for path, _ in CASES) >= 40
    assert sum(path.startswith("bench/history/") for path, _ in CASES) >= 100


@pytest.mark.parametrize("path, command", CASES, ids=[f"{p}:{i}" for i, (p, _) in enumerate(CASES)])
def test_a_cited_command_still_parses(path, command):
    try:
        left = parse_only(command)
    except click.ClickException as exc:
        pytest.fail(f"{path}: `{command}` no longer parses: {exc.format_message()}")
    assert not left, f"{path}: `{command}` leaves {left} unparsed"


@pytest.mark.parametrize("command", ["pc-cpu bench recompute --n 200", "pc-cpu bench nothing",
                                     "pc-cpu bench recompute summarize a.jsonl --docs 10"])
def test_a_command_that_no_longer_exists_is_caught(command):
    with pytest.raises(click.ClickException):
        assert parse_only(command)



def test_inline_commands_wrapped_over_lines_are_found():
    text = "Run (`pc-cpu bench documents\nrag --docs 5`), then\n\n    pc-cpu store ls   # the disk tier\n"
    assert cited_commands(text) == ["pc-cpu bench documents rag --docs 5", "pc-cpu store ls"]
