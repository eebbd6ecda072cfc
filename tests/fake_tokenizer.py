"""A word-level tokenizer for PML tests: deterministic, no model needed."""

from __future__ import annotations

import re


class WordTokenizer:
    """Each whitespace-separated word (or punctuation mark) is one token; ids are stable per text."""

    bos_id: int | None = 1
    placeholder_id = 0

    def __init__(self, *, bos: bool = True):
        self.bos_id = 1 if bos else None
        self.vocab: dict[str, int] = {}
        self.words: dict[int, str] = {}

    def tokenize(self, text: str, *, special: bool) -> list[int]:
        ids = []
        for word in re.findall(r"<\|[^|]*\|>|\w+|[^\w\s]", text):
            if word not in self.vocab:
                self.vocab[word] = len(self.vocab) + 10
                self.words[self.vocab[word]] = word
            ids.append(self.vocab[word])
        return ids

    def text(self, ids) -> str:
        return " ".join(self.words.get(i, f"<{i}>") for i in ids)
