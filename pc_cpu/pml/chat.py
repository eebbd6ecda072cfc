"""Gives a conversation's tokens as the model's chat template lays them out, and where its cells can be reused.

    chat = ChatTemplate(model.chat_template())
    prompt = chat_prompt(check_messages([{"role": "user", "content": "Hi"}]), chat, tokenizer)
    prompt.tokens, prompt.calls   # BOS, the rendered turns, the assistant's opening; the decode calls

A conversation is rendered by the model's own template (GGUF `tokenizer.chat_template`),
whole, as llama.cpp's server renders it. Its tokens are then made piece by piece: the
template's markup with control tokens parsed, each message's content as plain text, so
that a user who types "<|im_start|>" gets those characters, not a control token. (A
template that rewrites content in other ways than trimming it is tokenized whole.)

Calls: the decode calls of a full prefill. Each assistant content is a call of its own,
and so is the text between two of them. A turn's answer is computed one token at a time
while it is generated, and the next turn sends it back as text: with answers their own
calls, the cells of every call depend only on the calls before it, so a conversation's
cells up to any call boundary are the same bytes however they were reached (a stream
kept since the last turn, a stored tip, a full prefill), and a turn that restores them
and decodes the rest in the same calls answers exactly as the full prefill does.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from pc_cpu.errors import PromptError
from pc_cpu.pml.document_layout import DocumentPrompt, DocumentToPlace, place_documents
from pc_cpu.pml.tokenizer import Tokenizer
from pc_cpu.pml.tools import ToolCall, calls_text, history_calls, tools_system_text

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
ANSWERED_AFTER = ("user", "tool")  # a last message of these roles opens the assistant's turn; an assistant's is continued
CHAT_MODE = "chat"  # the store's mode for a conversation's cells

_MARK = "PCCHAT{}MARK"  # content stand-ins: no spaces (nothing a template trims), never in real text


@dataclass(frozen=True)
class ChatMessage:
    """One message of a conversation: its role (system, user, assistant or tool) and its text.

    An assistant's message may hold the tool calls it made; a tool's message answers one of them.
    """

    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None  # a tool message's: the call it answers
    name: str | None = None  # a tool message's: the function that answered

    def template(self) -> dict:
        """Returns the message as chat templates read it (OpenAI's keys, tool call arguments as objects)."""
        message = {"role": self.role, "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [call.template() for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            message["name"] = self.name
        return message


def check_messages(messages: Sequence[Any], *, finished: bool = False) -> tuple[ChatMessage, ...]:
    """Returns the messages as ChatMessages (developer as system); raises PromptError naming the first problem.

    A message is an OpenAI-style dict ({"role": ..., "content": ...}; content a string or a list of
    {"type": "text", "text": ...} parts; an assistant's may hold `tool_calls`, a tool's a
    `tool_call_id`) or a ChatMessage. After a last message of the user or a tool, the assistant's
    turn is opened for the answer; a last assistant message is continued (its text starts the
    answer). `finished`: a conversation laid out as history, nothing opened or continued.
    """
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise PromptError("messages is empty: send a list of messages ending with the user's, "
                          'e.g. [{"role": "user", "content": "Hello"}]')
    checked = tuple(_message(m, i) for i, m in enumerate(messages))
    if finished:
        return checked
    last = checked[-1]
    if last.role not in ANSWERED_AFTER and not (last.role == "assistant" and len(checked) > 1):
        raise PromptError(f"the last message (message {len(checked) - 1}) is the {last.role}'s; "
                          "end with the user's message, which the answer replies to")
    if last.role == "assistant" and last.tool_calls:
        raise PromptError(f"the last message (message {len(checked) - 1}) is the assistant's with tool_calls; "
                          "send the tools' results after it (role \"tool\"), or a user message")
    if not any(m.content.strip() for m in checked if m.role in ANSWERED_AFTER):
        raise PromptError("every user message is empty: write something for the model to answer")
    return checked


def _message(message: Any, index: int) -> ChatMessage:
    if isinstance(message, ChatMessage):
        role, content = message.role, message.content
    elif isinstance(message, dict):
        role, content = message.get("role"), message.get("content")
    else:
        raise PromptError(f"message {index} is a {type(message).__name__}; send a dict with 'role' and 'content'")
    if role not in ROLES:
        raise PromptError(f"message {index} has role {role!r}; use one of {', '.join(ROLES)}")
    text = _content_text(content, index)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise PromptError(f"message {index}'s content holds {text[exc.start:exc.end]!r} at character "
                          f"{exc.start}, which UTF-8 cannot encode (a lone surrogate); send valid Unicode") from None
    if isinstance(message, ChatMessage):
        return ChatMessage(ROLES[role], text, message.tool_calls, message.tool_call_id, message.name)
    calls = history_calls(message.get("tool_calls"), index)
    if calls and ROLES[role] != "assistant":
        raise PromptError(f"message {index} is the {role}'s and holds tool_calls; only the assistant's may")
    call_id, name = message.get("tool_call_id"), message.get("name")
    for field, value in (("tool_call_id", call_id), ("name", name)):
        if value is not None and not isinstance(value, str):
            raise PromptError(f"message {index}'s {field} must be a string")
    return ChatMessage(ROLES[role], text, calls, call_id if role == "tool" else None,
                       name if role == "tool" else None)


def _content_text(content: Any, index: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise PromptError(f"message {index} has a content part of type {kind!r}; only text parts are supported")
            texts.append(part["text"])
        return "".join(texts)
    raise PromptError(f"message {index}'s content is a {type(content).__name__}; send a string")


class ChatTemplate:
    """Renders conversations with a model's Jinja chat template (no template: a plain `Role: text` layout).

    Tools: a template that takes them (Qwen2.5's) renders them, the calls in the history and the
    tools' results itself. For another, the conversation is rewritten first, as llama.cpp's server
    does for such a template: the tools described in the system message (pc_cpu.pml.tools), calls
    written into the assistant's text, and results as user messages in <tool_response> tags.
    """

    def __init__(self, template: str | None, *, eos_token: str = ""):
        self.source = template
        if template:
            from pc_cpu.pml.roles import template_renderer  # jinja2 only where a template is used
            self._render: Callable[..., str] = template_renderer(template, eos_token=eos_token)
        else:
            self._render = _plain_render
        self._takes_tools: bool | None = None

    @property
    def takes_tools(self) -> bool:
        """Returns whether the template renders tools itself (it shows a probe tool's name when given one)."""
        if self._takes_tools is None:
            probe = {"type": "function", "function": {"name": "pc_cpu_probe_tool", "parameters": {"type": "object"}}}
            try:
                shown = self._render([{"role": "user", "content": "hi"}], True, tools=[probe])
            except Exception:  # a template that raises on tools does not take them
                shown = ""
            self._takes_tools = "pc_cpu_probe_tool" in shown
        return self._takes_tools

    def render(self, messages: Sequence[ChatMessage], add_generation_prompt: bool, tools: Sequence[dict] = ()) -> str:
        """Returns the template's text of the conversation (BOS left out: the layout adds its token).

        `messages` and `tools` as `shown` gives them: tools here only for a template that takes them.
        """
        if tools:
            return self._render([m.template() for m in messages], add_generation_prompt, tools=list(tools))
        return self._render([m.template() for m in messages], add_generation_prompt)

    def shown(self, messages: Sequence[ChatMessage], tools: Sequence[dict] = ()) -> tuple[tuple[ChatMessage, ...], tuple]:
        """Returns the messages and tools as the template is given them: a template that does not take tools gets none.

        Its messages are then rewritten instead: the tools described in the system message, calls
        written into the assistant's text, results as user messages in <tool_response> tags.
        """
        if self.takes_tools:
            return tuple(messages), tuple(tools)
        if not (tools or any(m.tool_calls or m.role == "tool" for m in messages)):
            return tuple(messages), ()
        out = []
        if tools:
            text = tools_system_text(tools)
            if messages and messages[0].role == "system":
                out.append(ChatMessage("system", f"{messages[0].content}\n\n{text}" if messages[0].content else text))
                messages = messages[1:]
            else:
                out.append(ChatMessage("system", text))
        for message in messages:
            if message.tool_calls:
                text = "\n".join(t for t in (message.content, calls_text(message.tool_calls)) if t)
                out.append(ChatMessage("assistant", text))
            elif message.role == "tool":
                out.append(ChatMessage("user", f"<tool_response>\n{message.content}\n</tool_response>"))
            else:
                out.append(message)
        return tuple(out), ()


def _plain_render(messages: list[dict], add_generation_prompt: bool, tools=None) -> str:
    # "Assistant:" with no space, as the generation prompt ends: an answer starts with its own space token.
    text = "".join(f"Assistant:{m['content']}\n" if m["role"] == "assistant" else
                   f"{m['role'].capitalize()}: {m['content']}\n" for m in messages)
    return text + ("Assistant:" if add_generation_prompt else "")


@dataclass(frozen=True)
class ChatPrompt:
    """A conversation's tokens, the full prefill's decode calls over them, and where each answer lies."""

    tokens: tuple[int, ...]
    calls: tuple[tuple[int, int], ...]  # [start, end) spans covering the tokens in order
    answers: tuple[tuple[int, int], ...]  # the assistant contents' spans (each one call)
    documents: DocumentPrompt | None = None  # documents before the first user message: their layout, no tail

    @property
    def documents_end(self) -> int:
        """Returns where the documents end (a call boundary), 0 without documents."""
        return self.documents.tail_start if self.documents is not None else 0

    @property
    def end(self) -> int:
        return len(self.tokens)

    @property
    def cuts(self) -> tuple[int, ...]:
        """Returns the call boundaries (0 and the end excluded): where reused cells may stop."""
        return tuple(start for start, _ in self.calls[1:])

    def calls_from(self, start: int) -> tuple[tuple[int, int], ...]:
        """Returns the calls that compute the tokens from `start` to the end (the first one cut at `start`)."""
        return tuple((max(lo, start), hi) for lo, hi in self.calls if hi > start)

    def cut_at_or_before(self, n: int) -> int:
        """Returns the last call boundary at or before position `n` (0 when there is none)."""
        return max((cut for cut in self.cuts if cut <= n), default=0)


def chat_prompt(messages: Sequence[ChatMessage], template: ChatTemplate, tokenizer: Tokenizer, *,
                documents: Sequence[DocumentToPlace] = (), n_ctx: int = 0,
                add_generation_prompt: bool = True, tools: Sequence[dict] = ()) -> ChatPrompt:
    """Returns the ChatPrompt of checked messages (check_messages) as `template` renders them.

    With add_generation_prompt, a last assistant message is continued: the conversation before
    it is rendered with the assistant's turn opened, and its text follows as the answer's start
    (as llama.cpp's server prefills it). Without, the messages are a finished conversation.

    documents: placed back to back at the start of the first user message, before its text, as
    `ask` places them before the question, each encoded after its stand-ins (DocumentToPlace; room
    for them is counted against `n_ctx`); the preamble and each document are decode calls of their
    own, as in `ask`'s full prefill (DocumentPrompt.prefix_cuts).

    tools: OpenAI-style function tools (pc_cpu.pml.tools.check_tools), rendered as the template
    renders them (ChatTemplate.shown). Everything before the first message that is not the
    system's (system message, tools, markup) is then a call of its own, so that conversations
    sharing them (the agents of one app) share those cells. An assistant message's calls are
    part of its answer span: the text between its turn's opening and closing markup.

    Raises:
        PromptError: the template cannot render these messages (its own error, e.g. roles out of order),
            or documents with a template that rewrites messages.
    """
    shared_prefix = bool(tools)  # the system message and tools, which every step of an agent shares: a call of their own
    messages, tools = template.shown(messages, tools)
    continued = messages[-1] if add_generation_prompt and messages[-1].role == "assistant" else None
    if continued is not None:
        messages = messages[:-1]
    try:
        rendered = template.render(messages, add_generation_prompt, tools)
        marked = template.render([ChatMessage(m.role, _MARK.format(i)) for i, m in enumerate(messages)],
                                 add_generation_prompt, tools)
    except Exception as exc:  # jinja2's TemplateError, or a template's raise_exception
        raise PromptError(f"the model's chat template refuses these messages: {exc}; check their roles and "
                          "order (most templates want user and assistant to alternate)") from None
    bos = [tokenizer.bos_id] if tokenizer.bos_id is not None else []
    pieces = _pieces(marked, messages, rendered)
    if pieces is None:  # the template rewrites content: tokenized whole, control tokens parsed as llama.cpp does
        if documents:
            raise PromptError("this model's chat template rewrites messages, so documents cannot be placed in a "
                              "conversation with it; ask one question over them instead (ask, pc-cpu ask)")
        pieces = [(rendered, None)]  # one piece of markup: one call (and a continued answer's text after it)
    if continued is not None and continued.content:
        pieces.append((continued.content, continued))
    tokens, answers, placed, bounds = list(bos), [], None, []
    for text, message in pieces:
        if documents and placed is None and message is not None and message.role == "user":
            placed = place_documents(tuple(tokens), documents, (), n_ctx)
            tokens += [token for doc in documents for token in doc.tokens]
        if shared_prefix and message is not None and message.role != "system":
            bounds.append(len(tokens))
            shared_prefix = False
        start = len(tokens)
        # Markup, and an assistant's tool calls (which the template wrote), with control tokens parsed
        tokens += tokenizer.tokenize(text, special=message is None or bool(message.tool_calls))
        if message is not None and message.role == "assistant" and len(tokens) > start:
            answers.append((start, len(tokens)))
    bounds += [*placed.prefix_cuts, placed.tail_start] if placed is not None else []
    return ChatPrompt(tuple(tokens), _calls(len(tokens), answers, bounds), tuple(answers), placed)


def _pieces(marked: str, messages: Sequence[ChatMessage], rendered: str) -> list | None:
    """Returns the rendering as (text, message or None for markup) pieces, or None when content is rewritten.

    `marked` is the rendering with each content replaced by a mark (and no tool calls): the text
    between marks is markup. A template may trim content (Gemma's does): the stripped text is then
    the piece. A message with tool calls has for its piece whatever lies between its markup and the
    next: its text and calls as the template writes them.
    """
    markup, rest = [], marked
    for i in range(len(messages)):
        mark = _MARK.format(i)
        if rest.count(mark) != 1:  # a template that drops or repeats a message: tokenized whole
            return None
        before, rest = rest.split(mark)
        markup.append(before)
    markup.append(rest)
    for trim in (False, True):
        pieces = _aligned(markup, messages, rendered, trim)
        if pieces is not None:
            return [(text, m) for text, m in pieces if text]
    return None


def _aligned(markup: list[str], messages: Sequence[ChatMessage], rendered: str, trim: bool) -> list | None:
    """Returns the pieces when `rendered` is the markup with each message's content between; None when it is not."""
    pieces, at = [], 0
    for i, message in enumerate(messages):
        if not rendered.startswith(markup[i], at):
            return None
        pieces.append((markup[i], None))
        at += len(markup[i])
        if message.tool_calls:
            end = rendered.find(markup[i + 1], at) if markup[i + 1] else -1
            if end < 0:
                return None
            text = rendered[at:end]
        else:
            text = message.content.strip() if trim else message.content
            if not rendered.startswith(text, at):
                return None
        pieces.append((text, message))
        at += len(text)
    if rendered[at:] != markup[-1]:
        return None
    return pieces + [(markup[-1], None)]


def _calls(n: int, answers: list[tuple[int, int]], more: Sequence[int] = ()) -> tuple[tuple[int, int], ...]:
    """Returns the spans [0, n) is decoded in: each answer alone, and the text between them (also cut at `more`)."""
    bounds = sorted({0, n, *more, *(b for span in answers for b in span)})
    return tuple(zip(bounds[:-1], bounds[1:]))


def common_prefix(a: Sequence[int], b: Sequence[int], limit: int | None = None) -> int:
    """Returns how many first tokens `a` and `b` share, at most `limit`."""
    n = min(len(a), len(b), len(a) if limit is None else limit)
    a, b = tuple(a[:n]), tuple(b[:n])
    if a == b:  # the common case (a turn extending the last one), in one comparison
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


# --- an edited conversation ---------------------------------------------------------------------

AFTER_EDIT = ("recompute", "reuse")  # what a turn does with the earlier turns after an edited message
MIN_MOVED_TOKENS = 32  # a shorter run is not worth a state round trip (and is mostly template markup)


@dataclass(frozen=True)
class MovedRun:
    """Cells of an earlier stream that an edited conversation reuses at other positions: `length` tokens, old_start -> new_start."""

    old_start: int
    new_start: int
    length: int

    @property
    def delta(self) -> int:
        return self.new_start - self.old_start

    @property
    def old_end(self) -> int:
        return self.old_start + self.length

    @property
    def new_end(self) -> int:
        return self.new_start + self.length


def check_after_edit(after_edit: str) -> str:
    """Returns `after_edit` when it is one of AFTER_EDIT; raises PromptError naming them otherwise."""
    if after_edit not in AFTER_EDIT:
        raise PromptError(f"after_edit={after_edit!r} is not a choice: use 'recompute' (the turns after an edited "
                          "message are computed again, answers as a full prefill) or 'reuse' (their cells are moved "
                          "to their new positions: faster, not exact)")
    return after_edit


def moved_runs(old: Sequence[int], new: Sequence[int], start: int, stop: int,
               min_tokens: int = MIN_MOVED_TOKENS) -> tuple[MovedRun, ...]:
    """Returns the runs of `old[start:]` found again in `new[start:stop]`, in order, each of at least `min_tokens`.

    `old` is a stream's tokens (a conversation before an edit), `new` the edited conversation's;
    both agree on their first `start` tokens. The runs are the longest common pieces in order
    (difflib's matching blocks), so an edited or deleted message leaves the turns after it as
    one run moved by the edit's change in length. A run right at `start` (the text before the
    edit, after the last call boundary) stays where it is, however short: it costs no move.
    """
    if stop <= start or len(old) <= start:
        return ()
    matcher = difflib.SequenceMatcher(None, tuple(old[start:]), tuple(new[start:stop]), autojunk=False)
    return tuple(MovedRun(start + block.a, start + block.b, block.size)
                 for block in matcher.get_matching_blocks()
                 if block.size >= min_tokens or (block.size and block.a == block.b == 0))
