"""Gives the Prompt a `<prompt>` PML document asks for: its imports and its free text.

    <prompt schema="trip">
      <plan days="3"><paris/></plan>      imports; arguments as attributes; nesting as in the schema
      <user>Where can I surf?</user>      free text: not cached, computed after the imports
    </prompt>

Imported modules sit at their schema positions, so free text cannot go between
them: all free text follows the imports, in the order written, and text written
before an import is an error rather than silently moved. A role tag's markup is
emitted with its first text, so `<user><doc/>Question</user>` is fine. In a schema
that uses chat roles, free text outside role tags is the user's turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from pc_cpu.errors import PromptError
from pc_cpu.pml.schema import ROLES, normalize_text
from pc_cpu.pml.xmltree import Element, Text, parse_xml


@dataclass(frozen=True)
class Import:
    """One imported module, its arguments and the nested imports written inside it."""

    name: str
    args: Mapping[str, str]
    children: tuple["Import", ...]
    line: int


@dataclass(frozen=True)
class Turn:
    """Free (uncached) text, with the chat role it was written in (None: outside role tags)."""

    role: str | None
    text: str
    line: int


@dataclass(frozen=True)
class Prompt:
    schema: str
    imports: tuple[Import, ...]
    turns: tuple[Turn, ...]
    uses_roles: bool

    def ends_with_assistant(self) -> bool:
        """Returns True when the last turn is an assistant turn the model should continue."""
        return bool(self.turns) and self.turns[-1].role == "assistant"


def parse_prompt(source: str | bytes) -> Prompt:
    """Returns the Prompt of a `<prompt schema="...">` document.

    Raises:
        PMLSyntaxError: not well-formed or safe XML.
        PromptError: a rule of prompt PML is broken; the message says what to change.
    """
    root = parse_xml(source, what="prompt")
    if root.tag != "prompt":
        raise PromptError(f"root element is <{root.tag}>; a prompt starts with <prompt schema=\"...\">",
                          line=root.line)
    extra = sorted(set(root.attrs) - {"schema"})
    if extra:
        raise PromptError(f"<prompt> has unknown attribute {extra[0]!r}; allowed: schema", line=root.line)
    schema = root.attrs.get("schema")
    if not schema:
        raise PromptError("<prompt> needs a schema attribute naming a loaded schema, e.g. "
                          "<prompt schema=\"trip\">", line=root.line)
    reader = _PromptReader()
    reader.read_children(root, role=None)
    return Prompt(schema, tuple(reader.imports), tuple(reader.turns), reader.uses_roles)


class _PromptReader:
    def __init__(self) -> None:
        self.imports: list[Import] = []
        self.turns: list[Turn] = []
        self.uses_roles = False
        self.last_owner: Element | None = None  # the element whose text the last turn holds

    def read_children(self, element: Element, *, role: str | None) -> None:
        for child in element.children:
            if isinstance(child, Text):
                self.add_text(child, role, owner=element)
            elif child.tag in ROLES:
                if role is not None:
                    raise PromptError(f"<{child.tag}> is inside <{role}>; close <{role}> first", line=child.line)
                if child.attrs:
                    raise PromptError(f"<{child.tag}> takes no attributes", line=child.line)
                self.uses_roles = True
                self.read_children(child, role=child.tag)
            else:
                self.add_import(child)

    def add_text(self, text: Text, role: str | None, *, owner: Element) -> None:
        value = normalize_text(text.value)
        if not value.strip() and (role is None or not self.turns):
            return  # spacing between tags is layout, not a turn
        if self.turns and self.last_owner is owner:
            last = self.turns[-1]
            self.turns[-1] = Turn(role, last.text + value, last.line)
        else:
            self.turns.append(Turn(role, value, text.line))
        self.last_owner = owner

    def add_import(self, element: Element) -> None:
        if self.turns:
            first = self.turns[0]
            raise PromptError(f"text {first.text.strip()[:40]!r} (line {first.line}) comes before the import "
                              f"<{element.tag}/>; imported modules keep their schema positions, so free text "
                              "must follow all imports: move the text after it", line=element.line)
        self.imports.append(self.read_import(element))

    def read_import(self, element: Element) -> Import:
        for child in element.children:
            if isinstance(child, Text) and child.value.strip():
                raise PromptError(f"import <{element.tag}> contains text {child.value.strip()[:40]!r}; an import "
                                  "holds only nested imports: move the text after the imports",
                                  line=child.line)
        children = []
        for child in element.elements():
            if child.tag in ROLES:
                raise PromptError(f"<{child.tag}> is inside the import <{element.tag}>; put role tags at the "
                                  "top level of the prompt", line=child.line)
            children.append(self.read_import(child))
        return Import(element.tag, MappingProxyType(dict(element.attrs)), tuple(children), element.line)
