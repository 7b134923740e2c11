"""What the tasks share (components/tasks/prompts.py, recipe.split_sizes): initial messages, the
``<answer>`` content, the split sizes."""

from __future__ import annotations

import pytest

from components.tasks.prompts import answer_content, question_messages
from components.tasks.recipe import split_sizes


def test_question_messages_render_the_question_after_the_system_prompt():
    plain = question_messages("SYS")
    assert plain({"question": 12, "answer": "x"}) == [
        {"role": "system", "content": "SYS"},
        {"role": "user", "content": "12"},
    ]
    shouted = question_messages("SYS", str.upper)
    assert shouted({"question": "go"})[1] == {"role": "user", "content": "GO"}
    with pytest.raises(KeyError, match=r"no 'question' column \(columns: \['answer', 'id'\]\)"):
        plain({"id": 1, "answer": 2})


@pytest.mark.parametrize(
    "text, content",
    [
        ("<answer>42</answer>", "42"),
        ("a <answer>1</answer> then <answer> 2 </answer> end", " 2 "),  # the last one, unstripped
        ("<answer>3</answer><answer>4", "3"),  # the last *complete* one
        ("</answer><answer>5", None),
        ("<answer></answer>", ""),
        ("no tags", None),
        ("<answer>" * 10_000 + "7</answer>", "7"),
        (None, None),  # model output is any object's text: "None" has no tags
    ],
)
def test_answer_content(text, content):
    assert answer_content(text) == content


def test_split_sizes_name_a_negative_size():
    assert split_sizes(3, 0, 2) == {"train": 3, "val": 0, "test": 2}
    with pytest.raises(ValueError, match="n_val must be >= 0, got -1"):
        split_sizes(3, -1, 2)
