"""Gives the check that a caller's text can become UTF-8, and the one way text is written into PML.

A Python str can hold a lone UTF-16 surrogate (U+D800..U+DFFF): Python's json reads the JSON
escape "\\udc80" (or the bytes ED B2 80) as one. UTF-8 cannot encode it, so such text would fail
deep inside tokenization with a UnicodeEncodeError; it is refused where it enters, by name.
"""

from __future__ import annotations

import re

from pc_cpu.errors import PromptCacheError, PromptError

# Every surrogate in a str is lone: Python never pairs them (a JSON pair decodes to one astral character).
_SURROGATE = re.compile("[\ud800-\udfff]")


def check_utf8(text: str, what: str, *, error: type[PromptCacheError] = PromptCacheError) -> str:
    """Returns `text` unchanged when UTF-8 can encode it.

    Args:
        text: the caller's text.
        what: how the message names it ("the question", "messages[0].content").
        error: the PromptCacheError subclass to raise (a parser raises its PMLSyntaxError).

    Raises:
        error: `text` holds a lone surrogate; the message gives its code point and its character
            position counted from 1 (as PML columns are), never the character itself.
    """
    found = _SURROGATE.search(text)
    if found is None:
        return text
    raise error(f"invalid Unicode: a lone surrogate (U+{ord(found.group()):04X}) at character {found.start() + 1} "
                f"of {what}; send UTF-8 text")


# Characters XML 1.0 cannot carry, even as character references: most C0 controls, lone surrogates
# (check_utf8 names those where text enters), U+FFFE and U+FFFF.
NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
# Newlines as character references: PML's parser trims bare newlines at the edges of text, and an
# XML parser turns a bare CR into LF; references come back as written.
_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", "\n": "&#10;", "\r": "&#13;"}
_SPECIAL = re.compile("[&<>\n\r]")


def escape_text(text: str, what: str = "the text") -> str:
    """Returns `text` as PML character data that parses back to exactly `text` (in an attribute too, with `"` kept out).

    Raises:
        PromptError: `text` holds a character XML cannot carry; the message names it, its position
            (counted from 1) and `what`.
    """
    check_xml_chars(text, what)
    return _SPECIAL.sub(lambda m: _ENTITIES[m.group()], text)


def check_xml_chars(text: str, what: str) -> None:
    """Raises PromptError naming the first character of `text` XML cannot carry, its position (from 1) and `what`."""
    bad = NOT_XML.search(text)
    if bad is not None:
        raise PromptError(f"{what} holds U+{ord(bad.group()):04X} at character {bad.start() + 1}, which XML "
                          "cannot carry; remove control characters")


def escape_attribute(value: str, what: str = "the value") -> str:
    """Returns `value` escaped for a double-quoted PML attribute (as escape_text; `"` and tabs as references).

    An XML parser turns a bare tab in an attribute into a space; a reference comes back as a tab.
    """
    return escape_text(value, what).replace('"', "&quot;").replace("\t", "&#9;")
