"""Tool-call formats by family (components.envs.tool_formats): every registered parser reads back what
its writer and the embedded chat template write, turns malformed and hostile output into feedback,
and a template that writes another format is refused by name. The non-hermes parsers are vLLM's
(the first use imports vLLM: seconds)."""

from __future__ import annotations

import hashlib
import time

import pytest

from benchmarks.parser_fuzz import TOOLS as FUZZ_TOOLS
from benchmarks.parser_fuzz import broken_contract, hostile_texts
from components.envs import tool_formats
from components.envs.base import ToolEnv
from components.envs.parsing import CallError, ToolCall, format_tool_call
from components.envs.tool_formats import TOOL_PARSERS, check_chat_template, get_format
from components.model.tokenizer import CHAT_TEMPLATE, build_tokenizer, chat_template
from components.registry import UnknownNameError
from components.tasks.calc.calculator import CalculatorTool
from components.tasks.calc.reward import parse_answer, score

NAMES = TOOL_PARSERS.names()
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "arithmetic",
            "parameters": {
                "type": "object",
                "properties": {
                    "expression": {"type": "string"},
                    "n": {"type": "integer"},
                    "xs": {"type": "array"},
                    "opts": {"type": "object"},
                },
                "required": ["expression"],
            },
        },
    }
]
CALLS = [
    ("calc", {"expression": "5 * 12"}),
    ("calc", {"expression": "42", "n": 7}),  # a string that reads as a number stays a string
    ("calc", {"expression": 'é ✓ "quoted" <b>', "xs": [1, "a", None], "opts": {"deep": {"k": True}}}),
    ("calc", {"expression": "line1\nline2"}),
]


def test_registry_lists_the_families_and_refuses_unknown_names():
    assert NAMES == ["hermes", "llama3_json", "mistral", "qwen3_coder", "qwen3_xml"]
    with pytest.raises(UnknownNameError, match=r"unknown tool parser 'openai'.*hermes.*mistral"):
        get_format("openai")
    with pytest.raises(UnknownNameError, match="llama3_json"):
        ToolEnv([CalculatorTool()], score, "s", answer_fn=parse_answer, tool_parser="llama3")


def test_hermes_stays_the_project_parser_and_template():
    fmt = get_format("hermes")
    assert fmt.format_call is format_tool_call
    assert chat_template("hermes") is CHAT_TEMPLATE
    # the embedded template of every result so far, byte for byte (as at 9ad8986, before tool formats)
    assert hashlib.sha256(CHAT_TEMPLATE.encode()).hexdigest() == _HERMES_TEMPLATE_SHA256
    assert len(build_tokenizer([], 300)) == 263  # 256 bytes + 7 added tokens, as before


_HERMES_TEMPLATE_SHA256 = "296378de115c81fae0ef7b63c82b0520da35bd823ccd59ef29ac267e084374fa"


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("call", CALLS, ids=range(len(CALLS)))
def test_format_then_parse_gives_the_same_call(name, call):
    fmt = get_format(name)
    parsed = fmt.parse(fmt.format_call(*call), TOOLS)
    assert parsed.calls == (ToolCall(*call),) and not parsed.is_final


@pytest.mark.parametrize("name", NAMES)
def test_several_calls_in_one_turn_read_in_order(name):
    fmt = get_format(name)
    parsed = fmt.parse("\n".join(fmt.format_call(*c) for c in CALLS), TOOLS)
    assert parsed.calls == tuple(ToolCall(*c) for c in CALLS)
    capped = fmt.parse("\n".join(fmt.format_call(*CALLS[0]) for _ in range(5)), TOOLS, max_calls=3)
    assert capped.calls[:3] == (ToolCall(*CALLS[0]),) * 3
    assert isinstance(capped.calls[3], CallError) and "too many tool calls" in capped.calls[3].message


@pytest.mark.parametrize("name", NAMES)
def test_the_embedded_template_writes_what_format_call_writes(name):
    fmt = get_format(name)
    tok = build_tokenizer([], 300, tool_parser=name)
    for marker in fmt.added_tokens:
        assert len(tok.encode(marker, add_special_tokens=False)) == 1
    message = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in CALLS],
    }
    text = tok.apply_chat_template([{"role": "user", "content": "q"}, message], tools=TOOLS, tokenize=False)
    calls = "\n".join(fmt.format_call(*c) for c in CALLS)
    assert text.endswith("<|im_start|>assistant\n" + calls + "<|im_end|>\n")
    check_chat_template(tok, name)  # the SFT / chat guard accepts it


@pytest.mark.parametrize("name", [n for n in NAMES if n != "hermes"])
def test_a_template_of_another_format_is_refused_by_name(name):
    with pytest.raises(ValueError, match=rf"rollout.tool_parser='{name}' cannot read the tool calls"):
        check_chat_template(build_tokenizer([], 300), name)  # the hermes template
    with pytest.raises(ValueError, match="rollout.tool_parser='hermes' cannot read"):
        check_chat_template(build_tokenizer([], 300, tool_parser=name), "hermes")


def test_a_template_that_cannot_render_tool_calls_is_refused():
    tok = build_tokenizer([], 300)
    tok.chat_template = "{{ raise_exception('no tools here') }}"
    with pytest.raises(
        ValueError, match="rollout.tool_parser='mistral': the model's chat template cannot render"
    ):
        check_chat_template(tok, "mistral")


# A chat template with no tool support at all: it renders roles and contents, ignoring tools= and
# tool_calls (as many base models' templates do).
PLAIN_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Tools listed in a system turn, but an assistant tool call rendered as its (empty) content only.
LISTS_TOOLS_DROPS_CALLS = (
    "{% if tools %}<|im_start|>system\n{{ tools | tojson }}<|im_end|>\n{% endif %}" + PLAIN_TEMPLATE
)


@pytest.mark.parametrize("tools", [True, False])
def test_a_tokenizer_without_a_chat_template_is_refused_saying_so(tools):
    tok = build_tokenizer([], 300)
    tok.chat_template = None
    with pytest.raises(
        ValueError, match=r"^the model's tokenizer has no chat template \(tokenizer.chat_template"
    ):
        check_chat_template(tok, "hermes", tools=tools)


@pytest.mark.parametrize(
    ("template", "match"),
    [
        (PLAIN_TEMPLATE, "has no tool support: it renders the prompt the same with and without tools="),
        (
            LISTS_TOOLS_DROPS_CALLS,
            r"has no tool support: an assistant turn with a tool call renders as '.*', without",
        ),
    ],
    ids=["ignores-tools", "drops-calls"],
)
def test_a_template_without_tool_support_is_refused_saying_so_for_a_tool_task_only(template, match):
    tok = build_tokenizer([], 300)
    tok.chat_template = template
    for name in ("hermes", "llama3_json"):
        with pytest.raises(ValueError, match=f"^the model's chat template {match}"):
            check_chat_template(tok, name)
    check_chat_template(tok, "hermes", tools=False)  # a task whose actions are text needs no tools


def test_a_template_that_cannot_render_a_plain_turn_is_refused_for_a_tool_less_task():
    tok = build_tokenizer([], 300)
    tok.chat_template = "{{ raise_exception('system first') }}"
    with pytest.raises(ValueError, match="cannot render a user and an assistant turn .*system first"):
        check_chat_template(tok, "hermes", tools=False)


def test_base_model_checks_a_tool_less_task_for_a_chat_template_only(tmp_path):
    from flows._stage import StageError
    from flows.base_model import check_template

    tok = build_tokenizer([], 300)
    tok.chat_template = PLAIN_TEMPLATE
    tok.save_pretrained(tmp_path)
    check_template(tmp_path, "hermes", tools=False)  # sokoban on a model without tool support
    with pytest.raises(StageError, match="chat template has no tool support"):
        check_template(tmp_path, "hermes", tools=True)


MALFORMED = {
    "llama3_json": ['{"name": "calc", "parameters": {"expression": "1"', '{"parameters": {}}', "{"],
    "mistral": ["[TOOL_CALLS]", '[TOOL_CALLS]calc[ARGS]{"expression": "1"', "[TOOL_CALLS]calc[ARGS][1]"],
    "qwen3_xml": ["<tool_call>", "<tool_call>\n<function=calc>\n<parameter=n>\n7\n</parameter>\n</function>"],
}
MALFORMED["qwen3_coder"] = MALFORMED["qwen3_xml"]


@pytest.mark.parametrize(("name", "text"), [(n, t) for n, ts in MALFORMED.items() for t in ts])
def test_a_malformed_call_is_feedback_not_a_final_answer(name, text):
    parsed = get_format(name).parse(text, TOOLS)
    assert not parsed.is_final and parsed.calls and not parsed.valid_calls
    assert all(isinstance(c, CallError) and 0 < len(c.message) < 400 for c in parsed.calls)


@pytest.mark.parametrize("name", NAMES)
def test_unknown_tools_and_bad_arguments_get_the_hermes_messages(name):
    fmt = get_format(name)
    (unknown,) = fmt.parse(fmt.format_call("search", {"q": "x"}), TOOLS).calls
    assert unknown == CallError("unknown tool 'search'; available tools: ['calc']", "search")
    (missing,) = fmt.parse(fmt.format_call("calc", {"n": 3}), TOOLS).calls
    assert missing == CallError("invalid arguments for calc: 'expression' is a required property", "calc")


@pytest.mark.parametrize("name", NAMES)
def test_prose_is_a_final_answer(name):
    for text in ["<answer>97</answer>", "The answer is 4 {roughly}.", "", "x" * 100_000]:
        assert get_format(name).parse(text, TOOLS).is_final


class _Raises:
    """A vLLM parser class double: raises from extract_tool_calls (or sleeps past the bound)."""

    def __init__(self, tokenizer, tools):
        pass

    def extract_tool_calls(self, text, request):
        if "sleep" in text:
            time.sleep(1.0)
        raise NotImplementedError("GptOssToolParser is a stub")


def test_whatever_vllm_raises_or_hangs_on_becomes_feedback(monkeypatch):
    monkeypatch.setattr(tool_formats, "_parser_class", lambda name: _Raises)
    monkeypatch.setattr(tool_formats, "PARSE_TIMEOUT_S", 0.2)
    fmt = get_format("mistral")
    (err,) = fmt.parse("[TOOL_CALLS]calc[ARGS]{}", TOOLS).calls
    assert "NotImplementedError: GptOssToolParser is a stub" in err.message
    start = time.perf_counter()
    (err,) = fmt.parse("[TOOL_CALLS]sleep", TOOLS).calls
    assert time.perf_counter() - start < 0.8 and "took more than 0.2 s" in err.message


def test_a_tool_env_reads_its_family_format():
    env = ToolEnv([CalculatorTool()], score, "s", answer_fn=parse_answer, tool_parser="mistral")
    env.reset({"question": "5 * 12?", "answer": "60"})
    out = env.step(get_format("mistral").format_call("calculator", {"expression": "5 * 12"}))
    assert [m["content"] for m in out.messages] == ["60"] and out.info["n_valid_calls"] == 1
    out = env.step(format_tool_call("calculator", {"expression": "5 * 12"}))  # hermes markup: prose here
    assert out.done and out.info["n_calls"] == 0


@pytest.mark.parametrize("name", NAMES)
def test_hostile_fuzz_never_crashes_nor_breaks_the_contract(name):
    """A small share of benchmarks/parser_fuzz.py (which runs 100,000 cases per parser)."""
    fmt = get_format(name)
    for text in hostile_texts(seed=1, n=150):
        parsed = fmt.parse(text, FUZZ_TOOLS, max_chars=4096, max_calls=8)
        assert broken_contract(parsed) is None, text[:200]


@pytest.mark.parametrize("name", NAMES)
def test_the_chat_cli_writes_back_and_serves_in_the_same_format(name):
    from components.chat.agent import action_text
    from components.chat.server import vllm_command

    message = {
        "content": "",
        "tool_calls": [
            {"id": "c0", "function": {"name": "calc", "arguments": '{"expression": "5 * 12", "n": 7}'}}
        ],
    }
    parsed = get_format(name).parse(action_text(message, name), TOOLS)
    assert parsed.calls == (ToolCall("calc", {"expression": "5 * 12", "n": 7}),)
    argv = vllm_command("m", port=1, served_name="m", tool_parser=name)
    assert argv[argv.index("--tool-call-parser") + 1] == name


def test_base_model_and_sft_refuse_a_model_whose_template_writes_another_format(tmp_path):
    from flows._stage import StageError
    from flows.base_model import check_template

    build_tokenizer([], 300).save_pretrained(tmp_path)  # the hermes template
    check_template(tmp_path, "hermes")
    with pytest.raises(StageError, match=r"rollout.tool_parser='llama3_json' cannot read the tool calls"):
        check_template(tmp_path, "llama3_json")
