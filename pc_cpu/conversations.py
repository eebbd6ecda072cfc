"""Gives a PromptCache its conversations: a chat request checked, laid out and handed on as one ChatWork.

A chat request's data goes one way: its messages are checked (pc_cpu.pml.chat), the documents
it names are resolved and tokenized by the document owner (pc_cpu.documents), the whole turn is
laid out once by the chat template with its documents in place (pc_cpu.pml.chat.chat_prompt),
and the scheduler runs it as a ChatWork (pc_cpu.engine.prompts.chat_prompt), which reuses the
cells of the conversation's earlier turns.
"""

from __future__ import annotations

from typing import Sequence

from pc_cpu.documents import Documents
from pc_cpu.engine.cells.cell_store import CellStore
from pc_cpu.engine.llama.context import Context
from pc_cpu.engine.llama.model import Model
from pc_cpu.engine.prompts.chat_prompt import ChatWork, ConversationCells
from pc_cpu.engine.prompts.document_prompt import DocumentWork
from pc_cpu.errors import ContextOverflowError, PromptCacheError
from pc_cpu.pml.chat import ChatMessage, ChatPrompt, ChatTemplate, chat_prompt, check_after_edit, check_messages
from pc_cpu.pml.document_layout import DocumentToPlace
from pc_cpu.store.tiers import TieredStore


class Conversations:
    """The conversations of one PromptCache: their chat template, their stored turns, and each turn's work."""

    def __init__(self, model: Model, prompts: Context, store: TieredStore, documents: Documents, *,
                 document_encoding: str):
        self.model = model
        self.template = ChatTemplate(model.chat_template(), eos_token=model.eos_text())
        self._prompts = prompts
        self._documents = documents
        self._document_encoding = document_encoding  # as `ask` encodes documents on this model
        self.cells = ConversationCells(CellStore(prompts, store), prompts.cells_id, can_cut=not model.info.n_swa,
                                       ropes=documents.encoder.ropes, workspace=documents.encoder.workspace)

    @property
    def tips(self) -> int:
        """Returns how many conversation tips (the cells up to a turn's answer) this process has stored and indexes."""
        return len(self.cells.tips)

    def prompt(self, messages: Sequence, *, add_generation_prompt: bool = True) -> ChatPrompt:
        """Returns a conversation's tokens and decode calls as `chat` lays them out (pc_cpu.pml.chat); computes nothing.

        add_generation_prompt=False lays out a finished conversation (its last message may be the
        assistant's): where a next turn finds each answer's tokens (ChatPrompt.answers).
        """
        checked = check_messages(messages, finished=not add_generation_prompt)
        return chat_prompt(checked, self.template, self.model, add_generation_prompt=add_generation_prompt)

    def work(self, messages: Sequence, *, documents: Sequence[str] | None, after_edit: str,
             use_cache: bool) -> ChatWork:
        """Returns a turn of a conversation as the scheduler runs it, its arguments checked (see PromptCache.chat).

        Raises:
            PromptError: messages or after_edit the turn cannot take (pc_cpu.pml.chat).
            ContextOverflowError: the conversation and one answer token need more positions than a prompt holds.
        """
        check_after_edit(after_edit)
        checked = check_messages(messages)
        placing = self._placing(documents, use_cache)
        prompt = chat_prompt(checked, self.template, self.model, documents=placing, n_ctx=self._prompts.n_ctx)
        if prompt.end + 1 > self._prompts.n_ctx:
            raise ContextOverflowError(
                f"the conversation is {prompt.end:,} tokens and a prompt holds {self._prompts.n_ctx:,} with its "
                "answer: drop its oldest turns (keep the system message), or raise n_ctx")

        def answered(text: str) -> ChatPrompt | None:
            try:
                return chat_prompt(checked + (ChatMessage("assistant", text),), self.template, self.model,
                                   documents=placing, n_ctx=self._prompts.n_ctx, add_generation_prompt=False)
            except PromptCacheError:
                return None

        document_work = None
        if prompt.documents is not None:
            document_work = DocumentWork(prompt.documents, self._documents.encoder, use_cache, "background")
        return ChatWork(prompt, self.cells, answered, use_cache, document_work, after_edit)

    def _placing(self, documents: Sequence[str] | None, use_cache: bool) -> list[DocumentToPlace]:
        """Returns the named documents as the first user message places them, each with its stand-ins; [] for none."""
        if not documents:
            return []
        if use_cache:
            self._documents.check_supported()
        return self._documents.placing(documents, encoding=self._document_encoding)
