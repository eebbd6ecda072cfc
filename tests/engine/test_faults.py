"""kill -9 while storing: after a restart the store verifies clean, and what was stored before answers as before.

Each test runs its work in a child process (tests/engine/crash_child.py), which stops for good at
a moment the test picks (inside a write to the store, or between the batches of an encoding) and
says so on stdout; the test then kills it with SIGKILL, reopens the store in a new PromptCache,
runs `pc-cpu store verify`, and asks again what the child had stored whole before the kill.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pc_cpu.pml.document_layout import document_id
from tests.conftest import cache_factory
from tests.engine import crash_child
from tests.engine.crash_child import EARLIER, MAX_TOKENS, NEW, QUESTION, SCHEMA, SCHEMA_PROMPT

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 120  # for the child to reach its moment: seconds on an idle machine, far more on a busy one
PC_CPU = Path(sys.executable).with_name("pc-cpu")  # the console script, as a user runs it

pytestmark = pytest.mark.skipif(os.name != "posix", reason="kills with SIGKILL")


@pytest.fixture
def make_tiny(tiny_model_path):
    """PromptCaches on the tiny model with the child's options: the restart must compute what the child did."""
    yield from cache_factory(tiny_model_path)


def kill_at_the_moment(scenario: str, model: Path, store: Path, logs: Path) -> tuple[dict, dict, int]:
    """Returns the child's "before" and "blocked" events and its pid, once it stood at its moment and was killed."""
    with open(logs / f"{scenario}.stderr", "wb") as stderr:
        child = subprocess.Popen([sys.executable, "-m", "tests.engine.crash_child", scenario, str(model), str(store)],
                                 cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr)
    try:
        events = read_events(child, {"before", "blocked"}, logs / f"{scenario}.stderr")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
    assert child.returncode == -signal.SIGKILL, f"the child ended by itself (exit code {child.returncode})"
    return events["before"], events["blocked"], child.pid


def read_events(child: subprocess.Popen, wanted: set[str], stderr: Path) -> dict[str, dict]:
    """Returns the child's events by name once each of `wanted` came; fails, with its stderr, on an error or late."""
    deadline = time.monotonic() + DEADLINE_S
    events: dict[str, dict] = {}
    pending = b""
    fd = child.stdout.fileno()
    os.set_blocking(fd, False)
    while not wanted <= events.keys():
        left = deadline - time.monotonic()
        if left <= 0:
            pytest.fail(f"the child did not report {sorted(wanted - events.keys())} within {DEADLINE_S} s; "
                        f"it reported {sorted(events)}; its stderr ends:\n{tail(stderr)}")
        select.select([fd], [], [], left)
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            continue
        if not chunk:
            pytest.fail(f"the child exited (code {child.wait()}) before reporting {sorted(wanted - events.keys())}; "
                        f"its stderr ends:\n{tail(stderr)}")
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            event = json.loads(line)
            if event["event"] == "error":
                pytest.fail(f"the child could not reach its moment: {event['message']}\n{tail(stderr)}")
            events[event["event"]] = event
    return events


def tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def verify(store: Path) -> tuple[int, list[str], str]:
    """Returns `pc-cpu store verify --store STORE`'s exit code, stdout lines and stderr."""
    done = subprocess.run([str(PC_CPU), "store", "verify", "--store", str(store)], capture_output=True, text=True,
                          timeout=DEADLINE_S)
    return done.returncode, done.stdout.splitlines(), done.stderr


def assert_verify_lists_only_the_interrupted_writes(store: Path, temps: list[str], pid: int) -> None:
    """Checks what verify says right after the kill, before any restart: the killed writes' temp files, nothing else."""
    code, lines, err = verify(store)
    gone = f"an unfinished write; its writer, process {pid}, is gone"
    expected = [f"bad: {Path(temp).relative_to(store)}: orphan: {gone}" for temp in sorted(temps)]
    assert lines == expected, "after the kill, verify says:\n" + "\n".join(lines + [err])
    assert code == (1 if temps else 0) and all(Path(temp).exists() for temp in temps)


def assert_verify_is_clean(store: Path, temps: list[str]) -> None:
    code, lines, err = verify(store)
    assert lines == [] and code == 0, "after the restart, verify says:\n" + "\n".join(lines + [err])
    assert err.strip() == "0 bad file(s)"
    assert not any(Path(temp).exists() for temp in temps)  # the restart cleaned up after the killed writer


def assert_stored_before_answers_as_before(cache, before: dict) -> None:
    """Checks that the schema's modules and the earlier document come from disk, answering as before the kill."""
    cache.load_schema(SCHEMA, encode=False)
    result = cache.generate(SCHEMA_PROMPT, max_tokens=MAX_TOKENS)
    assert result.tiers == {"#root": "disk", "city": "disk", "season": "disk"}
    assert result.token_ids == before["schema"]
    asked = cache.ask(QUESTION, documents=["earlier"], max_tokens=MAX_TOKENS)
    assert asked.tiers == {"#preamble": "disk", document_id(EARLIER): "disk"}
    assert asked.token_ids == before["asked"]
    assert cache.schemas.encoded == 0 and cache.documents.encoded == 0


def test_killed_while_storing_a_conversations_tip(make_tiny, tiny_model_path, tmp_path):
    store = tmp_path / "store"
    before, blocked, pid = kill_at_the_moment("conversation", tiny_model_path, store, tmp_path)
    assert_verify_lists_only_the_interrupted_writes(store, blocked["temp"], pid)
    assert len(blocked["temp"]) == 1  # the tip's file, half written

    cache = make_tiny(store=store, **crash_child.OPTIONS)
    assert_verify_is_clean(store, blocked["temp"])
    assert_stored_before_answers_as_before(cache, before)
    messages = before["messages"]  # system, turn 1 and its answer, turn 2 and its answer
    second = cache.chat(messages[:4], max_tokens=MAX_TOKENS)  # turn 2 again: turn 1's tip was stored whole
    assert second.tiers == {"#conversation": "disk"}
    assert second.cached_tokens == cache.conversations.prompt(messages[:3], add_generation_prompt=False).answers[-1][1]
    assert second.token_ids == before["turns"][1]
    assert [(doc.id, doc.names) for doc in cache.list_documents()] == [(document_id(EARLIER), ["earlier"])]


# Killed between two batches of its encodings, inside the write of its last encoding, or inside the write of
# its library file; another thread chats all along.
@pytest.mark.parametrize("moment", crash_child.MOMENTS)
def test_killed_while_adding_a_document_under_load(moment, make_tiny, tiny_model_path, tmp_path):
    store = tmp_path / "store"
    before, blocked, pid = kill_at_the_moment(f"document-{moment}", tiny_model_path, store, tmp_path)
    assert blocked["pieces"] > 0, "no chat got an answer piece between the add's batches: it was not under load"
    temps = blocked.get("temp", [])
    assert_verify_lists_only_the_interrupted_writes(store, temps, pid)
    assert len(temps) == (0 if moment == "encoding" else 1)

    cache = make_tiny(store=store, **crash_child.OPTIONS)
    assert_verify_is_clean(store, temps)
    earlier, new = document_id(EARLIER), document_id(NEW)
    # Either whole or absent: killed before its library file was in place, it is absent.
    assert [(doc.id, doc.names) for doc in cache.list_documents()] == [(earlier, ["earlier"])]
    assert sorted(p.name for p in (store / "documents").iterdir()) == [".lock", f"{earlier}.json"]
    assert_stored_before_answers_as_before(cache, before)

    added = cache.add_document(NEW, name="new")
    # Its first encoding (after the preamble) was stored whole unless the kill came before it was computed.
    first_stored = moment != "encoding" or blocked["tokens_done"] > blocked["tokens_total"] // 2
    assert added == new and added.tiers[new] == ("disk" if first_stored else "encoded")
    assert (cache.documents.encoded == 0) == (moment == "library")  # killed in its library write: every cell stored
    assert [(doc.id, doc.names) for doc in cache.list_documents()] == [(earlier, ["earlier"]), (new, ["new"])]
    asked = cache.ask(QUESTION, documents=["new"], max_tokens=MAX_TOKENS)
    assert asked.token_ids == cache.ask(QUESTION, documents=["new"], max_tokens=MAX_TOKENS, use_cache=False).token_ids
    assert_verify_is_clean(store, temps)
