"""Gives a PromptCache its conversations: a chat request checked, laid out and handed on as one ChatWork.

A chat request's data goes one way: its messages are checked (pc_cpu.pml.chat), the documents
it names are resolved and tokenized by the document owner (pc_cpu.documents), the whole turn is
laid out once by the chat template with its documents in place (pc_cpu.pml.chat.chat_prompt),
and the scheduler runs it as a ChatWork (pc_cpu.engine.prompts.chat_prompt), which reuses the
cells of the conversation's earlier turns.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Sequence

from pc_cpu.documents import Documents
from pc_cpu.engine.cells.cell_store import CellStore
from pc_cpu.engine.llama.context import Context
from pc_cpu.engine.llama.grammar import tool_call_grammar
from pc_cpu.engine.llama.model import Model
from pc_cpu.engine.llama.sampler import Sampler, SamplingParams
from pc_cpu.engine.prompts.chat_prompt import ChatWork, ConversationCells
from pc_cpu.engine.prompts.document_prompt import DocumentWork
from pc_cpu.errors import ContextOverflowError, PromptCacheError
from pc_cpu.pml.chat import ChatMessage, ChatPrompt, ChatTemplate, chat_prompt, check_after_edit, check_messages
from pc_cpu.pml.document_layout import DocumentToPlace
from pc_cpu.pml.tools import OPEN, ToolChoice, check_tool_choice, check_tools, parse_tool_calls
from pc_cpu.store.tiers import TieredStore


@dataclass(frozen=True)
class Tools:
    """A turn's tools as it was given them: the functions, which calls the answer may make, and one or more."""

    functions: tuple[dict, ...] = ()
    choice: ToolChoice = ToolChoice("none")
    parallel: bool = True

    @classmethod
    def of(cls, tools: Any, tool_choice: Any, parallel_tool_calls: Any) -> "Tools":
        """Returns a request's tools checked (pc_cpu.pml.tools); raises PromptError naming a fault."""
        functions = check_tools(tools)
        choice = check_tool_choice(tool_choice, functions, parallel=parallel_tool_calls)
        return cls(functions, choice, parallel_tool_calls is not False)


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

    def prompt(self, messages: Sequence, *, add_generation_prompt: bool = True, tools: Any = None) -> ChatPrompt:
        """Returns a conversation's tokens and decode calls as `chat` lays them out (pc_cpu.pml.chat); computes nothing.

        add_generation_prompt=False lays out a finished conversation (its last message may be the
        assistant's): where a next turn finds each answer's tokens (ChatPrompt.answers).
        """
        checked = check_messages(messages, finished=not add_generation_prompt)
        return chat_prompt(checked, self.template, self.model, add_generation_prompt=add_generation_prompt,
                           tools=check_tools(tools))

    def work(self, messages: Sequence, *, documents: Sequence[str] | None, after_edit: str,
             use_cache: bool, tools: Tools = Tools()) -> ChatWork:
        """Returns a turn of a conversation as the scheduler runs it, its arguments checked (see PromptCache.chat).

        Raises:
            PromptError: messages or after_edit the turn cannot take (pc_cpu.pml.chat).
            ContextOverflowError: the conversation and one answer token need more positions than a prompt holds.
        """
        check_after_edit(after_edit)
        checked = check_messages(messages)
        placing = self._placing(documents, use_cache)
        functions = tools.functions if self._renders_tools(tools) else ()
        names = [tool["function"]["name"] for tool in functions] if tools.choice.mode != "none" else []
        prompt = chat_prompt(checked, self.template, self.model, documents=placing, n_ctx=self._prompts.n_ctx,
                             tools=functions)
        if prompt.end + 1 > self._prompts.n_ctx:
            raise ContextOverflowError(
                f"the conversation is {prompt.end:,} tokens and a prompt holds {self._prompts.n_ctx:,} with its "
                "answer: drop its oldest turns (keep the system message), or raise n_ctx")

        def answered(text: str) -> ChatPrompt | None:
            # As the client sends the answer back: its calls as tool_calls, when the turn had tools
            content, calls = parse_tool_calls(text, names) if names else (text, ())
            try:
                return chat_prompt(checked + (ChatMessage("assistant", content, calls),), self.template, self.model,
                                   documents=placing, n_ctx=self._prompts.n_ctx, add_generation_prompt=False,
                                   tools=functions)
            except PromptCacheError:
                return None

        document_work = None
        if prompt.documents is not None:
            document_work = DocumentWork(prompt.documents, self._documents.encoder, use_cache, "background")
        return ChatWork(prompt, self.cells, answered, use_cache, document_work, after_edit)

    def tool_sampling(self, sampling: SamplingParams, tools: Tools) -> SamplingParams:
        """Returns `sampling` with the calls `tools` allow held by the sampler: a grammar, or the call's opening banned.

        "required" and a named function: the answer is calls, by a grammar from the first token.
        "auto": the same grammar once the model opens a call, when the opening is one token
        (Qwen2.5's <tool_call>); else the answer is free and its calls are read as written.
        "none": the opening is banned when it is one token; else the tools are not rendered.

        Raises:
            PromptCacheError: a response_format too (one grammar per answer), or a parameters schema
                the grammar converter refuses.
        """
        if not tools.functions:
            return sampling
        opening = self._opening
        if tools.choice.mode == "none":
            if opening is None:
                return sampling
            return dataclasses.replace(sampling, logit_bias=sampling.logit_bias + ((opening, float("-inf")),))
        if sampling.grammar is not None:
            raise PromptCacheError("response_format and tools each hold the answer to a grammar: send one, or "
                                   "tool_choice=\"none\" with response_format")
        if tools.choice.mode == "auto" and opening is None:
            return sampling
        grammar = tool_call_grammar(tools.functions, tools.choice, parallel=tools.parallel)
        triggers = (opening,) if tools.choice.mode == "auto" else ()
        sampling = dataclasses.replace(sampling, grammar=grammar, grammar_triggers=triggers)
        Sampler(sampling, self.model).close()  # a grammar llama.cpp refuses is refused here, not mid-run
        return sampling

    @functools.cached_property
    def _opening(self) -> int | None:
        """Returns the one token a call's opening is (Qwen2.5's <tool_call>), or None when it takes more."""
        tokens = self.model.tokenize(OPEN, special=True)
        return tokens[0] if len(tokens) == 1 else None

    def _renders_tools(self, tools: Tools) -> bool:
        """Returns whether the turn's prompt shows the tools (with "none", only when the sampler can ban a call)."""
        return bool(tools.functions) and (tools.choice.mode != "none" or self._opening is not None)

    def _placing(self, documents: Sequence[str] | None, use_cache: bool) -> list[DocumentToPlace]:
        """Returns the named documents as the first user message places them, each with its stand-ins; [] for none."""
        if not documents:
            return []
        if use_cache:
            self._documents.check_supported()
        return self._documents.placing(documents, encoding=self._document_encoding)
