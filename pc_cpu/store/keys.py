"""The key of an encoding in every tier, and its content address (a hex digest).

An encoding's cells depend on the model, the encoding mode, and what was computed to
make them: the tokens they attended to (the preamble; in chain mode the neighbour's
encoding), their own tokens, and the positions they were computed at. The key names
exactly that (`content`, pc_cpu.pml.encoding.content_digest of it, made by whoever describes
the encoding: encoding_content for schema modules, pc_cpu.pml.document_layout for documents; both at the
encoding's home, where it is computed before it is moved into place), and nothing else: so the same module text after the same preamble is one
entry whichever schema or document library asks for it, and editing one module
leaves the keys of the others alone. Change anything the cells depend on and the key
changes, so a stale entry is never found rather than found and rejected.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

_DIGEST_TAG = "pc_cpu.store.key/2"  # bump if the digest recipe changes; old files then just miss


def schema_hash(source: str) -> str:
    """Returns the sha256 hex digest of a schema's PML source text (UTF-8)."""
    return hashlib.sha256(source.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class StoreKey:
    """Identifies one encoding by what its cells depend on; `label` only names it in listings."""

    model: str  # model fingerprint: a hash of the GGUF plus context parameters
    content: str  # content_digest of the tokens computed and their positions (see the module docstring)
    mode: str  # encoding mode (see pc_cpu.pml.encoding.ENCODING_MODES), or "document"
    label: str = field(default="", compare=False)  # e.g. "trip/paris" or "document notes.md"

    def digest(self) -> str:
        """Returns a stable 64-char sha256 hex digest of the key; the disk store's file name."""
        fields = [_DIGEST_TAG, self.model, self.content, self.mode]
        canonical = json.dumps(fields, ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    def describe(self) -> str:
        """Returns a short human label, e.g. "'trip/paris' (mode preamble, content 3f2a…, model 9b1c…)"."""
        return f"{self.label or 'encoding'!r} (mode {self.mode}, content {self.content[:8]}, model {self.model[:12]})"
