"""The document library: each document's text and names, kept beside the store so that documents survive a restart.

One small JSON file per document (`<store>/documents/<id>.json`: id, text, names,
added), written atomically, so adding or removing one document never rewrites the
others and two processes sharing a store see each other's documents on open. The
text is kept because encodings can leave the byte tiers (budgets, `store rm`,
another system message): the document is then encoded again from it. Its
encodings themselves live in the tiers like every other (pc_cpu.store.tiers),
labelled `document_label(id)`.

Without a store directory (store=False) the library lives in memory only.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from pc_cpu.errors import DocumentError, StoreError, UnknownDocumentError

log = logging.getLogger(__name__)

_ID_PREFIX = "doc-"


def document_label(doc_id: str) -> str:
    """Returns the store label of a document's encodings, how `store ls` names them and `remove` finds them."""
    return f"document {doc_id}"


@dataclass
class Document:
    id: str
    text: str
    names: list[str] = field(default_factory=list)
    added: float = 0.0  # unix seconds


class DocumentLibrary:
    """Documents by id, and names as aliases of ids; persisted in `directory` when given."""

    def __init__(self, directory: Path | None):
        self.directory = directory
        self._docs: dict[str, Document] = {}
        if directory is not None:
            self._load(directory)

    def _load(self, directory: Path) -> None:
        try:
            directory.mkdir(parents=True, exist_ok=True)
            files = sorted(directory.glob(f"{_ID_PREFIX}*.json"))
        except OSError as exc:
            raise StoreError(f"cannot open the document library {directory}: {exc}; fix its permissions or "
                             "point --store elsewhere") from None
        for path in files:
            try:
                raw = json.loads(path.read_text("utf-8"))
                doc = Document(raw["id"], raw["text"], list(raw.get("names", [])), float(raw.get("added", 0)))
                if doc.id != path.stem or not isinstance(doc.text, str):
                    raise ValueError("id or text does not match the file")
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("document file %s is unreadable (%s); skipped", path, exc)
                continue
            self._docs[doc.id] = doc

    def __len__(self) -> int:
        return len(self._docs)

    def all(self) -> list[Document]:
        """Returns every document, oldest first."""
        return sorted(self._docs.values(), key=lambda d: (d.added, d.id))

    def get(self, doc_id: str) -> Document | None:
        return self._docs.get(doc_id)

    def resolve(self, id_or_name: str) -> Document:
        """Returns the document with this id, or the one this name is an alias of.

        Raises:
            UnknownDocumentError: nothing has this id or name.
        """
        doc = self._docs.get(id_or_name) or next((d for d in self._docs.values() if id_or_name in d.names), None)
        if doc is None:
            raise UnknownDocumentError(
                f"no document has id or name {id_or_name!r} ({len(self._docs)} documents in the library); "
                "add it first with add_document (pc-cpu ask --doc FILE, POST /v1/documents)")
        return doc

    def add(self, doc_id: str, text: str, name: str | None) -> Document:
        """Returns the document of `text`, recording it (and `name` as an alias) if new.

        Raises:
            DocumentError: `name` already names a document with other text.
        """
        if name is not None:
            owner = next((d for d in self._docs.values() if name in d.names), None)
            if owner is not None and owner.id != doc_id:
                raise DocumentError(
                    f"name {name!r} already names document {owner.id} with other text; remove that document "
                    "first (remove_document, DELETE /v1/documents/{id}) or choose another name")
            if name.startswith(_ID_PREFIX):
                raise DocumentError(f"name {name!r} looks like a document id; choose a name not starting with "
                                    f"{_ID_PREFIX!r}")
        doc = self._docs.get(doc_id)
        if doc is None:
            doc = Document(doc_id, text, [], time.time())
            self._docs[doc_id] = doc
        elif doc.text != text:  # two texts with one id: a hash prefix collision, never silently merged
            raise DocumentError(f"document id {doc_id} is already used by other text; this text cannot be "
                                "added under it (report it: ids are hashes of the text)")
        if name is not None and name not in doc.names:
            doc.names.append(name)
        self._save(doc)
        return doc

    def remove(self, doc_id: str) -> None:
        """Forgets a document and deletes its file."""
        self._docs.pop(doc_id, None)
        if self.directory is not None:
            try:
                (self.directory / f"{doc_id}.json").unlink(missing_ok=True)
            except OSError as exc:
                raise StoreError(f"cannot delete document {doc_id} from {self.directory}: {exc}") from None

    def _save(self, doc: Document) -> None:
        if self.directory is None:
            return
        data = json.dumps({"id": doc.id, "text": doc.text, "names": doc.names, "added": doc.added},
                          ensure_ascii=False).encode("utf-8")
        try:
            fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.directory / f"{doc.id}.json")
        except OSError as exc:
            raise StoreError(f"cannot write document {doc.id} to {self.directory}: {exc}; free space or fix "
                             "the directory's permissions") from None
