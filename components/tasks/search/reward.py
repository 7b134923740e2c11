"""The search task's outcome reward: exact match (EM) of the normalised answer, and token F1.

:func:`parse_answer` reads the content of the last complete ``<answer>...</answer>`` (None if there is
none). :func:`normalize_answer` is Search-R1's (and SQuAD's) normalisation: lowercase, punctuation
removed, the articles ``a``/``an``/``the`` removed, whitespace collapsed. :func:`score` is 1.0 when the
normalised prediction equals the normalised ground truth, else 0.0 (no partial credit, no format
bonus); :func:`f1` is the SQuAD token-overlap F1 of the same two strings, logged beside EM. Linear
time on any input.
"""

from __future__ import annotations

import re
import string
from collections import Counter

from components.tasks.prompts import answer_content

__all__ = ["exact_match", "f1", "normalize_answer", "parse_answer", "score"]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)
_MAX_ANSWER_CHARS = 400


def normalize_answer(text: str) -> str:
    """Lowercase, drop punctuation and articles, collapse whitespace (Search-R1 / SQuAD)."""
    text = str(text).lower().translate(_PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def parse_answer(text: str) -> str | None:
    """The stripped content of the last ``<answer>...</answer>`` of ``text``; None if absent or too long."""
    content = answer_content(text)
    if content is None:
        return None
    answer = content.strip()
    return answer if len(answer) <= _MAX_ANSWER_CHARS else None


def exact_match(prediction: str, truth: str) -> float:
    return 1.0 if normalize_answer(prediction) == normalize_answer(truth) else 0.0


def f1(prediction: str, truth: str) -> float:
    """SQuAD token F1 of the normalised strings (1.0 when both are empty, 0.0 when one is)."""
    pred, gold = normalize_answer(prediction).split(), normalize_answer(truth).split()
    if not pred or not gold:
        return float(pred == gold)
    common = sum((Counter(pred) & Counter(gold)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(gold)
    return 2 * precision * recall / (precision + recall)


def score(final_text: str, answer: str) -> float:
    """1.0 if the answer in ``<answer>...</answer>`` matches ``answer`` after normalisation, else 0.0."""
    predicted = parse_answer(final_text)
    if predicted is None:
        return 0.0
    return exact_match(predicted, answer)
