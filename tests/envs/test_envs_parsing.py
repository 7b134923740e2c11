"""parse_tool_calls on well-formed and hostile model output: every input gives calls or feedback, fast."""

from __future__ import annotations

import json
import time

import pytest

from components.envs.parsing import CallError, ToolCall, format_tool_call, parse_tool_calls

CALC = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "arithmetic",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [CALC]


def call_text(body: str) -> str:
    return f"<tool_call>\n{body}\n</tool_call>"


def only_error(text: str, **kw) -> CallError:
    parsed = parse_tool_calls(text, TOOLS, **kw)
    assert not parsed.is_final
    assert len(parsed.calls) == 1, parsed.calls
    (err,) = parsed.calls
    assert isinstance(err, CallError), err
    assert len(err.message) < 400
    return err


def test_single_valid_call_with_trailing_junk():
    text = call_text('{"name": "calculator", "arguments": {"expression": "5 * 12"}}') + "<|im_end|> junk"
    parsed = parse_tool_calls(text, TOOLS)
    assert parsed.calls == (ToolCall("calculator", {"expression": "5 * 12"}),)
    assert not parsed.is_final and not parsed.truncated
    assert parsed.valid_calls == [ToolCall("calculator", {"expression": "5 * 12"})] and parsed.errors == []


def test_format_tool_call_round_trips():
    args = {"expression": "(3 + 4) * 2 ÷ é"}
    parsed = parse_tool_calls(format_tool_call("calculator", args), TOOLS)
    assert parsed.calls == (ToolCall("calculator", args),)


def test_final_answer_has_no_calls():
    parsed = parse_tool_calls("The result is <answer>97</answer>", TOOLS)
    assert parsed.is_final and parsed.calls == ()


def test_several_calls_in_order_with_one_bad():
    text = (
        call_text('{"name": "calculator", "arguments": {"expression": "1 + 1"}}')
        + "thinking..."
        + call_text("{not json")
        + call_text('{"name": "calculator", "arguments": {"expression": "2 * 3"}}')
    )
    parsed = parse_tool_calls(text, TOOLS)
    assert [type(c) for c in parsed.calls] == [ToolCall, CallError, ToolCall]
    assert [c.arguments["expression"] for c in parsed.valid_calls] == ["1 + 1", "2 * 3"]
    assert "not valid JSON" in parsed.errors[0].message


def test_too_many_calls_are_capped():
    one = call_text('{"name": "calculator", "arguments": {"expression": "1"}}')
    parsed = parse_tool_calls(one * 20, TOOLS, max_calls=3)
    assert len(parsed.valid_calls) == 3
    assert len(parsed.calls) == 4 and "too many tool calls" in parsed.calls[-1].message


@pytest.mark.parametrize(
    "body, expected",
    [
        ("{not json", "not valid JSON"),
        ("", "empty <tool_call>"),
        ("[1, 2]", "must be a JSON object"),
        ('"calculator"', "must be a JSON object"),
        ('{"arguments": {"expression": "1"}}', "no 'name'"),
        ('{"name": 7, "arguments": {}}', "no 'name'"),
        ('{"name": "rm_rf", "arguments": {}}', "unknown tool 'rm_rf'; available tools: ['calculator']"),
        ('{"name": "calculator", "arguments": {}}', "'expression' is a required property"),
        ('{"name": "calculator"}', "'expression' is a required property"),
        (
            '{"name": "calculator", "arguments": {"expression": 60}}',
            "expression must be of type 'string', got integer",
        ),
        ('{"name": "calculator", "arguments": {"expression": "1", "x": 2}}', "Additional properties"),
        ('{"name": "calculator", "arguments": [1, 2]}', "must be a JSON object, got list"),
        ('{"name": "calculator", "arguments": 5}', "must be a JSON object, got int"),
        ('{"name": "calculator", "arguments": "not an object"}', "string that is not a JSON object"),
        ('{"name": "calculator", "arguments": {"expression": "1"}', "not valid JSON"),
        ('{"name": "calculator", "arguments": {"expression": ' + "9" * 5000 + "}}", "not valid JSON"),
    ],
)
def test_malformed_calls_become_feedback(body, expected):
    err = only_error(call_text(body))
    assert expected in err.message, err.message


def test_arguments_as_json_string_are_accepted():
    body = json.dumps({"name": "calculator", "arguments": json.dumps({"expression": "2 + 2"})})
    assert parse_tool_calls(call_text(body), TOOLS).calls == (
        ToolCall("calculator", {"expression": "2 + 2"}),
    )


def test_without_tools_names_are_not_checked():
    parsed = parse_tool_calls(call_text('{"name": "anything", "arguments": {"a": [1]}}'))
    assert parsed.calls == (ToolCall("anything", {"a": [1]}),)


def test_missing_closing_tag():
    err = only_error('<tool_call>\n{"name": "calculator", "arguments": {"expression": "1"}}')
    assert "missing its closing </tool_call>" in err.message


def test_stray_closing_tag_is_not_a_final_answer():
    err = only_error("<answer>3</answer></tool_call>")
    assert "without an opening" in err.message


def test_nested_tags():
    text = (
        "<tool_call><tool_call>"
        + '{"name": "calculator", "arguments": {"expression": "1"}}'
        + "</tool_call></tool_call>"
    )
    parsed = parse_tool_calls(text, TOOLS)
    assert isinstance(parsed.calls[0], CallError) and "nested" in parsed.calls[0].message
    # the leftover closing tag after the nested pair is ignored, not a second call
    assert len(parsed.calls) == 1


def _timed(fn, limit_s: float = 2.0):
    start = time.perf_counter()
    out = fn()
    assert time.perf_counter() - start < limit_s
    return out


def test_huge_argument_string_is_bounded_in_time_and_feedback_size():
    big = "1" * 1_000_000
    text = call_text(json.dumps({"name": "calculator", "arguments": {"expression": 5, "pad": big}}))
    err = _timed(lambda: only_error(text, max_chars=2_000_000))
    assert len(err.message) < 400


def test_huge_text_is_cut_at_max_chars():
    text = call_text('{"name": "calculator", "arguments": {"expression": "' + "7" * 1_000_000 + '"}}')
    parsed = _timed(lambda: parse_tool_calls(text, TOOLS, max_chars=10_000))
    assert parsed.truncated and len(parsed.text) == 10_000
    assert "missing its closing" in parsed.calls[0].message and "cut" in parsed.calls[0].message


def test_huge_final_answer_is_cut():
    parsed = _timed(lambda: parse_tool_calls("x" * 1_000_000, TOOLS))
    assert parsed.is_final and parsed.truncated and len(parsed.text) == 16_384


def test_many_opening_tags_are_fast():
    parsed = _timed(lambda: parse_tool_calls("<tool_call>" * 100_000, TOOLS))
    assert "nested" in parsed.calls[0].message or "missing" in parsed.calls[0].message


@pytest.mark.parametrize("depth", [100, 5_000, 50_000])
def test_deeply_nested_brackets(depth):
    body = '{"name": "calculator", "arguments": {"expression": ' + "[" * depth + "]" * depth + "}}"
    err = _timed(lambda: only_error(call_text(body), max_chars=200_000))
    assert "nested too deeply" in err.message or "must be of type 'string', got array" in err.message


def test_deep_nesting_inside_arguments_without_schema():
    body = '{"name": "f", "arguments": {"a": ' + "[" * 50_000 + "]" * 50_000 + "}}"
    parsed = _timed(lambda: parse_tool_calls(call_text(body), None, max_chars=200_000))
    assert isinstance(parsed.calls[0], CallError)


@pytest.mark.parametrize(
    "junk",
    [
        "\x00\x01\x02<tool_call>\x00</tool_call>",
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "\\ud800"}}\n</tool_call>',
        '<tool_call>\ufeff\u202e{"name": "calculator"}</tool_call>',
        '<tool_call>💥🔥{"name": "💥", "arguments": {}}</tool_call>',
        "<tool_call>NaN</tool_call>",
        '<tool_call>{"name": "calculator", "arguments": {"expression": "1"}, "name": 3}</tool_call>',
    ],
)
def test_unicode_and_control_junk_never_raises(junk):
    parsed = parse_tool_calls(junk, TOOLS)
    assert not parsed.is_final and len(parsed.calls) == 1


def test_non_string_input_is_tolerated():
    assert parse_tool_calls(None, TOOLS).is_final
    assert parse_tool_calls(12345, TOOLS).text == "12345"
