"""Gives a small element tree (with line numbers) for a PML document, parsed safely.

defusedxml refuses DTDs, entity declarations and external references, so no input
can expand into gigabytes or read a file. On top of that we cap depth, element
count and text size: a PML document is a prompt, not a data dump.
"""

from __future__ import annotations

import re
import xml.parsers.expat
from dataclasses import dataclass, field

import defusedxml.ElementTree as DET
from defusedxml.common import DefusedXmlException

from pc_cpu.errors import PMLSyntaxError
from pc_cpu.pml.text import check_utf8

MAX_DEPTH = 64
MAX_ELEMENTS = 100_000
MAX_TEXT_CHARS = 16 * 1024 * 1024  # characters of text in one document

# A written newline (&#10;) must survive the trimming of XML indentation, but expat
# turns it into "\n" before we see it. So before parsing, outside CDATA sections,
# every &#10; becomes the two characters MARK + "1", and every literal or referenced
# MARK (a private-use character a user may well write) becomes MARK + "0": after
# parsing, each MARK starts one of those pairs and restore_newlines undoes them.
MARK = "\ue000"
_NEWLINE_REF = re.compile(r"&#(?:0*10|[xX]0*[aA]);")
_MARK_REF = re.compile(r"&#(?:0*57344|[xX]0*[eE]000);")
_CDATA = re.compile(r"(<!\[CDATA\[.*?\]\]>)", re.DOTALL)
_PAIR = re.compile(MARK + "(.)", re.DOTALL)


def _protect(source: str) -> str:
    """Returns the source with written newlines and MARKs encoded as pairs (CDATA only escapes MARKs)."""
    parts = _CDATA.split(source)
    for i, part in enumerate(parts):
        part = part.replace(MARK, MARK + "0")
        if i % 2 == 0:  # outside CDATA: character references are markup there
            part = _NEWLINE_REF.sub(MARK + "1", _MARK_REF.sub(MARK + "0", part))
        parts[i] = part
    return "".join(parts)


def restore_newlines(text: str) -> str:
    """Returns parsed `text` with every written &#10; back as a newline (and every MARK as itself)."""
    return _PAIR.sub(lambda m: "\n" if m.group(1) == "1" else MARK, text)


@dataclass
class Text:
    """A run of character data between tags."""

    value: str
    line: int


@dataclass
class Element:
    """One XML element: its tag, attributes, children (elements and text) and where it starts."""

    tag: str
    attrs: dict[str, str]
    line: int
    column: int
    children: list["Element | Text"] = field(default_factory=list)

    def elements(self) -> list["Element"]:
        """Returns the child elements, without text."""
        return [c for c in self.children if isinstance(c, Element)]


class _Builder:
    """Collects expat callbacks into Elements, enforcing the size limits."""

    def __init__(self) -> None:
        self.parser: object | None = None  # set once the expat parser exists, for line numbers
        self.stack: list[Element] = []
        self.root: Element | None = None
        self.n_elements = 0
        self.n_chars = 0

    def _where(self) -> tuple[int, int]:
        expat = getattr(self.parser, "parser", None)
        if expat is None:
            return 0, 0
        return expat.CurrentLineNumber, expat.CurrentColumnNumber + 1

    def start(self, tag: str, attrs: dict[str, str]) -> None:
        line, column = self._where()
        self.n_elements += 1
        if self.n_elements > MAX_ELEMENTS:
            raise PMLSyntaxError(f"more than {MAX_ELEMENTS} elements; split the document", line=line)
        if len(self.stack) >= MAX_DEPTH:
            raise PMLSyntaxError(f"elements nested deeper than {MAX_DEPTH}; flatten the document", line=line)
        element = Element(tag, {k: restore_newlines(v) for k, v in attrs.items()}, line, column)
        if self.stack:
            self.stack[-1].children.append(element)
        else:
            self.root = element
        self.stack.append(element)

    def end(self, tag: str) -> None:
        self.stack.pop()

    def data(self, text: str) -> None:
        self.n_chars += len(text)
        if self.n_chars > MAX_TEXT_CHARS:
            raise PMLSyntaxError(f"more than {MAX_TEXT_CHARS} characters of text; shorten the document")
        if not self.stack:
            return
        children = self.stack[-1].children
        # A Text's line is where its first non-blank character is (what an error message should point at).
        line = self._where()[0] + text[:len(text) - len(text.lstrip())].count("\n")
        if children and isinstance(children[-1], Text):
            node = children[-1]  # expat splits text at lines, buffer edges and entities
            if not node.value.strip() and text.strip():
                node.line = line
            node.value += text
        else:
            children.append(Text(text, line))

    def close(self) -> Element | None:
        return self.root


def parse_xml(source: str | bytes, *, what: str) -> Element:
    """Returns the root Element of a PML document.

    Args:
        source: the document text.
        what: "schema" or "prompt", used in error messages.

    Raises:
        PMLSyntaxError: the text is not well-formed XML, uses DTDs or entities, is too large, or holds
            a lone surrogate UTF-8 cannot encode.
    """
    if isinstance(source, bytes):
        try:
            source = source.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PMLSyntaxError(f"{what} is not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    if not isinstance(source, str):
        raise PMLSyntaxError(f"{what} must be a string of PML, got {type(source).__name__}")
    if not source.strip():
        raise PMLSyntaxError(f"{what} is empty; expected a <{what}> element")
    check_utf8(source, f"the {what}", error=PMLSyntaxError)  # expat encodes the text to UTF-8 first
    builder = _Builder()
    try:
        parser = DET.DefusedXMLParser(target=builder, forbid_dtd=True, forbid_entities=True,
                                      forbid_external=True)
        builder.parser = parser
        # Text events as they come, not buffered up to the next tag: a Text then records the line it starts on.
        parser.parser.buffer_text = False
        parser.feed(_protect(source))
        root = parser.close()
    except PMLSyntaxError:
        raise
    except DefusedXmlException as exc:
        raise PMLSyntaxError(f"{what} uses a refused XML feature ({type(exc).__name__}); "
                             "remove DTDs and entity declarations") from None
    except (DET.ParseError, xml.parsers.expat.ExpatError) as exc:
        line, column = getattr(exc, "position", (None, None))
        message = str(exc).split(":")[0]
        raise PMLSyntaxError(f"{what} is not well-formed XML: {message}; check tags and escape < & as &lt; &amp;",
                             line=line, column=None if column is None else column + 1) from None
    except (ValueError, RecursionError, OverflowError) as exc:
        raise PMLSyntaxError(f"{what} could not be parsed: {exc}") from None
    if root is None:
        raise PMLSyntaxError(f"{what} has no root element; expected <{what}>")
    return root
