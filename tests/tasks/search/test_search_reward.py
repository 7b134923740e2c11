"""Search-R1 EM normalisation, token F1 and the answer parser, with values worked out by hand."""

from __future__ import annotations

import pytest

from components.tasks.search.reward import exact_match, f1, normalize_answer, parse_answer, score


@pytest.mark.parametrize(
    "text, normal",
    [
        ("The Bolt Co.", "bolt co"),
        ("  an   Apple, a pie!  ", "apple pie"),
        ("Théâtre", "théâtre"),
        ("Anna's", "annas"),
        ("the", ""),
        ("Them", "them"),  # 'the' only as a whole word
    ],
)
def test_normalize(text, normal):
    assert normalize_answer(text) == normal


def test_exact_match_and_score():
    assert exact_match("the bolt co", "Bolt Co.") == 1.0
    assert exact_match("Bolt", "Bolt Co") == 0.0
    assert score("I think <answer> The Tamo </answer>", "tamo") == 1.0
    assert score("<answer>Rivo</answer> then <answer>Tamo</answer>", "Tamo") == 1.0  # the last one
    assert score("Tamo", "Tamo") == 0.0  # no tags, no credit
    assert score("<answer>Tamo", "Tamo") == 0.0
    assert score("<answer>" + "x" * 10_000 + "</answer>", "x") == 0.0


def test_f1_by_hand():
    # prediction "bolt co labs" vs gold "bolt co": common 2, precision 2/3, recall 1 -> F1 0.8
    assert f1("Bolt Co Labs", "the Bolt Co") == pytest.approx(0.8)
    assert f1("Tamo", "Tamo") == 1.0
    assert f1("Rivo", "Tamo") == 0.0
    assert f1("", "Tamo") == 0.0 and f1("the", "a") == 1.0
    # repeated tokens count once per occurrence: "a a b" vs "a b" -> common 2 ("a", "b"), P 2/3, R 1
    assert f1("x x y", "x y") == pytest.approx(0.8)


def test_parse_answer():
    assert parse_answer("<answer> Tamo </answer>") == "Tamo"
    assert parse_answer("no answer") is None
    assert parse_answer("</answer><answer>") is None
    assert parse_answer("<answer></answer>") == ""
