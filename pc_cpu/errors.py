"""The exception tree of pc_cpu: every error a user can cause is a PromptCacheError.

Messages name the object, the limit and the fix, e.g.
"param 'duration': 7 tokens > len=5; raise len in schema 'trip'". The CLI turns
these into one-line messages in one place (pc_cpu.cli).
"""

from __future__ import annotations


class PromptCacheError(Exception):
    """Base of every error pc_cpu raises on purpose."""


class PMLError(PromptCacheError):
    """A schema or prompt document is not valid PML.

    Carries the XML line and column when they are known.
    """

    def __init__(self, message: str, *, line: int | None = None, column: int | None = None):
        self.line = line
        self.column = column
        where = f" (line {line}, column {column})" if line is not None and column is not None else (
            f" (line {line})" if line is not None else "")
        super().__init__(message + where)
        self.bare_message = message


class PMLSyntaxError(PMLError):
    """The text is not well-formed XML, or uses a refused XML feature (DTD, entities)."""


class SchemaError(PMLError):
    """A schema is well-formed XML but breaks a PML rule."""


class PromptError(PMLError):
    """A prompt does not match its schema (unknown module, union clash, bad argument...)."""


class UnknownSchemaError(PromptError):
    """A prompt names a schema that was never loaded."""


class ArgumentTooLongError(PromptError):
    """A parameter argument has more tokens than the param's len."""


class ContextOverflowError(PromptCacheError):
    """A schema or prompt needs more positions or KV cells than the context has."""


class ContextBeyondTrainingError(PromptCacheError):
    """n_ctx asks for more positions than the model was trained on (its answers past them are meaningless)."""


class ModelError(PromptCacheError):
    """No model could be found or loaded, or the model lacks a needed feature."""


class ModelLoadError(ModelError):
    """The model file exists but llama.cpp cannot load it (not a GGUF, truncated, unsupported)."""


class ConfigError(PromptCacheError):
    """An environment variable or setting has a value pc_cpu does not accept; the message lists the valid ones."""


class DataMissingError(PromptCacheError):
    """A data file a command needs (e.g. the benchmarks' evaluation sets) is missing or unreadable."""


class UnsupportedModelError(ModelError):
    """The model loads, but its architecture breaks an assumption modular caching rests on."""


class EngineError(PromptCacheError):
    """llama.cpp refused an operation; the message says what its return code means."""


class SequenceBudgetError(EngineError):
    """The context has no free sequence id left for a module or a prompt."""


class CompileError(PromptCacheError):
    """A @prompt_program function uses Python that the PML compiler cannot translate.

    Carries the Python file and line of the offending statement when known; the
    message names the construct and what is supported instead.
    """

    def __init__(self, message: str, *, filename: str | None = None, line: int | None = None):
        self.filename = filename
        self.line = line
        self.bare_message = message
        where = f"{filename or '<unknown>'}:{line}: " if line is not None else (
            f"{filename}: " if filename else "")
        super().__init__(where + message)


class StateBlobError(PromptCacheError):
    """A llama.cpp sequence-state blob is malformed, or cannot be spliced or relocated.

    ``code`` names the problem with the same word in the numpy and the native implementation
    (the pc_status names of native/pc_state.h: "truncated", "bad_magic", "unsupported",
    "argument", "corrupt", "mismatch", "overlap", "capacity", "nomem").
    """

    def __init__(self, message: str, *, code: str):
        super().__init__(message)
        self.code = code


class StoreError(PromptCacheError):
    """The module store cannot keep an entry (too large for a tier's budget, disk not writable)."""


class StoreUnavailableError(PromptCacheError):
    """A shared store (a Redis server) cannot be reached now; the message names it (its URL, password left out).

    Raised when a cache opens one that is down (without store_fallback="local"), and when what
    only the shared store may change (the document library's names) is asked while it is down;
    reading and computing cells never raise it (local tiers serve, or the cells are computed).
    The server answers it with 503.
    """


class UnknownEntryError(PromptCacheError):
    """No stored entry has the id given (or a prefix of it names several): `pc-cpu store ls` lists them.

    ``matches``: how many entries the prefix named (0: none).
    """

    def __init__(self, message: str, *, matches: int = 0):
        super().__init__(message)
        self.matches = matches


class EntryTooLargeError(StoreError):
    """An entry is larger than a tier's whole byte budget, so that tier refuses it."""


class CorruptEntryError(StoreError):
    """A store file is truncated, corrupted, of another format version, holds another key, or impossible cells.

    The disk store never lets this escape from `get`: it logs one warning, deletes the file if it
    can (the warning says whether it did) and reports a miss, so the engine re-encodes the module.
    ``reason`` is a short phrase for listings ("checksum", "cells", ...).
    """

    def __init__(self, message: str, *, reason: str):
        super().__init__(message)
        self.reason = reason


class DocumentError(PromptCacheError):
    """A document cannot be added, found or used (pc_cpu.documents); the message names it and the fix."""


class DocumentLimitError(DocumentError):
    """Adding would break a limit of the document library: name length, names per document, documents."""


class CancelledError(PromptCacheError):
    """Work was cancelled by its caller (who went away) before it finished; what it registers is left out."""


class AddCancelledError(DocumentError, CancelledError):
    """Adding a document was cancelled (its caller went away) before its encoding was stored."""


class UnknownDocumentError(DocumentError):
    """No document has this id or name."""
