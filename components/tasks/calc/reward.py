"""The calc task's outcome reward: is the number inside ``<answer>...</answer>`` the right one?

:func:`parse_answer` reads the content of the last complete ``<answer>...</answer>``, drops
thousands separators, a leading ``$`` and spaces, and accepts a plain decimal number (``72``, ``-3``,
``2.50``); its canonical form (``2.5``) is the parsed answer. :func:`score` is 1.0 when that number
equals the ground truth exactly (as fractions, so ``72.0`` matches ``72``), else 0.0. No partial
credit, no format bonus. Linear time on any input.
"""

from __future__ import annotations

import re
from fractions import Fraction

from components.tasks.calc.calculator import format_number
from components.tasks.prompts import answer_content

__all__ = ["normalize_number", "parse_answer", "score"]

_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)$")
_MAX_NUMBER_CHARS = 40


def normalize_number(text: str) -> str | None:
    """Canonical form of a plain decimal number (``1,000.50`` -> ``1000.5``), or None if not one."""
    text = str(text).strip().replace(",", "").replace(" ", "").removeprefix("$")
    if len(text) > _MAX_NUMBER_CHARS or not _NUMBER.match(text):
        return None
    return format_number(Fraction(text))


def parse_answer(text: str) -> str | None:
    """The canonical number in the last ``<answer>...</answer>`` of ``text``; None if absent or not a number."""
    content = answer_content(text)
    return None if content is None else normalize_number(content)


def score(final_text: str, answer: str) -> float:
    """1.0 if the final answer equals ``answer`` numerically, else 0.0."""
    predicted = parse_answer(final_text)
    truth = normalize_number(answer)
    if predicted is None or truth is None:
        return 0.0
    return 1.0 if Fraction(predicted) == Fraction(truth) else 0.0
