"""The calc outcome reward and answer parsing."""

from __future__ import annotations

import time

import pytest

from components.tasks.calc.prompts import SYSTEM_PROMPT, initial_messages
from components.tasks.calc.reward import normalize_number, parse_answer, score


@pytest.mark.parametrize(
    "text, truth, reward",
    [
        ("<answer>97</answer>", "97", 1.0),
        ("<answer> 97 </answer>", "97", 1.0),
        ("<answer>97.0</answer>", "97", 1.0),
        ("<answer>97.00</answer>", "97.0", 1.0),
        ("<answer>1,000</answer>", "1000", 1.0),
        ("<answer>$10</answer>", "10", 1.0),
        ("<answer>-7</answer>", "-7", 1.0),
        ("<answer>0.5</answer>", ".5", 1.0),
        ("<answer>96</answer>", "97", 0.0),
        ("<answer>7</answer>", "-7", 0.0),
        ("97", "97", 0.0),
        ("<answer>97", "97", 0.0),
        ("<answer></answer>", "97", 0.0),
        ("<answer>97 apples</answer>", "97", 0.0),
        ("<answer>1e2</answer>", "100", 0.0),
        ("<answer>1/2</answer>", "0.5", 0.0),
        ("<answer>96</answer> no wait <answer>97</answer>", "97", 1.0),
        ("<answer>97</answer> no wait <answer>96</answer>", "97", 0.0),
        ("<answer>97</answer>", "not a number", 0.0),
        ("<answer>" + "9" * 5000 + "</answer>", "9", 0.0),
    ],
)
def test_score(text, truth, reward):
    assert score(text, truth) == reward


def test_parse_answer():
    assert parse_answer("<answer>2.50</answer>") == "2.5"
    assert parse_answer("<answer>-0</answer>") == "0"
    assert parse_answer("no tag") is None
    assert normalize_number(" 1,234.0 ") == "1234"
    assert normalize_number("1e999999999") is None


def test_hostile_answers_are_fast():
    start = time.perf_counter()
    assert score("<answer>" * 100_000 + "1</answer>" * 100_000, "1") in (0.0, 1.0)
    assert score("<answer>1" + "0" * 1_000_000 + "</answer>", "1") == 0.0
    assert time.perf_counter() - start < 2.0


def test_initial_messages():
    assert initial_messages({"question": "What is 2+2?"}) == [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": "What is 2+2?"},
    ]
    assert "<answer>" in SYSTEM_PROMPT and "calculator" in SYSTEM_PROMPT
    with pytest.raises(KeyError, match="no 'question' column"):
        initial_messages({"q": "x"})


def test_many_unclosed_tags_are_linear_time():
    start = time.perf_counter()
    assert parse_answer("<answer>" * 200_000) is None
    assert parse_answer("</answer>" + "<answer>" * 200_000) is None
    assert parse_answer("<answer>5</answer>" + "<answer>" * 200_000) == "5"
    assert time.perf_counter() - start < 1.0
