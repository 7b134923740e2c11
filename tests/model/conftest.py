"""Shared fixtures for tests/model: a small trained tokenizer, the calculator tool, a sample conversation."""

from __future__ import annotations

import json
import random

import pytest

from components.model.tokenizer import build_tokenizer

CALC_TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 2 + 3 * 4"}},
            "required": ["expression"],
        },
    },
}


def calc_conversation() -> list[dict]:
    """Two tool calls (one with a dict, one with a JSON-string argument) and a final answer."""
    return [
        {"role": "system", "content": "Solve the problem."},
        {"role": "user", "content": "Tom has 5 boxes of 12 apples and buys 37 more. How many apples?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "calculator", "arguments": {"expression": "5 * 12"}},
                }
            ],
        },
        {"role": "tool", "name": "calculator", "content": "60"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "calculator", "arguments": '{"expression": "60 + 37"}'},
                }
            ],
        },
        {"role": "tool", "name": "calculator", "content": "97"},
        {"role": "assistant", "content": "<answer>97</answer>"},
    ]


def _corpus(n: int = 300) -> list[str]:
    rng = random.Random(0)
    texts = []
    for _ in range(n):
        a, b, c = rng.randint(2, 999), rng.randint(2, 99), rng.randint(2, 99)
        texts.append(f"What is {a} * {b} + {c}? The calculator says {a * b} and then {a * b + c}.")
        texts.append(
            f"<|im_start|>user\nCompute {a} - {b}<|im_end|>\n<|im_start|>assistant\n<answer>{a - b}</answer><|im_end|>\n"
        )
    return texts


@pytest.fixture(scope="session")
def tok():
    return build_tokenizer(_corpus(), vocab_size=512)


@pytest.fixture
def calc_tool() -> dict:
    return json.loads(json.dumps(CALC_TOOL))


@pytest.fixture
def calc_messages() -> list[dict]:
    return calc_conversation()
