"""Gives a PromptCache its documents: the library, their tokens, their encoders, and their removal, in one owner.

Four layers each hold one side of a document, and this module is the one place that joins them:
- pc_cpu.pml.document_layout lays a question over documents out (pure: tokens and positions);
- pc_cpu.store.document_library keeps the library of texts and names beside the disk tier, and removes
  a document with its encodings (also without a model: `pc-cpu store rm`);
- pc_cpu.engine.prompts.document_cells finds or computes the documents' cells and assembles a prompt from them;
- this owner ties them to one model and one pair of contexts, for the façade (PromptCache's
  add_document, ask, remove_document), the CLI and the server.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Sequence

from pc_cpu.engine.prompts.document_prompt import DocumentWork
from pc_cpu.engine.prompts.document_cells import DocumentEncoder
from pc_cpu.engine.recompute.recompute_pass import LibraryRoom
from pc_cpu.engine.llama.model import Model
from pc_cpu.engine.recompute.probe import Probe
from pc_cpu.engine.llama.context import Context
from pc_cpu.engine.llama.sequences import SequenceRoles
from pc_cpu.engine.runtime.locks import FairLock
from pc_cpu import document_settings
from pc_cpu.errors import AddCancelledError, ContextOverflowError, DocumentError, PromptCacheError
from pc_cpu.kvstate.rope import RopeParams
from pc_cpu.pml.document_layout import (NO_TEXT, DocumentPrompt, DocumentToPlace, check_document_policy,
                                        check_encoding, check_prefix, check_question, document_id, document_tokens, has_text, order_documents,
                                        place_documents, preamble_tokens, stand_ins, tail_tokens, with_recompute)
from pc_cpu.pml.recompute import RecomputePolicy, parse_policy
from pc_cpu.pml.roles import RoleMarkup
from pc_cpu.progress import ProgressCallback, ProgressTracker, check_cancel
from pc_cpu.result import AddedDocument, Tier
from pc_cpu.store.document_library import Document, DocumentLibrary, check_name, remove_document, stand_ins_label
from pc_cpu.store.tiers import TieredStore

TOKENS_KEPT = 4096  # documents whose tokens are kept (~1 KB each at 150 tokens)

# Called after each batch of n tokens a long encoding computed: reports progress, may raise to stop,
# and gives running prompts their turn (PromptCache._after_batch).
AfterBatch = Callable[[int], None]


@dataclass(frozen=True)
class NewDocument:
    """A document checked for adding: its id, text and name, its tokens, and the preamble it is encoded after."""

    id: str
    text: str
    name: str | None
    tokens: tuple[int, ...]
    preamble: tuple[int, ...]


class Documents:
    """The documents of one PromptCache: their library, tokens and encoders, on one model and its prompt context."""

    def __init__(self, model: Model, markup: RoleMarkup, prompts: Context, roles: SequenceRoles, store: TieredStore,
                 ropes: tuple[RopeParams, ...] | None, lock: FairLock, *, library: DocumentLibrary,
                 library_room: LibraryRoom | None = None, probe: Callable[[], Probe] | None = None):
        self.model = model
        self._lock = lock  # the façade's: library reads and the encoder's calls hold it
        self.markup = markup
        self.prompts = prompts
        self.store = store
        self.library = library  # pc_cpu.opening.open_library: beside the disk tier, in memory, or in a shared Redis
        self.library.delete_orphans()  # this cache writes it: cleans up after a process killed mid-add
        # Questions are assembled in the encoder's workspace; add_document computes in a stream of its
        # own, batch by batch between the scheduler's steps, so it never waits for the workspace.
        # library_room: the library context's sequences a question borrows to recompute its runs in one pass;
        # probe: the model's first layers, loaded on first use, with which "select:" chooses what to recompute.
        self.encoder = DocumentEncoder(prompts, roles.workspace, store, ropes, library_room, probe)
        self._probe = probe
        self.adder = DocumentEncoder(prompts, roles.adder, store, ropes)
        self._tokens: dict[str, tuple[int, ...]] = {}  # document id -> tokens, least recently used first
        self._tokens_lock = threading.Lock()  # server threads ask concurrently

    @property
    def encoded(self) -> int:
        """Returns how many preambles and documents this owner computed (a warm store keeps it at 0)."""
        return self.encoder.encoded + self.adder.encoded

    def check_supported(self) -> None:
        """Raises DocumentError when this model's cells cannot be moved, so documents cannot be placed."""
        self.encoder.check_supported()

    # --- texts and tokens ---------------------------------------------------------

    def tokens(self, text: str) -> tuple[int, ...]:
        """Returns the tokens a document's text contributes to a prompt, tokenized once per text.

        Every question over a document needs them, and tokenizing five ~150-token documents
        again took ~3 ms of each question's TTFT.
        """
        key = document_id(text)  # a hash of the text: a key that never goes stale
        with self._tokens_lock:
            tokens = self._tokens.pop(key, None)
        if tokens is None:
            tokens = document_tokens(text, self.model)
        with self._tokens_lock:
            self._tokens[key] = tokens  # most recently used last
            while len(self._tokens) > TOKENS_KEPT:
                del self._tokens[next(iter(self._tokens))]
        return tokens

    def placing(self, documents: Sequence[str], *, encoding: str) -> list[DocumentToPlace]:
        """Returns the documents of these ids or names as a prompt places them: tokens, and for "library" their stand-ins.

        The library is read under the façade's lock; tokenizing needs no lock and waits for no step.
        """
        with self._lock:
            docs = self.resolve(documents)
            before = self.library.stand_ins(doc.id for doc in docs) if encoding == "library" else {}
        return [DocumentToPlace(doc.id, self.tokens(doc.text),
                                tuple((d.id, self.tokens(d.text)) for d in before.get(doc.id, ())))
                for doc in docs]

    def cells(self, document: str, *, system: str | None = None) -> bytes:
        """Returns a document's cells as computed after the system message alone (its home), as a state blob.

        `document`: an id or name of the library. The cells come from the tiers, or are computed
        (and stored) if no tier holds them: the bytes a prompt placing the document first restores.
        """
        with self._lock:
            (doc,) = self.resolve([document])
            preamble = preamble_tokens(system, self.model, self.markup)
            blob, _ = self.encoder.document_blob(preamble, doc.id, self.tokens(doc.text))
            return blob

    def prompt(self, question: str, texts: Sequence[str], *, system: str | None = None,
               names: Sequence[str] | None = None, order: str = "given",
               placing: Sequence[DocumentToPlace] | None = None) -> DocumentPrompt:
        """Returns the layout of `question` over documents of these texts, as `ask` lays it out; encodes nothing.

        It only tokenizes (once per text: `add_document` and `ask` reuse the tokens), so a caller
        can refuse a question that cannot fit before spending minutes encoding its documents.
        `placing`: the documents as `placing()` gives them (with their stand-ins, for
        encoding="library"), instead of `texts`; None: `texts`, each encoded after the preamble alone.
        `order`: "given", "relevant-first" or "relevant-last" (pc_cpu.pml.document_layout.order_documents).

        Raises:
            PromptCacheError: an empty question.
            ContextOverflowError: the prompt and one answer token need more positions than a prompt holds (n_ctx).
        """
        check_question(question)
        if placing is None:
            placing = [DocumentToPlace(document_id(text), self.tokens(text)) for text in texts]
        by_id = {doc.id: doc for doc in placing}
        tail = tail_tokens(question, self.model, self.markup)
        ordered = order_documents([(doc.id, doc.tokens) for doc in placing], tail, order)
        prompt = place_documents(preamble_tokens(system, self.model, self.markup),
                                 [by_id[doc_id] for doc_id, _ in ordered], tail, self.prompts.n_ctx)
        if prompt.end >= self.prompts.n_ctx:  # one more position for the first answer token
            raise ContextOverflowError(_overflow_message(prompt, list(names or by_id), self.prompts.n_ctx,
                                                         self.model.info.n_ctx_train))
        return prompt

    def resolve(self, documents: Sequence[str]) -> list[Document]:
        """Returns the library's documents of these ids or names, in the order given."""
        if isinstance(documents, str):
            raise DocumentError("documents must be a list of ids or names, not one string; e.g. documents=[id]")
        self.library.catch_up()  # another server sharing the Redis may have removed or renamed one
        return [self.library.resolve(d) for d in documents]

    def work(self, question: str, placing: Sequence[DocumentToPlace], *, names: Sequence[str], system: str | None,
             order: str, policy: RecomputePolicy, use_cache: bool, prefix: str = "off") -> DocumentWork:
        """Returns the question over the documents `placing` gives (`names` as the caller gave them) as the scheduler runs it.

        Only tokenizes the question (the documents' tokens are kept): it needs no context lock.
        `prefix`: when the exact prefix is computed and used (pc_cpu.pml.document_layout.PREFIXES).
        """
        if use_cache:
            self.check_supported()
        prompt = self.prompt(question, (), system=system, names=list(names), order=order, placing=placing)
        if use_cache:
            prompt = with_recompute(prompt, policy)
        return DocumentWork(prompt, self.encoder, use_cache, check_prefix(prefix))

    def default_encoding(self) -> str:
        """Returns the encoding questions over documents take on this model unless told otherwise (its "fast" setting's)."""
        return document_settings.settings_for(self.model.path.name).fast.encoding

    def question(self, question: str, documents: Sequence[str], *, system: str | None, order: str | None,
                 setting: str | None, recompute, prefix: str | None, encoding: str | None,
                 use_cache: bool) -> DocumentWork:
        """Returns the question over `documents` (ids or names) as `ask` runs it, its arguments checked (see PromptCache.ask)."""
        recompute, order, prefix, encoding = self._setting(setting, recompute, order, prefix, encoding)
        policy = check_document_policy(parse_policy(recompute))  # refused even for the baseline
        check_prefix(prefix)  # likewise
        check_encoding(encoding)
        placing = self.placing(documents, encoding=encoding)
        if policy.select and use_cache and self._probe is not None:
            with self._lock:  # the probe loads in the library context
                self._probe()  # here, so that a failure is the caller's
        return self.work(question, placing, names=documents, system=system, order=order, policy=policy,
                         use_cache=use_cache, prefix=prefix)

    def _setting(self, setting: str | None, recompute, order: str | None, prefix: str | None,
                 encoding: str | None) -> tuple:
        """Returns the (recompute, order, prefix, encoding) `ask` uses: the named setting's for this model, else the ones given.

        A prefix or encoding given wins over the setting's (a benchmark measuring the setting on
        documents encoded apart gives prefix "off"). Without a setting, the encoding is the one
        measured best on this model (its "fast" setting's).
        """
        if setting is None:
            return recompute, order or "given", prefix or "background", encoding or self.default_encoding()
        if recompute is not None or order is not None:
            raise PromptCacheError(f"setting={setting!r} chooses recompute and order itself; give either setting "
                                   "or recompute/order, not both")
        chosen = document_settings.setting(self.model.path.name, setting)
        return chosen.recompute, chosen.order, prefix or chosen.prefix, encoding or chosen.encoding

    # --- adding and removing ------------------------------------------------------

    def check_addable(self, text: str, name: str | None, system: str | None) -> NewDocument:
        """Returns the document to add, tokenized and checked; raises why it cannot be added.

        Runs before the encoding, and before waiting for the adder's stream: a refusal should not cost minutes.
        """
        check_name(name)  # first: the messages below show it
        if not isinstance(text, str) or not has_text(text):
            raise DocumentError(f"document {name or '(unnamed)'} is empty: {NO_TEXT}; give it some text")
        self.check_supported()
        tokens = self.tokens(text)
        preamble = preamble_tokens(system, self.model, self.markup)
        n_ctx = self.prompts.n_ctx
        room = n_ctx - len(preamble) - 1
        if room < 1:  # the system message alone fills a prompt: the document is not what is too long
            raise DocumentError(
                f"the system message of document {name or document_id(text)} is {len(preamble)} tokens with its "
                f"markup, and a prompt holds {n_ctx} positions: no room is left for the document; shorten the "
                "system message or raise n_ctx")
        if len(tokens) > room:
            raise DocumentError(
                f"document {name or document_id(text)} has {len(tokens)} tokens but a prompt holds {n_ctx} "
                f"positions, {room} of them after the preamble and before one generated token; split the "
                "document or raise n_ctx")
        doc_id = document_id(text)
        self.library.check_room(doc_id, name)
        return NewDocument(doc_id, text, name, tokens, preamble)

    def add(self, new: NewDocument, *, encoding: str, pace: Callable[[AfterBatch], AfterBatch],
            progress: ProgressCallback | None, cancel: threading.Event | None) -> AddedDocument:
        """Returns the id of the document, with the tiers that served it, once its encodings are stored and it is registered.

        `encoding`: the one the model's questions take by default (pc_cpu.document_settings).
        "library" computes both a prompt can give the document: after the preamble alone (the
        first document of a prompt) and after its stand-ins (every other place), so a question
        computes neither. "preamble" computes the first only; a question asking for
        encoding="library" then computes the other on first use, and stores it.
        `pace(report)` gives the callback the encoder calls after each batch (PromptCache._paced);
        the caller holds the adder's stream and the context lock around this call.
        """
        check_encoding(encoding)
        label = new.name or new.id
        before = self.library.stand_ins([new.id])[new.id]
        after: tuple[int, ...] = ()
        if encoding == "library":
            room = self.prompts.n_ctx - len(new.preamble) - len(new.tokens) - 1
            after = stand_ins([self.tokens(d.text) for d in before], room)
        contexts = (new.preamble, new.preamble + after) if after else (new.preamble,)
        context_label = stand_ins_label(d.id for d in before)
        tracker = ProgressTracker(label, {new.id: len(new.tokens) * len(contexts)}, progress, kind="document")

        def report(n: int) -> None:
            tracker.computed(new.id, n)
            check_cancel(cancel, f"adding document {label}", "nothing was registered", AddCancelledError)

        preamble: dict[str, Tier] = {}
        tiers = [self.adder.document_blob(context, new.id, new.tokens, on_computed=pace(report),
                                          served=None if i else preamble, context_label=context_label if i else None)[1]
                 for i, context in enumerate(contexts)]
        self.library.add(new.id, new.text, new.name, after=[d.id for d in before])
        tier = tiers[0]
        if Tier.ENCODED in tiers:
            tracker.finished(new.id)
        return AddedDocument(new.id, {new.id: tier, **preamble})

    def remove(self, id_or_name: str) -> Document:
        """Returns the document it forgot, after deleting its encodings from every tier and its library entry.

        Raises:
            UnknownDocumentError: nothing has this id or name.
        """
        doc = self.library.resolve(id_or_name)
        remove_document(self.library, self.store.tiers, doc.id)
        with self._tokens_lock:
            self._tokens.pop(doc.id, None)
        return doc


def _overflow_message(prompt: DocumentPrompt, names: list[str], n_ctx: int, trained: int) -> str:
    """Returns why a question over documents does not fit: the documents' tokens, the longest, the limit, the fix."""
    sizes = [len(doc.tokens) for doc in prompt.documents]
    total = sum(sizes)
    longest = max(range(len(sizes)), key=sizes.__getitem__, default=None)
    docs = (f"{len(sizes)} document{'s' if len(sizes) != 1 else ''} ({total:,} tokens"
            + (f"; the longest, {names[longest]!r}, {sizes[longest]:,})" if longest is not None else ")"))
    if trained and trained <= n_ctx:  # already all the model takes
        fix = "use a model trained on a longer context"
    else:
        fix = "raise n_ctx" + (f" (up to {trained:,}, the model's training context)" if trained else "")
    return (f"a question over {docs} needs {prompt.end:,} positions with the system message and question "
            f"({prompt.end - total:,}), and one more to answer, but a prompt holds {n_ctx:,}; ask with fewer or "
            f"shorter documents, or {fix}")
