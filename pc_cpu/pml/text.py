"""Gives the check that a caller's text can become UTF-8, the bytes the tokenizer, the hashes and the XML parser need.

A Python str can hold a lone UTF-16 surrogate (U+D800..U+DFFF): Python's json reads the JSON
escape "\\udc80" (or the bytes ED B2 80) as one. UTF-8 cannot encode it, so such text would fail
deep inside tokenization with a UnicodeEncodeError; it is refused where it enters, by name.
"""

from __future__ import annotations

import re

from pc_cpu.errors import PromptCacheError

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
