"""The document library in Redis: one hash of documents that every server sharing the store reads and changes.

`RedisShelf` is a shelf of pc_cpu.store.document_library.DocumentLibrary: a hash (LIBRARY_KEY) from
document id to the document's JSON, as the file shelf writes it. A change runs the library's own
checks (a name never names two texts, the limits) inside a Redis transaction: WATCH the hash, read
it, check and edit, then MULTI/EXEC the writes; when another server changed it in between, EXEC
fails and the change runs again against what that server wrote. No client-side lock: a server
killed mid-change holds nothing. Each change also counts one more on LIBRARY_KEY:version, so a
server checks with one GET per question whether another one changed the library (catch_up).

The library is not per model: documents are texts and names, and every model sharing the Redis
sees the same ones (their cells are per model, in pc_cpu.store.remote).
"""

from __future__ import annotations

import logging

from pc_cpu.store.document_library import Document, Edit, document_from_json, document_json
from pc_cpu.store.redis_link import Link

log = logging.getLogger(__name__)

LIBRARY_KEY = "pc_cpu:library"  # and LIBRARY_KEY + ":version", the count of its changes


class RedisShelf:
    """The document library as a Redis hash, changed in WATCH/MULTI/EXEC transactions."""

    shared = True

    def __init__(self, client, link: Link, key: str = LIBRARY_KEY):
        self._client = client
        self._link = link  # the remote tier's: one outage, one warning, one pause
        self.key = key
        self.version_key = key + ":version"  # one more on every change: a server sees at one GET whether to re-read
        self._warned: set[str] = set()  # ids whose value is unreadable, already logged

    def load(self) -> dict[str, Document]:
        """Returns every document; raises StoreUnavailableError when the server cannot be reached."""
        return self._parse(self._link.require("reading the document library", lambda: self._client.hgetall(self.key)))

    def version(self) -> int | None:
        """Returns the library's change count (every change adds one); None while the server is down."""
        value = self._link.call("reading the document library's version", lambda: self._client.get(self.version_key),
                                None)
        return None if value is None else int(value)

    def change(self, edit: Edit) -> dict[str, Document]:
        """Returns every document after `edit`, run in a transaction against the hash as it is then.

        Raises:
            StoreUnavailableError: the server cannot be reached (nothing is changed).
            DocumentError: what `edit` raises (nothing is changed).
        """
        def transaction(pipe) -> dict[str, Document]:
            docs = self._parse(pipe.hgetall(self.key))  # WATCHed: a write by anyone else fails the EXEC
            saved, deleted = edit(docs)
            pipe.multi()
            for doc in saved:
                pipe.hset(self.key, doc.id, document_json(doc))
            for doc_id in deleted:
                docs.pop(doc_id, None)
                pipe.hdel(self.key, doc_id)
            pipe.incr(self.version_key)
            return docs

        return self._link.require("changing the document library",
                                  lambda: self._client.transaction(transaction, self.key, value_from_callable=True))

    def _parse(self, raw: dict[bytes, bytes]) -> dict[str, Document]:
        docs = {}
        for field, value in raw.items():
            doc_id = field.decode("utf-8", "replace")
            try:
                docs[doc_id] = document_from_json(value, doc_id)
            except (ValueError, UnicodeDecodeError) as exc:
                if doc_id not in self._warned:
                    self._warned.add(doc_id)
                    log.warning("document %s in %s is unreadable (%s); skipped", doc_id, self.key, exc)
        return docs
