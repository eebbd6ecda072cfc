"""The document library: each document's text and names, kept beside the store so that documents survive a restart.

One small JSON file per document (`<store>/documents/<id>.json`: id, text, names,
added), written atomically (pc_cpu.store.atomic), so adding or removing one document
never rewrites the others. Processes sharing a store share the library: `add` and
`remove` hold a lock on `<store>/documents/.lock` (pc_cpu.store.file_lock) and re-read
every file under it before changing one, so names given at once all survive and a
name never comes to name two texts; `resolve` re-reads on a miss, so a document
another process added since is found. The text is kept because encodings can leave the byte tiers (budgets, `store rm`,
another system message): the document is then encoded again from it. Its
encodings themselves live in the tiers like every other (pc_cpu.store.tiers),
labelled `document_label(id)`.

A process killed while writing a document's file leaves a temp file that holds nothing (the
document is absent: it is registered once its file is renamed into place); `verify` lists it,
and the next cache that opens the library deletes it (`delete_orphans`).

Without a store directory (store=False) the library lives in memory only. With a shared store
(PromptCache(remote_store=...)) it lives in Redis instead (pc_cpu.store.shared_library), so servers
on several machines share one: the same checks, made in a Redis transaction. Where it lives is the
library's shelf (`FileShelf`, `MemoryShelf`, `RedisShelf`): each reads every document and applies
one change atomically against what it holds then.

Limits, checked in `add` under the lock against the files as they are then: a name has at
most MAX_NAME_CHARS characters and no control character, a document at most
MAX_NAMES_PER_DOCUMENT names, a library at most `max_documents` documents. `check_room` runs
the same checks without the lock, for a caller that wants a refusal before costly work.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Protocol

from pc_cpu.errors import (ConfigError, DocumentError, DocumentLimitError, StoreError, StoreUnavailableError,
                           UnknownDocumentError)
from pc_cpu.pml.document_layout import stand_in_places
from pc_cpu.pml.text import check_utf8
from pc_cpu.store.atomic import delete_orphans, find_orphans, write_atomically
from pc_cpu.store.base import ModuleStore
from pc_cpu.store.file_lock import exclusive

if TYPE_CHECKING:  # the disk tier loads numpy; the CLI reads this module's limits without it (tests/test_cli_imports.py)
    from pc_cpu.store.disk import BadFile, DiskStore

log = logging.getLogger(__name__)

_ID_PREFIX = "doc-"
_LOCK_NAME = ".lock"  # in the library directory; held around every change

# Every name of a document is in each listing of it (GET /v1/documents) and in its file, rewritten
# whenever it gains one; without these bounds, 40 requests naming one text with 900 KB names made
# each response 36 MB. 255 is the longest file name most file systems allow (NAME_MAX), so every
# file name fits (pc-cpu ask names a document by its file's); 16 leaves room for a file name, a
# title and a few keys, and the names of one document stay under 4,080 characters.
MAX_NAME_CHARS = 255
MAX_NAMES_PER_DOCUMENT = 16
# Each add re-reads every document file under the lock (about 0.25 s for 10,000 small ones) and the
# texts stay in memory, so a library without a bound slows every add and grows without end.
DEFAULT_MAX_DOCUMENTS = 10_000
# C0 and C1 controls (newline, tab, NUL, escape...) and the Unicode line and paragraph separators:
# a name is shown on one line, in messages and listings.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_SHOWN_CHARS = 40  # of a long name, in a message


def document_label(doc_id: str) -> str:
    """Returns the store label of a document's encodings, how `store ls` names them and `remove` finds them."""
    return f"document {doc_id}"



def library_directory(disk: "DiskStore") -> Path:
    """Returns where the document library of a disk store lives: beside its encodings, so both move together."""
    return disk.directory / "documents"


PREFIX_LABEL = "document prefix"  # then the ids of its documents, in prompt order


def prefix_label(doc_ids: Iterable[str]) -> str:
    """Returns the store label of an exact prefix (pc_cpu.engine.prompts.document_prompt) over these documents.

    It names every document, so that removing any of them removes the prefix too: its cells hold that text.
    """
    return " ".join([PREFIX_LABEL, *doc_ids])


STAND_INS_LABEL = "document stand-ins"  # then the ids of the documents whose tokens its cells hold


def stand_ins_label(doc_ids: Iterable[str]) -> str:
    """Returns the store label of a stand-in context (pc_cpu.pml.document_layout.stand_ins) made of these documents.

    It names every one of them, so that removing any of them removes the context too: its cells hold that text.
    """
    return " ".join([STAND_INS_LABEL, *doc_ids])


def held_documents(label: str) -> tuple[str, ...]:
    """Returns the ids of the documents whose text an entry of `label` holds besides its own: () for most labels.

    Exact prefixes (prefix_label) and stand-in contexts (stand_ins_label) hold other documents' cells.
    """
    words = label.split(" ")
    return tuple(words[2:]) if " ".join(words[:2]) in (PREFIX_LABEL, STAND_INS_LABEL) else ()


def labelled_document(label: str) -> str | None:
    """Returns the document id a store label names (`document_label(id)`), else None (modules, preambles)."""
    prefix = document_label("")
    doc_id = label[len(prefix):] if label.startswith(prefix) else ""
    return doc_id if doc_id.startswith(_ID_PREFIX) else None


@dataclass(frozen=True)
class Removed:
    """What removing a document took away: its id, the names it had, and how many stored encodings."""

    id: str
    names: tuple[str, ...]
    encodings: int


def remove_document(library: "DocumentLibrary | None", tiers: Iterable[ModuleStore], id_or_name: str) -> Removed | None:
    """Returns what was removed: the document's library entry and its encodings in `tiers`; None when nothing matches.

    Used by PromptCache.remove_document (every tier) and `pc-cpu store rm` (the disk tier, no model
    loaded). A document id whose library entry is gone still matches the encodings labelled with it,
    so a library file lost by hand does not leave its encodings behind for good. The exact
    prefixes and stand-in contexts holding the document (held_documents) go with it: their cells
    hold its text too.
    """
    try:
        doc = library.resolve(id_or_name) if library is not None else None
    except UnknownDocumentError:
        doc = None
    doc_id = doc.id if doc is not None else id_or_name
    if doc is not None:
        library.remove(doc.id)  # first: a shared library that cannot change now refuses before anything goes
    label = document_label(doc_id)
    removed = 0
    for tier in tiers:
        for key in [k for k in tier.keys() if k.label == label or doc_id in held_documents(k.label)]:
            removed += bool(tier.remove(key))
    if doc is None and not removed:
        return None
    return Removed(doc_id, tuple(doc.names) if doc is not None else (), removed)

def check_name(name: str | None) -> None:
    """Raises DocumentError when `name` cannot name a document (None, no name, always can).

    Raises:
        DocumentLimitError: longer than MAX_NAME_CHARS.
        DocumentError: empty, a control character or a lone surrogate, or shaped like a document id.
    """
    if name is None:
        return
    if not name:
        raise DocumentError("name '' is empty; choose a name with at least one character, or give none")
    if len(name) > MAX_NAME_CHARS:
        raise DocumentLimitError(f"name {_shown(name)} has {len(name):,} characters, more than {MAX_NAME_CHARS}; "
                                 "choose a shorter name (any file name fits)")
    control = _CONTROL.search(name)
    if control is not None:
        raise DocumentError(f"name {_shown(name)} holds the control character U+{ord(control.group()):04X} at "
                            f"character {control.start() + 1}; choose a name on one line, without control characters")
    check_utf8(name, "the name", error=DocumentError)
    if name.startswith(_ID_PREFIX):
        raise DocumentError(f"name {name!r} looks like a document id; choose a name not starting with "
                            f"{_ID_PREFIX!r}")


def check_max_documents(max_documents: int) -> int:
    """Returns `max_documents` when a library can have that limit; raises ConfigError when it is below 1."""
    if max_documents < 1:
        raise ConfigError(f"max_documents={max_documents}: must be at least 1")
    return max_documents


def _shown(name: str) -> str:
    """Returns how a message quotes `name`: its start only when it is long."""
    return repr(name) if len(name) <= _SHOWN_CHARS else repr(name[:_SHOWN_CHARS]) + "\u2026"


@dataclass
class Document:
    id: str
    text: str
    names: list[str] = field(default_factory=list)
    added: float = 0.0  # unix seconds
    # The documents it was encoded after (its stand-ins, pc_cpu.pml.document_layout.stand_in_places) when it was
    # added, oldest first; None in files written before they were recorded.
    after: list[str] | None = None


# A change to the library: given every document as the shelf holds them now (a dict it may edit),
# returns the documents to write and the ids to delete.
Edit = Callable[[dict[str, Document]], tuple[list[Document], list[str]]]


class Shelf(Protocol):
    """Where a library's documents live: read whole, changed one atomic edit at a time."""

    shared: bool  # other processes change it too: read it again before trusting a miss

    def load(self) -> dict[str, Document]:
        """Returns every document, by id (StoreUnavailableError when a shared shelf cannot be reached)."""
        ...

    def version(self) -> object | None:
        """Returns what changes whenever any process changes the shelf, cheaply read; None when it cannot tell."""
        ...

    def change(self, edit: Edit) -> dict[str, Document]:
        """Returns every document after `edit` ran on them as they are now and its changes were written, atomically."""
        ...


class MemoryShelf:
    """A library in this process only (store=False)."""

    shared = False

    def __init__(self):
        self._docs: dict[str, Document] = {}

    def load(self) -> dict[str, Document]:
        return dict(self._docs)

    def version(self) -> None:
        return None  # only this process changes it, and its view is always current

    def change(self, edit: Edit) -> dict[str, Document]:
        docs = dict(self._docs)
        _, deleted = edit(docs)
        for doc_id in deleted:
            docs.pop(doc_id, None)
        self._docs = docs
        return dict(docs)


class FileShelf:
    """A library as one JSON file per document in a directory, changed under a lock file (see the module docstring)."""

    shared = True

    def __init__(self, directory: Path):
        self.directory = directory
        self._warned: set[Path] = set()  # unreadable files already logged: each re-read would repeat them
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot open the document library {directory}: {exc}; fix its permissions or "
                             "point --store elsewhere") from None

    def load(self) -> dict[str, Document]:
        docs = {}
        for path in self._files():
            try:
                doc = _read_document(path)
            except FileNotFoundError:
                continue  # removed by another process since the listing
            except (OSError, ValueError) as exc:
                if path not in self._warned:
                    self._warned.add(path)
                    log.warning("document file %s is unreadable (%s); skipped", path, exc)
                continue
            docs[doc.id] = doc
        return docs

    def version(self) -> None:
        return None  # a miss reads the directory again (resolve); listing it per question would cost more

    def change(self, edit: Edit) -> dict[str, Document]:
        with exclusive(self.directory / _LOCK_NAME):
            docs = self.load()
            saved, deleted = edit(docs)
            for doc in saved:
                self._save(doc)
            for doc_id in deleted:
                docs.pop(doc_id, None)
                try:
                    (self.directory / f"{doc_id}.json").unlink(missing_ok=True)
                except OSError as exc:
                    raise StoreError(f"cannot delete document {doc_id} from {self.directory}: {exc}") from None
            return docs

    def _files(self) -> list[Path]:
        try:
            return sorted(self.directory.glob(f"{_ID_PREFIX}*.json"))
        except OSError as exc:
            raise StoreError(f"cannot list the document library {self.directory}: {exc}; fix its permissions or "
                             "point --store elsewhere") from None

    def _save(self, doc: Document) -> None:
        try:
            write_atomically(self.directory / f"{doc.id}.json", [document_json(doc)])
        except OSError as exc:
            raise StoreError(f"cannot write document {doc.id} to {self.directory}: {exc}; free space or fix "
                             "the directory's permissions") from None

    def delete_orphans(self) -> int:
        deleted = delete_orphans(self.directory)
        if deleted:
            log.info("%s: deleted %d temp file(s) that interrupted writes left", self.directory, len(deleted))
        return len(deleted)

    def verify(self, *, delete: bool = False) -> list["BadFile"]:
        from pc_cpu.store.disk import ORPHAN, BadFile, delete_bad_file  # what the disk store reports, alike

        bad = []
        for path in self._files():
            try:
                _read_document(path)
            except FileNotFoundError:
                continue
            except (OSError, ValueError) as exc:
                bad.append(BadFile(path, "corrupt", f"document file is unreadable ({exc})"))
        bad += [BadFile(o.path, ORPHAN, o.why) for o in find_orphans(self.directory)]
        return [delete_bad_file(item) for item in bad] if delete else bad


class DocumentLibrary:
    """Documents by id, and names as aliases of ids; kept on a shelf: a directory, this process's memory, or Redis."""

    def __init__(self, directory: Path | None = None, *, max_documents: int = DEFAULT_MAX_DOCUMENTS,
                 shelf: Shelf | None = None):
        """Opens the library in `directory` (None: in memory only), or on `shelf`.

        Args:
            max_documents: documents the library holds at most; adding a new text beyond them is
                refused (documents already there beyond a lowered limit are kept).

        Raises:
            ConfigError: max_documents is below 1.
            StoreError: the directory cannot be created or listed.
        """
        self.max_documents = check_max_documents(max_documents)
        if shelf is None:
            shelf = FileShelf(directory) if directory is not None else MemoryShelf()
        self.shelf = shelf
        self.directory = getattr(shelf, "directory", None)
        self._docs: dict[str, Document] = {}
        self._seen: object | None = None  # the shelf's version when last read (catch_up)
        self._reload()

    def catch_up(self) -> None:
        """Reads the shelf again if another process changed it since this one read it (one cheap look when it can tell).

        A document another server removed is then gone here too, before a question uses its text.
        """
        seen, self._seen = self._seen, self.shelf.version()
        if self._seen is not None and self._seen != seen:
            self._reload()

    def _reload(self, *, strict: bool = False) -> None:
        """Replaces what this instance knows with the shelf as it is now (other processes change it too).

        A shared shelf that cannot be reached leaves what this instance read last: questions keep
        finding the documents they name while Redis is down. With `strict`, it raises
        StoreUnavailableError instead (a name not found then may well exist).
        """
        try:
            self._seen = self.shelf.version()  # before the load: a change in between is read again next time
            self._docs = self.shelf.load()
        except StoreUnavailableError:
            if strict:
                raise
            log.debug("document library unreachable: %d documents as last read", len(self._docs))

    def _change(self, edit: Edit) -> None:
        """Applies `edit` on the shelf, atomically against the documents as they are then; keeps what results."""
        def against(docs: dict[str, Document]) -> tuple[list[Document], list[str]]:
            self._docs = docs  # the checks and edits below read self._docs
            return edit(docs)

        self._docs = self.shelf.change(against)

    def __len__(self) -> int:
        return len(self._docs)

    def all(self) -> list[Document]:
        """Returns every document, oldest first."""
        return sorted(self._docs.values(), key=lambda d: (d.added, d.id))

    def get(self, doc_id: str) -> Document | None:
        return self._docs.get(doc_id)

    def stand_ins(self, doc_ids: Iterable[str]) -> dict[str, list[Document]]:
        """Returns, per id, the documents it is encoded after (pc_cpu.pml.document_layout.stand_in_places), oldest first.

        A document not in the library takes the place the next one added would.
        A document keeps the stand-ins recorded when it was added while they all are in the
        library, so removing an unrelated document does not change what its stored encoding was
        computed after (its encoding would miss, and be computed again by the next question).
        Once one of them is removed, its places in the library as it is now decide.
        """
        docs = self.all()  # sorted once for all of them: a question's TTFT pays for it
        places = {d.id: i for i, d in enumerate(docs)}

        def of(doc_id: str) -> list[Document]:
            recorded = getattr(self._docs.get(doc_id), "after", None)
            if recorded is not None and all(other in self._docs for other in recorded):
                return [self._docs[other] for other in recorded]
            return [docs[i] for i in stand_in_places(places.get(doc_id, len(docs)))]

        return {doc_id: of(doc_id) for doc_id in doc_ids}

    def resolve(self, id_or_name: str) -> Document:
        """Returns the document with this id, or the one this name is an alias of.

        Raises:
            UnknownDocumentError: nothing has this id or name.
            StoreUnavailableError: this process has not seen it, and the shared library cannot be read now.
        """
        doc = self._find(id_or_name)
        if doc is None and self.shelf.shared:
            self._reload(strict=True)  # another process may have added it since this one read the library
            doc = self._find(id_or_name)
        if doc is None:
            raise UnknownDocumentError(
                f"no document has id or name {id_or_name!r} ({len(self._docs)} documents in the library); "
                "add it first with add_document (pc-cpu ask --doc FILE, POST /v1/documents)")
        return doc

    def _find(self, id_or_name: str) -> Document | None:
        return self._docs.get(id_or_name) or next((d for d in self._docs.values() if id_or_name in d.names), None)

    def add(self, doc_id: str, text: str, name: str | None, after: Iterable[str] | None = None) -> Document:
        """Returns the document of `text`, recording it (and `name` as an alias) if new.

        `after`: the ids of the documents it was encoded after (stand_ins), kept with a new document.

        Checked and written atomically against the shelf as it is then (under the directory's
        lock; in a Redis transaction), so another process's documents and names count (see the
        module docstring).

        Raises:
            DocumentError: `name` cannot name a document (check_name), or already names a document
                with other text, in this process or another.
            DocumentLimitError: the document has MAX_NAMES_PER_DOCUMENT names and `name` is not one
                of them, or it is new and the library holds max_documents.
            StoreError: the library directory cannot be locked or written.
            StoreUnavailableError: the library is in a Redis that cannot be reached now.
        """
        check_name(name)
        after = None if after is None else list(after)
        added: list[Document] = []

        def edit(docs: dict[str, Document]) -> tuple[list[Document], list[str]]:
            self._check_room(doc_id, name)
            added[:] = [self._add(doc_id, text, name, after)]
            return added, []

        self._change(edit)
        return added[0]

    def check_room(self, doc_id: str, name: str | None) -> None:
        """Raises the DocumentError `add(doc_id, text, name)` would raise now, writing nothing.

        For a caller about to do costly work first (PromptCache.add_document encodes the text
        before adding it). It takes no lock: `add` checks again, atomically, and that check is the
        one that counts when processes add at once.
        """
        check_name(name)
        if self.shelf.shared:
            self._reload()  # another process may have added documents or names since
        self._check_room(doc_id, name)

    def _check_room(self, doc_id: str, name: str | None) -> None:
        """Raises when `name` names another document, or adding it or `doc_id` would break a limit."""
        doc = self._docs.get(doc_id)
        if name is not None:
            owner = next((d for d in self._docs.values() if name in d.names), None)
            if owner is not None and owner.id != doc_id:
                raise DocumentError(
                    f"name {name!r} already names document {owner.id} with other text; remove that document "
                    "first (remove_document, DELETE /v1/documents/{id}) or choose another name")
            if doc is not None and name not in doc.names and len(doc.names) >= MAX_NAMES_PER_DOCUMENT:
                raise DocumentLimitError(
                    f"document {doc_id} already has {len(doc.names)} names, the most a document takes "
                    f"({MAX_NAMES_PER_DOCUMENT}); reuse one of them (such as {doc.names[0]!r}), or remove the "
                    "document (remove_document, DELETE /v1/documents/{id}) and add it again under the names "
                    "you need")
        if doc is None and len(self._docs) >= self.max_documents:
            raise DocumentLimitError(
                f"the document library holds {len(self._docs):,} documents, its limit "
                f"(max_documents={self.max_documents}); remove one first (remove_document, "
                "DELETE /v1/documents/{id}, pc-cpu store rm) or raise max_documents (pc-cpu serve --max-documents)")

    def _add(self, doc_id: str, text: str, name: str | None, after: list[str] | None = None) -> Document:
        doc = self._docs.get(doc_id)
        if doc is None:
            doc = Document(doc_id, text, [], time.time(), None if after is None else list(after))
            self._docs[doc_id] = doc
        elif doc.text != text:  # two texts with one id: a hash prefix collision, never silently merged
            raise DocumentError(f"document id {doc_id} is already used by other text; this text cannot be "
                                "added under it (report it: ids are hashes of the text)")
        if name is not None and name not in doc.names:
            doc.names.append(name)
        return doc

    def remove(self, doc_id: str) -> None:
        """Forgets a document and deletes it from the shelf (atomically, as `add` changes it).

        Raises:
            StoreUnavailableError: the library is in a Redis that cannot be reached now.
        """
        self._change(lambda docs: ([], [doc_id]))

    def delete_orphans(self) -> int:
        """Returns how many temp files of interrupted writes it deleted from the library directory (0 off a directory).

        For a process about to write the library (a cache opening it): a document killed while its
        file was written is absent (registered only once the file is in place), and its temp file
        holds nothing; left in place, `pc-cpu store verify` would fail on it until someone ran
        `--delete`. Temp files of writes in progress (another process's) are left alone.
        """
        return self.shelf.delete_orphans() if isinstance(self.shelf, FileShelf) else 0

    def verify(self, *, delete: bool = False) -> list["BadFile"]:
        """Returns the library's bad files, by name: unreadable document files and orphaned temp files.

        Args:
            delete: also delete them; one that cannot be deleted comes back with deleted=False.
        """
        return self.shelf.verify(delete=delete) if isinstance(self.shelf, FileShelf) else []


def document_json(doc: Document) -> bytes:
    """Returns a document as a shelf stores it: UTF-8 JSON of id, text, names, added (and after, when recorded)."""
    record = {"id": doc.id, "text": doc.text, "names": doc.names, "added": doc.added}
    if doc.after is not None:
        record["after"] = doc.after
    return json.dumps(record, ensure_ascii=False).encode("utf-8")


def document_from_json(data: bytes | str, doc_id: str) -> Document:
    """Returns the document a shelf stored as JSON under `doc_id`.

    Raises:
        ValueError: it is not a document's JSON, or holds another id.
    """
    try:
        raw = json.loads(data)
        doc = Document(raw["id"], raw["text"], list(raw.get("names", [])), float(raw.get("added", 0)),
                       _recorded_after(raw.get("after")))
    except (KeyError, TypeError) as exc:
        raise ValueError(f"not a document file: {exc!r}") from None
    if doc.id != doc_id or not isinstance(doc.text, str):
        raise ValueError("id or text does not match the file")
    return doc


def _read_document(path: Path) -> Document:
    """Returns the document in `path`.

    Raises:
        OSError: the file cannot be read (FileNotFoundError: it is gone).
        ValueError: it is not a document file, or not the one its name says.
    """
    return document_from_json(path.read_text("utf-8"), path.stem)


def _recorded_after(value) -> list[str] | None:
    """Returns a file's recorded stand-in ids; None when absent or not a list of ids (its places decide then)."""
    if isinstance(value, list) and all(isinstance(v, str) and v.startswith(_ID_PREFIX) for v in value):
        return value
    return None
