"""The key of an encoded module in the byte tiers, and its content address (a hex digest).

A key names everything the encoded state depends on: the model (its fingerprint), the schema
source (its sha256), the module, and the encoding mode. Change any of them and the key changes,
so a stale entry is never found rather than found and rejected.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

_DIGEST_TAG = "pc_cpu.store.key/1"  # bump if the digest recipe changes; old files then just miss


def schema_hash(source: str) -> str:
    """Returns the sha256 hex digest of a schema's PML source text (UTF-8)."""
    return hashlib.sha256(source.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class StoreKey:
    """Identifies one encoded module: model fingerprint, schema hash, module name, encoding mode."""

    model: str  # model fingerprint, e.g. a hash of the GGUF plus context parameters
    schema_hash: str  # schema_hash(schema source)
    module: str  # module name inside the schema
    mode: str  # encoding mode (see pc_cpu.pml.encoding.ENCODING_MODES)

    def digest(self) -> str:
        """Returns a stable 64-char sha256 hex digest of the key; the disk store's file name."""
        fields = [_DIGEST_TAG, self.model, self.schema_hash, self.module, self.mode]
        canonical = json.dumps(fields, ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    def describe(self) -> str:
        """Returns a short human label, e.g. "module 'intro' (mode scaffold, model 3f2a…)"."""
        return f"module {self.module!r} (mode {self.mode}, schema {self.schema_hash[:8]}, model {self.model[:12]})"
