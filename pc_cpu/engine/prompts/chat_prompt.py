"""A conversation as the scheduler runs it: the cells of its earlier turns reused, only the new messages computed.

Where the earlier turns' cells come from, best first:
- a free slot's stream that still holds them (the conversation's last turn, or another one
  sharing its first messages): kept up to the longest common prefix that ends on a call
  boundary (pc_cpu.pml.chat) where its cells are the full prefill's;
- a stored tip: after each answer, once the scheduler is idle, the answer is computed again as
  a full prefill computes it (one call after the cells before it), and the conversation's
  cells up to the answer's end are stored under a digest of their tokens and calls. The next
  turn finds them by its own tokens, in RAM or on disk, in this process or the next one.
  Cells up to any call boundary are the same bytes however they were made, so a turn that
  restores them and decodes the rest in the same calls answers as the full prefill does;
- nothing: the conversation is computed whole, in the full prefill's calls.

An edited or deleted earlier message: the turns before it are reused as above, and by default
everything after it is computed again (exact). With after_edit="reuse" the turns after it are
reused too: runs of the earlier stream that the edited conversation holds again (pml.chat.moved_runs)
are cut from it and moved to their new positions (positions rewritten, K re-rotated, as documents
are moved), and only the edited message and the new turn are computed. Those moved cells were
computed after the old message, so the answer is not the full prefill's (bench/RESULTS.md,
"Conversations", measures how far); the idle repair then computes them again, so the turn after
next is exact once more.

Exactness: a turn answers token for token as the full prefill of the same messages, because it
keeps only cells that are the full prefill's. An answer's cells as generated are not: they were
computed one token at a time, and llama.cpp's CPU kernels give other bits for one row than for a
batch, so a near-tie can go the other way. The repair (a decode of the answer's tokens as one call
while nothing else runs, a fraction of a second) makes them so; a turn sent before it (back to
back) computes the answer again itself, in the same call. after_edit="reuse" accepts cells that
are not the full prefill's, the answer's as generated included: faster, not exact
(bench/RESULTS.md, "Conversations", measures how often answers differ).
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Sequence

from pc_cpu.engine.cells.cell_store import CellStore
from pc_cpu.engine.prompts.document_prompt import DocumentWork
from pc_cpu.engine.cells import relocate
from pc_cpu.engine.cells.relocate import Rope
from pc_cpu.engine.runtime.prompt_work import Answer, Counts, Head, IdleTask
from pc_cpu.kvstate import ops
from pc_cpu.pml.content_keys import answer_digest, prefix_digests
from pc_cpu.pml.chat import CHAT_MODE, MIN_MOVED_TOKENS, ChatPrompt, MovedRun, common_prefix, moved_runs
from pc_cpu.result import Tier
from pc_cpu.store.keys import StoreKey

CONVERSATION = "#conversation"  # the key of a conversation's history in a Result's tiers
# The repair waits this long after an answer: a client that sends its next turn at once (a script,
# an agent) computes the answer again in that turn, without first waiting for a repair that does
# the same; a person reading the answer leaves far more time than this.
REPAIR_DELAY_S = 0.25
_HEAD = "chat"  # the first field of a conversation's Head: (_HEAD, how, tokens, exact_until)
ASSEMBLED = "documents"  # `how` of cells whose documents were encoded apart and moved (pml.content_keys.prefix_digests)


@dataclass(frozen=True)
class Found:
    """Stored cells that serve a turn: a tip's blob, how many of its cells the turn keeps, its tier, how they were made."""

    blob: bytes
    keep: int
    tier: Tier
    how: str
    tokens: Sequence[int] | None = None  # the tip's tokens, when it holds more than the `keep` the turn shares


@dataclass(frozen=True)
class Tip:
    """A stored tip as this process knows it: its key, its cells' count and their tokens."""

    key: StoreKey
    end: int
    tokens: array  # array("i"): 4 bytes a token, where a tuple of ints takes ~36


class TipIndex:
    """The tips stored by this process, by the digests of the prefixes and the answers they hold; the newest MAX_TIPS.

    A digest names the newest tip that holds it. Older tips are forgotten beyond MAX_TIPS (their
    cells stay in the tiers, under their own keys), so a server's index does not grow without end.
    """

    MAX_TIPS = 4096

    def __init__(self):
        self._tips: OrderedDict[StoreKey, tuple[Tip, tuple[str, ...]]] = OrderedDict()  # oldest first
        self._prefixes: dict[str, Tip] = {}  # digest of a prefix (pml.content_keys.prefix_digests) -> the tip holding it
        self._answers: dict[str, Tip] = {}  # digest of an answer's tokens (pml.content_keys.answer_digest) -> likewise

    def add(self, tip: Tip, prefixes: tuple[str, ...], answers: tuple[str, ...]) -> None:
        self._tips.pop(tip.key, None)
        self._tips[tip.key] = (tip, prefixes + answers)
        self._prefixes.update(dict.fromkeys(prefixes, tip))
        self._answers.update(dict.fromkeys(answers, tip))
        while len(self._tips) > self.MAX_TIPS:
            old, digests = self._tips.popitem(last=False)[1]
            for index in (self._prefixes, self._answers):
                for digest in digests:
                    if index.get(digest) is old:
                        del index[digest]

    def __len__(self) -> int:
        """Returns how many tips the index holds."""
        return len(self._tips)

    def holding_prefix(self, digest: str) -> Tip | None:
        return self._prefixes.get(digest)

    def holding_answer(self, digest: str) -> Tip | None:
        return self._answers.get(digest)


class ConversationCells:
    """Finds and keeps conversations' cells in the byte tiers: tips keyed by their tokens and calls.

    A tip is stored once per turn, and the tips it extends are dropped (their cells are its
    first cells): a conversation costs its cells once, however many turns it has. Their keys
    stay findable in this process through `tips` (TipIndex), so an edited conversation still
    restores the turns before the edit; a new process finds a conversation by its latest tip.
    """

    def __init__(self, cells: CellStore, model_id: str, *, can_cut: bool, ropes: Rope = None,
                 workspace: int | None = None):
        self.cells = cells
        self.model_id = model_id
        self.can_cut = can_cut  # False on sliding-window models: a stream cut short misses window cells
        self.ropes = ropes  # to move cut cells (after_edit="reuse") by the relocator; None: by llama.cpp
        self.workspace = workspace  # the free stream llama.cpp moves cells in; None: cells are never moved
        self.tips = TipIndex()

    @property
    def can_move(self) -> bool:
        """Returns whether cells cut from a stream can be moved to other positions (after_edit="reuse")."""
        prompts = self.cells.prompts
        return self.can_cut and self.workspace is not None and (self.ropes is not None or prompts.can_shift)

    def key(self, digest: str, n_tokens: int) -> StoreKey:
        return StoreKey(self.model_id, digest, CHAT_MODE, label=f"conversation ({n_tokens} tokens)")

    def find(self, prompt: ChatPrompt, *, at_least: int = 0) -> Found | None:
        """Returns the stored cells that serve most of `prompt` (up to a call boundary past `at_least`), or None."""
        for cut, digest, how in self._prefixes(prompt, at_least):
            found = self._stored(digest, cut)
            if found is not None:
                return Found(found[0], cut, found[1], how, found[2])
        return None

    def reach(self, prompt: ChatPrompt, *, at_least: int = 0) -> int:
        """Returns how many of `prompt`'s first tokens a stored tip would serve (`find` without reading it); 0 for none."""
        for cut, digest, _ in self._prefixes(prompt, at_least):
            if self.cells.contains(self.key(digest, cut)):
                return cut
            tip = self.tips.holding_prefix(digest)
            if tip is not None and self.can_cut and self.cells.contains(tip.key):
                return cut
        return 0

    @staticmethod
    def _prefixes(prompt: ChatPrompt, at_least: int):
        """Yields (cut, digest, how) of `prompt`'s prefixes ending on a call boundary past `at_least`, longest first."""
        cuts = sorted((cut for cut in prompt.cuts if cut > at_least), reverse=True)
        for how in ("", ASSEMBLED) if prompt.documents is not None else ("",):
            digests = prefix_digests(prompt.tokens, prompt.cuts, cuts, how=how)
            for cut in cuts:
                yield cut, digests[cut], how

    def find_edited(self, prompt: ChatPrompt) -> Found | None:
        """Returns a stored tip holding one of `prompt`'s answers (its latest found), kept up to the prefix they share; or None.

        For after_edit="reuse": the turns after an edit lie in such a tip, at other positions.
        """
        if not self.can_move or prompt.documents is not None:
            return None
        for lo, hi in reversed(prompt.answers):
            tip = self.tips.holding_answer(answer_digest(prompt.tokens[lo:hi]))
            stored = None if tip is None else self.cells.get(tip.key, (0, tip.end))
            if stored is not None:
                keep = prompt.cut_at_or_before(common_prefix(tip.tokens, prompt.tokens, prompt.end - 1))
                return Found(stored[0], keep, stored[1], "", tip.tokens)
        return None

    def _stored(self, digest: str, cut: int) -> tuple[bytes, Tier, Sequence[int] | None] | None:
        """Returns the cells of a tip holding the prefix `digest` (`cut` tokens), their tier and the tip's tokens; or None.

        The tokens are None when the tip is the prefix itself.
        """
        stored = self.cells.get(self.key(digest, cut), (0, cut))
        if stored is not None:
            return stored + (None,)
        tip = self.tips.holding_prefix(digest)
        if tip is None or not self.can_cut:
            return None
        stored = self.cells.get(tip.key, (0, tip.end))
        return None if stored is None else stored + (tip.tokens,)

    def save(self, prompt: ChatPrompt, end: int, slot: int, how: str) -> None:
        """Stores stream `slot`'s cells, `prompt`'s first `end`, as a tip; drops the stored tips it extends."""
        cuts = tuple(cut for cut in prompt.cuts if cut < end)
        digests = prefix_digests(prompt.tokens, cuts, cuts + (end,), how=how)
        tip = self.key(digests[end], end)
        self.cells.put(tip, slot, end, (0, end))
        answers = () if prompt.documents is not None else tuple(  # found by answers: conversations without documents
            answer_digest(prompt.tokens[lo:hi]) for lo, hi in prompt.answers if hi <= end)
        self.tips.add(Tip(tip, end, array("i", prompt.tokens[:end])), tuple(digests.values()), answers)
        for cut in cuts:
            older = self.key(digests[cut], cut)
            if self.can_cut and self.cells.contains(older):
                self.cells.remove(older)

    def moved_cells(self, slot: int, runs: tuple[MovedRun, ...], keep: int) -> list:
        """Returns each run's cells, cut from stream `slot` and moved to its new positions; `slot` then holds its first `keep`.

        One-stream blobs, in the order of `runs`. `slot` serves as the free stream that cutting
        and moving need while its cells are out.
        """
        prompts = self.cells.prompts
        if not runs:
            prompts.seq_rm(slot, keep, -1)
            return []
        whole = ops.restream(prompts.state_get(slot), 1)
        prompts.seq_rm(slot)
        moved = [relocate.move(prompts, relocate.cut(prompts, whole, run.old_start, run.old_end, seq=slot), run.delta,
                               self.ropes, seq=self.workspace, empty=slot) for run in runs]
        self.cells.restore(whole, slot)
        prompts.seq_rm(slot, keep, -1)
        return moved


@dataclass
class ChatWork:
    """A turn of a conversation (a pc_cpu.engine.runtime.prompt_work.PromptWork)."""

    prompt: ChatPrompt
    cells: ConversationCells
    answered: Callable[[str], ChatPrompt | None]  # the next turn's history once this answer is sent back as text
    use_cache: bool
    documents: DocumentWork | None = None  # the documents' cells as `ask` makes them, when nothing stored has them
    after_edit: str = "recompute"  # pml.chat.AFTER_EDIT: "reuse" moves the turns after an edited message
    _found: Found | None = None
    _kept: int = 0  # cells reused: restored or held
    _exact_until: int = 0  # after prefill: the cells before it are the full prefill's (or, `how`, as made here)
    _how: str = ""  # how the cells were made (ASSEMBLED: documents encoded apart); "" as the full prefill
    _runs: dict = field(default_factory=dict)  # _moved_runs' answers: (id of the tokens, keep) -> (tokens, runs)
    _stored_reach: int | None = None  # how far a stored tip serves the prompt (asked once, for every held stream)

    def positions(self) -> int:
        return self.prompt.end

    def prepare(self) -> dict[str, Tier]:
        if not self.use_cache:
            return {}
        self._found = self.cells.find(self.prompt, at_least=self.prompt.documents_end - 1)
        if self.after_edit == "reuse":
            self._found = max((self._found, self.cells.find_edited(self.prompt)), key=self._reused_from, default=None)
        if self._found is None and self.documents is not None:
            return {**self.documents.prepare(), CONVERSATION: Tier.ENCODED}
        return {CONVERSATION: self._found.tier if self._found else Tier.ENCODED}

    def prefill(self, slot: int) -> int:
        prompts = self.cells.cells.prompts
        prompts.seq_rm(slot)
        found, self._found = self._found, None
        start, self._how = 0, ""
        self._exact_until = self.prompt.end
        if found is not None:
            self.cells.cells.restore(found.blob, slot)
            self._how = found.how
            return self._continue(slot, found.keep, found.tokens)
        if self.documents is not None and self.use_cache:  # the documents' cells as `ask` has them
            start = self.documents.prefill(slot)
            self._how = "" if self.documents.exact else ASSEMBLED
        self._kept = start
        return self._decode_from(slot, start)

    def _continue(self, slot: int, keep: int, held: Sequence[int] | None) -> int:
        """Decodes the prompt after its first `keep` cells in stream `slot`; returns its end.

        `slot` holds the cells of `held` (an earlier stream's tokens; None: exactly the first
        `keep`). With after_edit="reuse", the runs of `held` after `keep` that the prompt holds
        again are moved into place instead of computed, and the cells from `keep` on are no
        longer the full prefill's.
        """
        prompts = self.cells.cells.prompts
        runs = self._moved_runs(held, keep)
        if not runs:
            prompts.seq_rm(slot, keep, -1)
            self._kept = keep
            return self._decode_from(slot, keep)
        self._exact_until = min(self._exact_until, keep)
        in_place = keep
        if runs[0].delta == 0 and runs[0].old_start == keep:  # the unchanged text before the edit: kept where it is
            in_place, runs = runs[0].new_end, runs[1:]
        moved = self.cells.moved_cells(slot, runs, in_place)
        tokens, cursor = self.prompt.tokens, in_place
        for run, cells in zip(runs, moved):
            if cursor < run.new_start:
                prompts.decode(tokens[cursor:run.new_start], range(cursor, run.new_start), slot, logits_last=False)
            before = ops.restream(prompts.state_get(slot), 1)
            prompts.state_set(slot, ops.restore_blob([before, cells], prompts.n_stream))
            cursor = run.new_end
        prompts.decode(tokens[cursor:self.prompt.end], range(cursor, self.prompt.end), slot)
        self._kept = in_place + sum(run.length for run in runs)
        return self.prompt.end

    def _moved_runs(self, held: Sequence[int] | None, keep: int) -> tuple[MovedRun, ...]:
        """Returns the runs of `held` after `keep` that this prompt reuses moved (after_edit="reuse"), else ()."""
        if self.after_edit != "reuse" or held is None or not self.cells.can_move or keep < self.prompt.documents_end:
            return ()
        # Asked for each free slot's stream (reusable), then again by prefill: difflib runs once for each.
        # The tokens are kept beside their runs, so that their id is not reused while the entry lives.
        key = (id(held), keep)
        if key not in self._runs:
            # The last token is computed: its logits.
            self._runs[key] = (held, moved_runs(held, self.prompt.tokens, keep, self.prompt.end - 1))
        return self._runs[key][1]

    def _decode_from(self, slot: int, start: int) -> int:
        """Decodes the prompt from `start` in stream `slot`, in its calls (the first cut at `start`); returns its end."""
        prompts, tokens = self.cells.cells.prompts, self.prompt.tokens
        calls = self.prompt.calls_from(start)
        for i, (lo, hi) in enumerate(calls):
            prompts.decode(tokens[lo:hi], range(lo, hi), slot, logits_last=i == len(calls) - 1)
        return self.prompt.end

    def head(self) -> Head | None:
        return None  # reused by common prefix (reusable), not by an equal head

    def _reused_from(self, found: Found | None) -> int:
        """Returns how many of the prompt's cells `found` serves (kept and moved); 0 for None."""
        if found is None:
            return 0
        return found.keep + sum(run.length for run in self._moved_runs(found.tokens, found.keep))

    def reusable(self, held: Head) -> int:
        keep = self._reuse(held)
        if keep is None:
            return 0
        runs = self._moved_runs(held.cells[2], keep)
        if not keep and all(run.length < MIN_MOVED_TOKENS for run in runs):
            return 0  # a stream sharing a few tokens of markup: a stored tip may serve far more (prepare)
        reused = keep + sum(run.length for run in runs)
        # Another conversation's stream sharing only the first messages (an agent's system prompt and
        # tools) must not win over this conversation's own tip in RAM or on disk, which serves more.
        return 0 if self._tip_reach() > reused else reused

    def _tip_reach(self) -> int:
        if self._stored_reach is None:
            self._stored_reach = self.cells.reach(self.prompt, at_least=self.prompt.documents_end - 1) \
                if self.use_cache else 0
        return self._stored_reach

    def _reuse(self, held: Head) -> int | None:
        """Returns how many of the held cells this turn keeps as the full prefill's, or None when it can keep none."""
        if not self.use_cache or not held.cells or held.cells[0] != _HEAD:
            return None
        _, _, tokens, exact_until = held.cells
        prompt = self.prompt
        lcp = common_prefix(tokens, prompt.tokens, prompt.end - 1)  # the last token is computed: its logits
        # Kept up to the last call boundary where the cells are still the full prefill's: cells after it
        # (an answer's as generated, not repaired yet; cells moved after an edit) are computed again, as
        # the repair would compute them, unless after_edit="reuse" keeps them in place (_continue).
        keep = prompt.cut_at_or_before(min(lcp, exact_until))
        if (not self.cells.can_cut and keep != len(tokens)) or keep < prompt.documents_end:
            return None  # documents are made whole (prepare), never from part of a stream
        return keep

    def prefill_tail(self, slot: int, held: Head) -> int:
        self._exact_until = self.prompt.end
        self._how = held.cells[1]
        return self._continue(slot, self._reuse(held), held.cells[2])

    def held_tiers(self) -> dict[str, Tier]:
        return {CONVERSATION: Tier.CONTEXT}

    def counts(self) -> Counts:
        if not self.use_cache:
            return Counts(0, self.prompt.end, ())
        return Counts(self._kept, self.prompt.end - self._kept, ())

    def kept_head(self, answer: Answer) -> Head | None:
        if not self.use_cache:
            return None  # the baseline leaves nothing behind: a cached turn after it must not find its cells
        tokens = self.prompt.tokens + answer.tokens[:answer.decoded]
        return Head((_HEAD, self._how, tokens, min(self._exact_until, len(tokens))), len(tokens))

    def idle_task(self, answer: Answer) -> IdleTask | None:
        """Returns the repair of this turn: its answer computed again as the full prefill does, then stored; or None.

        None for the baseline, a cancelled answer, an empty one, or a template whose next turn does
        not start with this one's tokens and the answer (nothing would reuse the repair).
        """
        if not self.use_cache or answer.finish_reason == "cancelled" or not answer.text:
            return None
        following = self.answered(answer.text)
        prompt = self.prompt
        if (following is None or not following.answers or following.answers[-1][0] != prompt.end
                or following.tokens[:prompt.end] != prompt.tokens):
            return None
        end = following.answers[-1][1]
        start = self._exact_until
        tokens, cells, how = following.tokens[:end], self.cells, self._how

        def save(slot: int) -> Head:
            cells.save(following, end, slot, how)
            return Head((_HEAD, how, tokens, end), end)

        def stopped(done: int) -> Head:
            return Head((_HEAD, how, tokens[:done], done), done)

        return IdleTask(("conversation", tokens), tokens[start:], save, start=start,
                        base=self.kept_head(answer), calls=tuple(c for c in following.cuts if start < c < end),
                        stopped=stopped, delay=REPAIR_DELAY_S)
