"""Gives the PML prompt of a chat conversation whose messages may import a schema's modules.

    messages_to_pml("s", [ChatMessage("user", "<doc/> What does it say?")], import_names={"doc"})
    -> '<prompt schema="s"><doc/><user>What does it say?</user></prompt>'

Rules (the chat endpoint's, on top of prompt PML):
- A tag in a message is an import only when it names a module (or scaffold) of the schema:
  `<doc/>`, `<plan days="3 days"><tokyo/></plan>`. Every other character, other tags included,
  is literal text and is escaped, so "a < b" and "<b>bold</b>" reach the model as written.
- Imported modules sit at their schema positions, before all free text (prompt PML's rule). So
  the imports of every message are hoisted to the top of the prompt, in the order written, each
  distinct import once; a module imported in the third message is seen by the first message too.
- Each message's remaining text becomes one role turn, in message order, stripped of surrounding
  whitespace (the chat template puts the markup around it); a message left empty adds no turn.
  Roles: system, developer (as system), user, assistant. A last assistant message is continued
  by the model; otherwise the assistant's turn is opened for it.
- The client wrote messages, not that prompt: an error of the prompt (an import given twice, too
  long for the context) names the messages, without a line of the prompt (`naming_messages`).
"""

from __future__ import annotations

import re
from typing import Callable, Collection, Iterator, Sequence

from pc_cpu.errors import ContextOverflowError, PMLError, PromptError, UnknownSchemaError
from pc_cpu.pml.chat import ROLES, ChatMessage
from pc_cpu.pml.text import NOT_XML, escape_attribute
from pc_cpu.pml.text import escape_text

# a message's role -> the PML tag of its turn: the roles PML has (a tool's results are for conversations)
ROLE_TAGS = {role: tag for role, tag in ROLES.items() if tag in ("system", "user", "assistant")}

# One start or end tag with its attributes: (slash, name, attributes, self-closing slash).
_TAG = re.compile(r"""<(/?)([A-Za-z_][\w.-]*)((?:\s+[^\s=/>"']+\s*=\s*(?:"[^"]*"|'[^']*'))*)\s*(/?)>""")


def messages_to_pml(schema: str, messages: Sequence[ChatMessage], *, import_names: Collection[str]) -> str:
    """Returns one `<prompt schema="...">` document: the messages' imports, then their text as role turns.

    Args:
        schema: the name of a loaded schema.
        messages: the conversation, oldest first.
        import_names: the module and scaffold names of that schema; tags naming them are imports.

    Raises:
        PromptError: no messages, an unknown role, or an import that is never closed.
    """
    if not messages:
        raise PromptError("messages is empty: send at least one message")
    imports: list[str] = []
    turns: list[str] = []
    for index, message in enumerate(messages):
        tag = ROLE_TAGS.get(message.role)
        if tag is None:
            raise PromptError(f"message {index} has role {message.role!r}; supported roles: "
                              f"{', '.join(ROLE_TAGS)}")
        found, text = split_imports(message.content, import_names, where=f"message {index}")
        imports += [raw for raw in dict.fromkeys(found) if raw not in imports]  # "<doc/> ... <doc/>": once
        if text.strip():
            turns.append(f"<{tag}>{cleaned_text(text.strip())}</{tag}>")
    return f'<prompt schema="{escape_attribute(schema, "the schema name")}">{"".join(imports)}{"".join(turns)}</prompt>'


def split_imports(text: str, import_names: Collection[str], *, where: str = "message") -> tuple[list[str], str]:
    """Returns the import tags found in `text` (as written, nested imports inside) and the text without them.

    Raises:
        PromptError: an import's start tag has no matching end tag.
    """
    imports: list[str] = []
    rest: list[str] = []
    pos = 0
    while (start := _next_import(text, pos, import_names)) is not None:
        end = _import_end(text, start, where)
        rest.append(text[pos:start.start()])
        imports.append(text[start.start():end])
        pos = end
    rest.append(text[pos:])
    return imports, "".join(rest)


def cleaned_text(text: str) -> str:
    """Returns a chat message's text as PML character data (pc_cpu.pml.text.escape_text) after cleaning it.

    Chat clients' text is cleaned first, as the other chat paths see it: line ends become "\n",
    and characters XML cannot carry (most C0 controls) are dropped rather than refused.
    """
    return escape_text(NOT_XML.sub("", text.replace("\r\n", "\n").replace("\r", "\n")))


def _next_import(text: str, pos: int, import_names: Collection[str]) -> re.Match | None:
    for tag in _TAG.finditer(text, pos):
        if not tag.group(1) and tag.group(2) in import_names:
            return tag
    return None


def _import_end(text: str, start: re.Match, where: str) -> int:
    """Returns where the import opened by `start` ends: after its `/>`, or after its matching end tag."""
    if start.group(4):
        return start.end()
    name = start.group(2)
    depth = 1
    for tag in _TAG.finditer(text, start.end()):
        if tag.group(2) != name:
            continue
        if tag.group(1):
            depth -= 1
            if depth == 0:
                return tag.end()
        elif not tag.group(4):
            depth += 1
    raise PromptError(f"{where}: the import <{name}> is never closed; write <{name}/> or close it with </{name}>")


def naming_messages(open_stream: Callable):
    """Returns the stream `open_stream()` opens for the prompt of chat messages; its errors are re-raised naming them.

    Raises:
        PMLError, ContextOverflowError: as `open_stream` raises them, the message starting "messages: ".
    """
    try:
        return _MessagesStream(open_stream())
    except (PMLError, ContextOverflowError) as exc:
        raise _about_messages(exc)


class _MessagesStream:
    """A PromptCache Stream whose errors while generating name the messages (a prompt too long for the context)."""

    def __init__(self, stream):
        self._stream = stream

    def __iter__(self) -> Iterator[str]:
        try:
            yield from self._stream
        except (PMLError, ContextOverflowError) as exc:
            raise _about_messages(exc)

    @property
    def result(self):
        return self._stream.result

    def close(self) -> None:
        self._stream.close()


def _about_messages(exc: Exception) -> Exception:
    """Returns `exc` as the chat client sees it: about its messages, without the line of a prompt it never wrote."""
    if isinstance(exc, UnknownSchemaError):  # about the `schema` field, which it names
        return exc
    message = exc.bare_message if isinstance(exc, PMLError) else str(exc)
    return type(exc)(f"messages: {message}")
