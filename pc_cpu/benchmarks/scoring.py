"""Exact-match scoring as in lost-in-the-middle: a normalised gold answer inside the normalised output."""

from __future__ import annotations

import re
import string
import unicodedata

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """Returns lower case, without punctuation or articles (a, an, the), whitespace collapsed."""
    text = unicodedata.normalize("NFD", text).lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def best_subspan_em(prediction: str, answers) -> bool:
    """Returns True when any normalised gold answer is a substring of the normalised prediction."""
    pred = normalize_answer(prediction)
    return any(normalize_answer(a) in pred for a in answers if normalize_answer(a))
