"""The work tests/engine/test_faults.py kills: `python -m tests.engine.crash_child SCENARIO MODEL STORE`.

The child reports on stdout, one JSON object a line: "before" with the answers it got before the
fault, then "blocked" once it stands at the moment the parent kills it (it never leaves it), or
"error" when it cannot get there. Nothing else orders the two processes.

Scenarios (each first loads a schema, adds a document and asks over it: what must survive):
- `conversation`: two chat turns; the idle repair of the second stores its tip, and stops half way
  through writing it to the disk store.
- `document-encoding`, `document-cells`, `document-library`: adds a second document while another
  thread chats without pause, and stops between two batches of its encodings (in its progress
  callback, once the chats got answer pieces between its batches), half way through writing its
  last encoding to the disk store, or half way through writing its library file.
"""

from __future__ import annotations

import io
import json
import os
import sys
import threading
from pathlib import Path
from typing import Callable, NoReturn

from pc_cpu import PromptCache
from pc_cpu.pml.document_layout import document_id
from pc_cpu.store import disk as disk_module, document_library as library_module
from pc_cpu.store.disk_format import read_header
from pc_cpu.store.document_library import document_label

OPTIONS = dict(n_ctx=2048, threads=2, n_seq_max=16)  # the parent restarts with the same: same tokens
MAX_TOKENS = 8
SCHEMA = ('<schema name="trip">Plan a trip. <module name="city">The city is Lisbon, by the sea.</module>'
          '<module name="season">It is spring, mild and bright.</module></schema>')
SCHEMA_PROMPT = '<prompt schema="trip"><city/><season/> Where should we walk first?</prompt>'
EARLIER = "Document one. " + " ".join(f"fact {i} is {i * 7}." for i in range(150))  # ~1,500 tokens: 3 batches
NEW = "Document two. " + " ".join(f"item {i} costs {i * 3} coins." for i in range(150))
QUESTION = "What is fact 3?"
SYSTEM = {"role": "system", "content": "You answer in one short sentence."}
TURNS = ["Name a large city by the sea.", "What is it known for?"]
MOMENTS = ("encoding", "cells", "library")  # of `document-<moment>`

_say = threading.Lock()  # the scheduler's thread and this one both report


def say(event: str, **fields) -> None:
    """Writes one event line to stdout, whole, whichever thread calls."""
    with _say:
        sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
        sys.stdout.flush()


def stand_still(**fields) -> NoReturn:
    """Reports that the child stands at the moment to kill it, and blocks its thread there for good."""
    say("blocked", **fields)
    threading.Event().wait()
    raise AssertionError("unreachable")


def stop_inside_write(module, matches: Callable[[Path, list[bytes]], bool],
                      fields: Callable[[], dict] = dict) -> None:
    """Makes `module`'s atomic writes of the files `matches` stop for good half way through their last chunk.

    The payload is the bulk of a file: a process killed while writing one is killed there.
    `fields()` adds to the "blocked" event.
    """
    write_atomically = module.write_atomically

    def write(path: Path, chunks) -> None:
        chunks = list(chunks)
        if not matches(path, chunks):
            return write_atomically(path, chunks)

        def half_of_it():
            yield from chunks[:-1]
            yield chunks[-1][: len(chunks[-1]) // 2]
            stand_still(path=str(path), temp=[str(p) for p in _temp_files(path)], **fields())

        write_atomically(path, half_of_it())

    module.write_atomically = write


def _temp_files(path: Path) -> list[Path]:
    """Returns this process's temp files in `path`'s directory (pc_cpu.store.atomic names them for their writer)."""
    return sorted(p for p in path.parent.iterdir() if p.name.endswith(".tmp") and f".{os.getpid()}." in p.name)


def label(chunks: list[bytes]) -> str:
    """Returns the store label in the header of a disk store file's chunks."""
    return read_header(io.BytesIO(chunks[0])).key.label


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


def added_before(pc: PromptCache) -> dict:
    """Returns the answers over what is stored whole before any fault: a schema's modules, a document and its prefix."""
    pc.load_schema(SCHEMA)
    schema = pc.generate(SCHEMA_PROMPT, max_tokens=MAX_TOKENS).token_ids
    pc.add_document(EARLIER, name="earlier")
    asked = pc.ask(QUESTION, documents=["earlier"], max_tokens=MAX_TOKENS).token_ids
    pc.wait_idle()  # the question's exact prefix is stored too
    return {"schema": schema, "asked": asked}


def conversation(pc: PromptCache) -> None:
    """Two turns; the idle repair after the second stops inside the write of its tip."""
    before = added_before(pc)
    messages = [SYSTEM, user(TURNS[0])]
    first = pc.chat(messages, max_tokens=MAX_TOKENS)
    messages.append(assistant(first.text))
    pc.wait_idle()  # as a person reading the answer: turn 1's tip is stored whole
    stop_inside_write(disk_module, lambda path, chunks: label(chunks).startswith("conversation"))
    messages.append(user(TURNS[1]))
    second = pc.chat(messages, max_tokens=MAX_TOKENS)
    say("before", **before, turns=[first.token_ids, second.token_ids],
        messages=messages + [assistant(second.text)])
    pc.wait_idle()  # the repair (chat_prompt.REPAIR_DELAY_S later, in the scheduler's thread) stops in the write
    say("error", message="turn 2's tip was stored without stopping")


class ChatLoad:
    """A thread chatting without pause, each conversation new, counting the answer pieces it gets."""

    def __init__(self, pc: PromptCache):
        self.pc = pc
        self.pieces = 0
        self.first_answer = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        n = 0
        while True:
            n += 1
            for _ in self.pc.stream_chat([SYSTEM, user(f"Tell me about place number {n}.")], max_tokens=64):
                self.pieces += 1
            self.first_answer.set()


def document(pc: PromptCache, moment: str) -> None:
    """Adds a second document under load; stops at `moment` (MOMENTS) of the add."""
    before = added_before(pc)
    new_id = document_id(NEW)
    load = ChatLoad(pc)
    if not load.first_answer.wait(120):
        say("error", message="the chatting thread got no answer in 120 s")
        return
    say("before", **before)
    first_batch: list[int] = []  # the chats' answer pieces when the add had computed its first batch

    def during() -> dict:
        """Returns the answer pieces the chats got since the add's first batch: running between its batches."""
        return {"pieces": load.pieces - first_batch[0] if first_batch else 0}

    def progress(event) -> None:
        # Called between batches, holding the context; running chats get it after each (Scheduler.give_way).
        if not first_batch:
            first_batch.append(load.pieces)
        elif moment == "encoding" and during()["pieces"] and event.tokens_done < event.tokens_total:
            stand_still(tokens_done=event.tokens_done, tokens_total=event.tokens_total, **during())

    if moment == "cells":
        encodings = []

        def last_encoding(path: Path, chunks: list[bytes]) -> bool:
            if label(chunks) != document_label(new_id):
                return False
            encodings.append(path)
            return len(encodings) == 2  # after the preamble, then after its stand-ins (the earlier document)

        stop_inside_write(disk_module, last_encoding, during)
    elif moment == "library":
        stop_inside_write(library_module, lambda path, chunks: path.name == f"{new_id}.json", during)
    pc.add_document(NEW, name="new", progress=progress)
    say("error", message=f"the document was added whole without stopping at {moment!r} ({during()})")


def main(argv: list[str]) -> None:
    scenario, model, store = argv
    pc = PromptCache(model, store=store, **OPTIONS)
    try:
        if scenario == "conversation":
            conversation(pc)
        elif scenario.startswith("document-") and scenario.removeprefix("document-") in MOMENTS:
            document(pc, scenario.removeprefix("document-"))
        else:
            say("error", message=f"no scenario {scenario!r}")
    except BaseException as exc:
        say("error", message=f"{type(exc).__name__}: {exc}")
        raise


if __name__ == "__main__":
    main(sys.argv[1:])
