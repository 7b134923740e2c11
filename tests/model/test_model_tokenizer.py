"""Tokenizer: byte-level round trip, per-digit tokens, single-id special tokens, exact chat template."""

from __future__ import annotations

import random

import pytest
from transformers import AutoTokenizer

from components.model.tokenizer import (
    EOS_TOKEN,
    IM_START,
    MARKUP_TOKENS,
    PAD_TOKEN,
    SPECIAL_TOKENS,
    build_tokenizer,
)

ADDED = SPECIAL_TOKENS + MARKUP_TOKENS


def _ids(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


ROUND_TRIP = [
    "What is 5 * 12 + 37?",
    "  leading and trailing spaces  ",
    "tabs\tand\nnew\r\nlines\n\n\n",
    " . , ; spaces before punctuation ! ?",  # clean_up_tokenization_spaces would change these
    "héllo wörld — ñandú, ça va? Ünïcödé",
    "数学题：三加四等于七。 日本語のテキスト",
    "emoji 😀👩‍👩‍👧 and flags 🇫🇷",
    "combining e\u0301 vs \u00e9, RTL \u05e9\u05dc\u05d5\u05dd, zero-width\u200bjoin",
    "9876543210 0.5 -3 1e9 3,141,592",
    "<|im_start|>user\nhi<|im_end|>\n<tool_call>\n{}\n</tool_call><|endoftext|>",
    "<|im_start <tool_call <|im_end|",  # near misses of the added tokens
    "",
]


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_round_trip(tok, text):
    assert tok.decode(_ids(tok, text), skip_special_tokens=False) == text


def test_round_trip_random_unicode(tok):
    rng = random.Random(1)
    ranges = [(0x20, 0x7E), (0x00, 0x1F), (0xA0, 0x24F), (0x370, 0x3FF), (0x4E00, 0x4FFF), (0x1F300, 0x1F64F)]
    for _ in range(200):
        chars = []
        for _ in range(rng.randint(1, 40)):
            lo, hi = rng.choice(ranges)
            chars.append(chr(rng.randint(lo, hi)))
        text = "".join(chars)
        assert tok.decode(_ids(tok, text)) == text, repr(text)


def test_every_digit_is_its_own_token(tok):
    ids = _ids(tok, "x=1234567890, y=00 and 99.")
    pieces = [tok.decode([i]) for i in ids]
    digit_pieces = [p for p in pieces if any(c.isdigit() for c in p)]
    assert digit_pieces == list("1234567890") + ["0", "0", "9", "9"]
    # The corpus is full of numbers, yet no learnt token mixes a digit with anything else.
    for token_id in range(len(tok)):
        piece = tok.decode([token_id])
        if any(c.isdigit() for c in piece):
            assert len(piece) == 1, (token_id, piece)


def test_added_tokens_are_single_ids(tok):
    ids = [_ids(tok, t) for t in ADDED]
    assert all(len(i) == 1 for i in ids), dict(zip(ADDED, ids))
    assert len({i[0] for i in ids}) == len(ADDED)
    # also when glued to text on both sides
    for t in ADDED:
        glued = _ids(tok, f"ab{t}cd")
        assert tok.convert_tokens_to_ids(t) in glued
        assert tok.decode(glued) == f"ab{t}cd"
    assert tok.eos_token == EOS_TOKEN and tok.pad_token == PAD_TOKEN and tok.bos_token is None
    assert tok.eos_token_id == tok.convert_tokens_to_ids(EOS_TOKEN)
    assert tok.pad_token_id == tok.convert_tokens_to_ids(PAD_TOKEN)
    # control tokens are dropped by skip_special_tokens, tool markup is text and stays
    text = f"{IM_START}assistant\n<tool_call>x</tool_call>{EOS_TOKEN}"
    assert tok.decode(_ids(tok, text), skip_special_tokens=True) == "assistant\n<tool_call>x</tool_call>"


def test_no_merges_spent_on_added_token_spelling(tok):
    # The corpus contains <|im_start|> etc. hundreds of times; BPE must not have learnt their pieces.
    for token_id in range(len(tok)):
        piece = tok.decode([token_id])
        if piece not in ADDED:
            assert "<|" not in piece and "|>" not in piece and "im_" not in piece, piece


def test_vocab_size_respected_and_validated():
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghij") for _ in range(rng.randint(2, 6))) for _ in range(300)]
    corpus = [" ".join(rng.choice(words) for _ in range(30)) for _ in range(200)]
    small = build_tokenizer(corpus, vocab_size=300)
    assert len(small) == 300  # the corpus has far more pairs than merges allowed
    big = build_tokenizer(corpus, vocab_size=400)
    assert len(big) == 400
    with pytest.raises(ValueError, match="vocab_size=100"):
        build_tokenizer(corpus, vocab_size=100)
    with pytest.raises(TypeError, match="corpus item 1 is int"):
        build_tokenizer(["ok", 7], vocab_size=300)


EXPECTED_WITH_TOOLS = (
    "<|im_start|>system\n"
    "Solve the problem.\n"
    "\n"
    "# Tools\n"
    "- calculator(expression: string): Evaluate an arithmetic expression.<|im_end|>\n"
    "<|im_start|>user\n"
    "Tom has 5 boxes of 12 apples and buys 37 more. How many apples?<|im_end|>\n"
    "<|im_start|>assistant\n"
    "<tool_call>\n"
    '{"name": "calculator", "arguments": {"expression": "5 * 12"}}\n'
    "</tool_call><|im_end|>\n"
    "<|im_start|>user\n"
    "<tool_response>\n"
    "60\n"
    "</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n"
    "<tool_call>\n"
    '{"name": "calculator", "arguments": {"expression": "60 + 37"}}\n'
    "</tool_call><|im_end|>\n"
    "<|im_start|>user\n"
    "<tool_response>\n"
    "97\n"
    "</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n"
    "<answer>97</answer><|im_end|>\n"
)


def test_chat_template_with_tools_exact(tok, calc_tool, calc_messages):
    text = tok.apply_chat_template(calc_messages, tools=[calc_tool], tokenize=False)
    assert text == EXPECTED_WITH_TOOLS
    with_prompt = tok.apply_chat_template(
        calc_messages, tools=[calc_tool], tokenize=False, add_generation_prompt=True
    )
    assert with_prompt == EXPECTED_WITH_TOOLS + "<|im_start|>assistant\n"


def test_chat_template_consecutive_tools_share_one_turn_and_content_before_calls(tok, calc_tool):
    tool2 = {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Find a value.",
            "parameters": {
                "type": "object",
                "properties": {"key": {"type": "string"}, "limit": {"type": ["integer", "null"]}},
                "required": ["key"],
            },
        },
    }
    messages = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": "Two calls.",
            "tool_calls": [
                {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "1+1"}}},
                {"function": {"name": "lookup", "arguments": {"key": "é", "limit": 3}}},
            ],
        },
        {"role": "tool", "name": "calculator", "content": "2"},
        {"role": "tool", "name": "lookup", "content": "found"},
    ]
    text = tok.apply_chat_template(
        messages, tools=[calc_tool, tool2], tokenize=False, add_generation_prompt=True
    )
    assert text == (
        "<|im_start|>system\n"
        "# Tools\n"
        "- calculator(expression: string): Evaluate an arithmetic expression.\n"
        "- lookup(key: string, limit?: integer|null): Find a value.<|im_end|>\n"
        "<|im_start|>user\ngo<|im_end|>\n"
        "<|im_start|>assistant\nTwo calls.\n"
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "lookup", "arguments": {"key": "é", "limit": 3}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n2\n</tool_response>\n<tool_response>\nfound\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_chat_template_without_tools_or_system(tok):
    messages = [{"role": "user", "content": "What is 2+2?"}]
    assert (
        tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        == "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tok.apply_chat_template(messages, tokenize=False) == "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
    with_sys = [{"role": "system", "content": "Be brief."}] + messages
    assert tok.apply_chat_template(with_sys, tokenize=False).startswith(
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
    )


def test_chat_template_tokens_are_markup_ids(tok, calc_tool, calc_messages):
    ids = tok.apply_chat_template(calc_messages[:3], tools=[calc_tool], tokenize=True, return_dict=False)
    vocab = tok.get_vocab()
    assert ids.count(vocab["<tool_call>"]) == 1 and ids.count(vocab["</tool_call>"]) == 1
    assert ids.count(vocab[IM_START]) == 3 and ids.count(vocab[EOS_TOKEN]) == 3
    assert ids[-1] == vocab["\u010a"]  # the byte-level "\n" after the last <|im_end|>


def test_save_and_reload_identical(tok, tmp_path, calc_tool, calc_messages):
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert again.chat_template == tok.chat_template
    assert len(again) == len(tok)
    for text in ROUND_TRIP + [EXPECTED_WITH_TOOLS]:
        assert _ids(again, text) == _ids(tok, text), repr(text)
    render = dict(tools=[calc_tool], tokenize=False, add_generation_prompt=True)
    assert again.apply_chat_template(calc_messages, **render) == tok.apply_chat_template(
        calc_messages, **render
    )
    assert (again.eos_token_id, again.pad_token_id, again.bos_token_id) == (
        tok.eos_token_id,
        tok.pad_token_id,
        tok.bos_token_id,
    )
    assert again.decode(_ids(again, " a , b")) == " a , b"  # clean-up setting survived the reload
