"""The examples of README.md and docs/*.md run as written: every ```console and ```python block, on a tiny model.

A newcomer copies these first; a renamed option or a missing example file should fail here, not
on their machine. Each block runs in a subprocess from the repository's root (the paths in the
README and the docs are relative to it), with `$PC_CPU_MODEL` pointing at a tiny random model with
an 8K context (the default model would make the demo alone take a minute; 8K holds the demo's long
document) and the store in a temp dir. Other fences (```text, ```xml, ```sh) are not run: a docs
example that cannot run on the tiny model is fenced so, and says why. A block marked
`<!-- file: PATH -->` must equal that file. The relative links of these files, of bench/RESULTS.md
and of bench/history/ must point at files and headings that exist.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]  # whose blocks run
LINKED = [*DOCS, ROOT / "bench" / "RESULTS.md", *sorted((ROOT / "bench" / "history").glob("*.md"))]  # whose links are checked
RUN_LANGUAGES = ("console", "python")
COMMAND_TIMEOUT_S = 300  # the demo on the tiny model takes seconds; a hang should not stall the suite
SERVER_START_TIMEOUT_S = 120

# Parts of a `&&` chain that are not run, and why: the test runs inside the environment they make.
SKIPPED_COMMANDS = {
    "pip ": "installing: the test runs in the environment the install made",
    "python3 -m venv": "making the virtualenv the test already runs in",
    ". .venv/bin/activate": "activating it",
    "pytest": "the test suite itself",
}


@dataclass(frozen=True)
class Block:
    """One fenced code block of the README or of a docs page."""

    language: str     # the fence's info string: console, python, text, xml...
    text: str
    line: int         # 1-based line of the opening fence, for messages
    file: str | None  # PATH of a `<!-- file: PATH -->` marker on the line before the fence
    doc: str = "README.md"  # the Markdown file it is in, relative to the repository's root

    @property
    def where(self) -> str:
        return f"{self.doc} line {self.line}"


def readme_blocks(markdown: str, doc: str = "README.md") -> list[Block]:
    """Returns the fenced blocks of `markdown` (the file `doc`), in order."""
    blocks, lines = [], markdown.splitlines()
    i = 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        if not fence:
            i += 1
            continue
        marker = re.match(r"^<!-- file: (\S+) -->$", lines[i - 1]) if i else None
        end = lines.index("```", i + 1)  # ValueError: an unclosed fence, which GitHub would render wrong too
        blocks.append(Block(fence.group(1), "\n".join(lines[i + 1:end]) + "\n", i + 1,
                            marker.group(1) if marker else None, doc))
        i = end + 1
    return blocks


def console_commands(text: str) -> list[str]:
    """Returns the commands of a console block: `$ ` lines, with their `\\` continuations; output lines are left out."""
    commands: list[str] = []
    for line in text.splitlines():
        if commands and commands[-1].endswith("\\"):
            commands[-1] = commands[-1][:-1].rstrip() + " " + line.strip()
        elif line.startswith("$ "):
            commands.append(line[2:].strip())
    return commands


def runnable_parts(command: str) -> list[str]:
    """Returns the parts of a `&&` chain that the test runs (SKIPPED_COMMANDS are not)."""
    parts = [part.strip() for part in command.split("&&")]
    return [part for part in parts if not part.startswith(tuple(SKIPPED_COMMANDS))]


def _relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


BLOCKS = [block for path in DOCS for block in readme_blocks(path.read_text(encoding="utf-8"), _relative(path))]
RUN_BLOCKS = [block for block in BLOCKS if block.language in RUN_LANGUAGES]
README_BLOCKS = [block for block in RUN_BLOCKS if block.doc == "README.md"]


@pytest.fixture
def readme_env(tiny_8k_model_path, tmp_path):
    """The environment every README command runs in: the tiny model, a fresh store, this venv's pc-cpu first."""
    env = dict(os.environ)
    env.update(PC_CPU_MODEL=str(tiny_8k_model_path), PC_CPU_STORE_DIR=str(tmp_path / "store"),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}")
    return env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run(args, env, what: str) -> None:
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    assert done.returncode == 0, (f"{what} exited with {done.returncode}\n--- stdout\n{done.stdout[-2000:]}"
                                  f"\n--- stderr\n{done.stderr[-4000:]}")


def _wait_for_server(process: subprocess.Popen, port: int, what: str) -> None:
    """Returns once the server answers /health; fails if it exits or takes too long to start."""
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"{what} exited with {process.returncode} before it served\n{process.stderr.read()[-4000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"{what} did not answer /health within {SERVER_START_TIMEOUT_S} s")


def run_console_block(block: Block, env: dict) -> None:
    """Runs the block's commands in order; `CMD &` starts a server that later commands of the block talk to."""
    text = block.text
    port = re.search(r"--port (\d+)", text)
    if port:  # the README's port may be taken on this machine (another test, someone's server): use a free one
        text = re.sub(rf"\b{port.group(1)}\b", str(_free_port()), text)
    background: list[subprocess.Popen] = []
    try:
        for command in console_commands(text):
            for part in runnable_parts(command):
                what = f"{block.where}: `{part}`"
                server = re.match(r"^(.*[^&])&\s*(#.*)?$", part)  # `CMD &` (not `&&`), maybe with a comment
                if not server:
                    if part.startswith("curl "):  # curl exits 0 on an HTTP error, which a reader would see and a test not
                        part = "curl --fail-with-body " + part[len("curl "):]
                    _run(["bash", "-c", part], env, what)
                    continue
                process = subprocess.Popen(["bash", "-c", f"exec {server.group(1)}"], cwd=ROOT, env=env,
                                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                background.append(process)
                _wait_for_server(process, int(re.search(r"--port (\d+)", part).group(1)), what)
    finally:
        for process in background:  # only the servers this test started, by their handle
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _block_id(block: Block) -> str:
    return f"{block.doc.removesuffix('.md').replace('/', '-')}-line{block.line}-{block.language}"


@pytest.mark.parametrize("block", RUN_BLOCKS, ids=_block_id)
def test_readme_block_runs(block, readme_env, tmp_path):
    if block.language == "console":
        run_console_block(block, readme_env)
    else:  # a file, not `python -c`: prompt_program reads its function's source with inspect
        script = tmp_path / f"{_block_id(block)}.py"
        script.write_text(block.text, encoding="utf-8")
        _run([sys.executable, str(script)], readme_env, f"{block.where} (python block)")


def test_the_docs_have_examples_that_run():
    """The examples moved out of the README keep running: each page that had them still has them."""
    docs_running = {block.doc for block in RUN_BLOCKS if block.doc != "README.md"}
    moved = {"docs/conversations.md", "docs/documents.md", "docs/memory.md", "docs/reference.md", "docs/troubleshooting.md"}
    assert moved <= docs_running, sorted(moved - docs_running)


def test_the_quick_start_keeps_its_two_commands():
    """The set-up commands a newcomer copies: found by the parser (so they run above), spelled exactly so, once each."""
    commands = [command for block in README_BLOCKS if block.language == "console"
                for command in console_commands(block.text)]
    assert commands.count('pip install ".[model]" && pc-cpu demo') == 1
    assert commands.count('pip install ".[test,models]" && pytest') == 1


def test_the_extras_the_docs_install_exist():
    """pip 23.2 does not normalize extra names, so each one must be spelled as pyproject.toml declares it."""
    tomllib = pytest.importorskip("tomllib")
    declared = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    named = {group for path in DOCS for group in re.findall(r'"\.\[([^\]]+)\]"', path.read_text(encoding="utf-8"))}
    extras = {extra for group in named for extra in group.split(",")}
    assert extras and extras <= declared, f"not in pyproject.toml: {sorted(extras - declared)}"


def test_file_blocks_show_the_files_they_name():
    marked = [block for block in BLOCKS if block.file]
    assert any(block.doc == "README.md" for block in marked)
    for block in marked:
        assert (ROOT / block.file).read_text(encoding="utf-8") == block.text, f"{block.where}: {block.file}"


def test_the_example_schema_is_the_demos():
    """examples/demo.pml is what `pc-cpu demo` loads, so the README's `run` examples ask what the demo asks."""
    from pc_cpu.demo import demo_schema

    assert (ROOT / "examples" / "demo.pml").read_text(encoding="utf-8") == demo_schema() + "\n"


def heading_anchors(markdown: str) -> set[str]:
    """Returns the anchors GitHub gives the headings of `markdown`: lower case, punctuation dropped, spaces as `-`."""
    anchors: set[str] = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", _prose(markdown, keep_inline_code=True), flags=re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchor, n = slug, 0
        while anchor in anchors:  # a repeated heading gets -1, -2, ...
            n += 1
            anchor = f"{slug}-{n}"
        anchors.add(anchor)
    return anchors


def _prose(markdown: str, keep_inline_code: bool = False) -> str:
    """Returns `markdown` without its fenced blocks and indented code (where `](` and `#` are not Markdown), and
    without its inline code unless `keep_inline_code` (a heading's anchor keeps that text)."""
    text = re.sub(r"^```.*?^```[ \t]*$", "", markdown, flags=re.MULTILINE | re.DOTALL)
    text = re.sub(r"^(?: {4}|\t).*$", "", text, flags=re.MULTILINE)
    return text if keep_inline_code else re.sub(r"`[^`\n]*`", "", text)


def local_links(markdown: str) -> list[tuple[str, str]]:
    """Returns the (target, anchor) of each relative link of `markdown`; an empty target is the file itself."""
    links = re.findall(r"\]\(([^)\s#]*)(?:#([^)\s]*))?\)", _prose(markdown))
    return [(target, anchor) for target, anchor in links if not re.match(r"^[a-z]+:", target) and (target or anchor)]


@pytest.mark.parametrize("path", LINKED, ids=_relative)
def test_links_point_at_files_and_headings_that_exist(path):
    """README, docs/, bench/RESULTS.md and bench/history/: every relative link's file exists, and its #heading too."""
    broken = []
    for target, anchor in local_links(path.read_text(encoding="utf-8")):
        linked = (path.parent / target).resolve() if target else path
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in heading_anchors(linked.read_text(encoding="utf-8")):
            broken.append(f"{target}#{anchor}: no such heading")
    assert not broken, f"{_relative(path)}: {broken}"


def test_the_readme_links_into_docs():
    targets = {target for target, _ in local_links(README.read_text(encoding="utf-8"))}
    assert {f"docs/{path.name}" for path in DOCS if path != README} <= targets


def test_heading_anchors_are_githubs():
    text = "# A title\n## Flash attention off by default (2026-12-05, commit 0a2e96e)\n### `select:R` and `head:k`\n## A title\n"
    assert heading_anchors(text) == {"a-title", "flash-attention-off-by-default-2026-12-05-commit-0a2e96e",
                                     "selectr-and-headk", "a-title-1"}


def test_console_commands_join_continuations_and_skip_output():
    text = "$ first \\\n    --flag x\nsome output\n$ pip install \".[serve]\" && pc-cpu run a\n"
    assert console_commands(text) == ["first --flag x", 'pip install ".[serve]" && pc-cpu run a']
    assert runnable_parts(console_commands(text)[1]) == ["pc-cpu run a"]
