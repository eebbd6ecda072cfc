"""The tokenizer interface the PML layer needs; the engine's Model implements it.

Keeping it a Protocol lets pc_cpu.pml run and be tested without llama.cpp.
"""

from __future__ import annotations

from typing import Protocol


class Tokenizer(Protocol):
    bos_id: int | None  # the token the model expects at position 0, or None if it adds none
    placeholder_id: int  # what a param's reserved positions hold at encode time

    def tokenize(self, text: str, *, special: bool) -> list[int]:
        """Returns the token ids of `text`, without BOS.

        special=True parses control tokens such as <|im_start|> (template markup);
        special=False treats them as plain text (user content).
        """
        ...
