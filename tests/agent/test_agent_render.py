"""ChatRenderer: prompt/observation ids continue a conversation token for token, for more than one template."""

from __future__ import annotations

import copy

import pytest
from agent_helpers import answer, call, tokenizer

from components.agent.render import ChatRenderer
from components.envs import get_task
from components.model.tokenizer import EOS_TOKEN
from tests.chat_templates import QWEN25_TEMPLATE

# QWEN25_TEMPLATE differs from the embedded template in its system turn (default system prompt, JSON
# tool schemas inside <tools>) and in whitespace handling.

# A made-up template with a different layout: nothing after the stop token, role headers in brackets,
# each tool result in its own turn. The observation must follow it too.
BRACKET_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' and m.tool_calls -%}"
    "[assistant]{%- for c in m.tool_calls -%}<tool_call>\n"
    '{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}\n</tool_call>'
    "{%- endfor -%}<|im_end|>"
    "{%- else -%}[{{ m.role }}]{{ m.content }}<|im_end|>{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}[assistant]{%- endif -%}"
)

TEMPLATES = {"embedded": None, "qwen2.5": QWEN25_TEMPLATE, "bracket": BRACKET_TEMPLATE}
# A string only that template's rendering of a tool conversation contains (proves the template was used).
MARKERS = {
    "embedded": "# Tools\n- calculator(",
    "qwen2.5": '<tools>\n{"type": "function"',
    "bracket": "[user]What",
}


def with_template(template: str | None):
    tok = tokenizer()
    if template is None:
        return tok
    tok = copy.deepcopy(tok)
    tok.chat_template = template
    return tok


def tool_msg(content: str) -> dict:
    return {"role": "tool", "name": "calculator", "content": content}


def assistant_call(expression: str) -> dict:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": "calculator", "arguments": {"expression": expression}}}
        ],
    }


@pytest.fixture
def calc():
    return get_task("calc")


def test_embedded_observation_is_the_tool_turn_by_hand(calc):
    tok = tokenizer()
    r = ChatRenderer(tok, calc.tools(), EOS_TOKEN)
    obs = r.observation([tool_msg("97")])
    assert tok.decode(obs, skip_special_tokens=False) == (
        "\n<|im_start|>user\n<tool_response>\n97\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    # consecutive tool results share one user turn
    two = r.observation([tool_msg("60"), tool_msg("97")])
    assert tok.decode(two, skip_special_tokens=False) == (
        "\n<|im_start|>user\n<tool_response>\n60\n</tool_response>\n<tool_response>\n97\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n"
    )
    # the special tokens are single ids, not spelled out
    assert obs.count(tok.convert_tokens_to_ids("<|im_start|>")) == 2
    assert obs.count(tok.convert_tokens_to_ids("<tool_response>")) == 1


def test_prompt_ends_with_generation_prompt(calc):
    tok = tokenizer()
    r = ChatRenderer(tok, calc.tools(), EOS_TOKEN)
    msgs = calc.make_env().reset({"id": "x", "question": "What is 60 + 37?", "answer": "97"})
    text = tok.decode(r.prompt(msgs), skip_special_tokens=False)
    assert text.startswith("<|im_start|>system\n" + msgs[0]["content"])
    assert "- calculator(expression: string)" in text  # tools are rendered into the prompt
    assert text.endswith("<|im_start|>user\nWhat is 60 + 37?<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_prompt_response_observation_continue_the_rendered_conversation(calc, name):
    """prompt + response (with its stop id) + observation == the whole conversation rendered at once."""
    tok = with_template(TEMPLATES[name])
    r = ChatRenderer(tok, calc.tools(), EOS_TOKEN)
    eos = tok.convert_tokens_to_ids(EOS_TOKEN)
    first = [{"role": "system", "content": "Solve it."}, {"role": "user", "content": "What is 60 + 37?"}]
    ids = r.prompt(first)
    ids += tok.encode(call("60 + 37"), add_special_tokens=False) + [eos]
    ids += r.observation([tool_msg("97")])
    ids += tok.encode(call("97 * 2"), add_special_tokens=False) + [eos]
    ids += r.observation([tool_msg("194"), tool_msg("error: division by zero")])
    whole = tok.apply_chat_template(
        first
        + [
            assistant_call("60 + 37"),
            tool_msg("97"),
            assistant_call("97 * 2"),
            tool_msg("194"),
            tool_msg("error: division by zero"),
        ],
        tools=calc.tools(),
        tokenize=False,
        add_generation_prompt=True,
    )
    assert MARKERS[name] in whole and all(MARKERS[o] not in whole for o in MARKERS if o != name)
    assert tok.decode(ids, skip_special_tokens=False) == whole
    assert ids == tok.encode(whole, add_special_tokens=False)


def test_observation_differs_per_template_and_ignores_history(calc):
    obs = {}
    for name, template in TEMPLATES.items():
        tok = with_template(template)
        r = ChatRenderer(tok, calc.tools(), EOS_TOKEN)
        obs[name] = tok.decode(r.observation([tool_msg("97")]), skip_special_tokens=False)
    assert obs["qwen2.5"] == obs["embedded"]  # same turn layout after the stop token
    assert obs["bracket"] == "[tool]97<|im_end|>[assistant]"  # nothing follows the stop token here
    # without tools the observation is the same (it is rendered after a fixed anchor conversation)
    tok = tokenizer()
    assert ChatRenderer(tok, None, EOS_TOKEN).observation([tool_msg("97")]) == ChatRenderer(
        tok, calc.tools(), EOS_TOKEN
    ).observation([tool_msg("97")])


def test_observation_rejects_templates_it_cannot_follow():
    no_prefix = with_template(
        "{{ messages | length }}{% for m in messages %}[{{ m.role }}]{{ m.content }}<|im_end|>{% endfor %}"
    )
    # re-rendering the past (here: a message count up front) is followed and named, not refused
    r = ChatRenderer(no_prefix, None, EOS_TOKEN)
    assert r.departure is None
    assert no_prefix.decode(r.observation([tool_msg("1")]), skip_special_tokens=False) == "[tool]1<|im_end|>"
    assert "renders earlier turns differently" in r.departure and "'2[user]x" in r.departure
    # a stop token that ends the conversation, not each turn, is refused
    drops_stop = with_template("{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}<|im_end|>")
    with pytest.raises(ValueError, match="renders nothing after the stop token"):
        ChatRenderer(drops_stop, None, EOS_TOKEN).observation([tool_msg("1")])
    no_stop = with_template("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}")
    with pytest.raises(ValueError, match="never emits the stop token"):
        ChatRenderer(no_stop, None, EOS_TOKEN).observation([tool_msg("1")])


def test_decode_strips_only_the_final_stop_token():
    tok = tokenizer()
    r = ChatRenderer(tok, None, EOS_TOKEN)
    eos = tok.convert_tokens_to_ids(EOS_TOKEN)
    assert r.stop_id == eos
    body = tok.encode(answer("97"), add_special_tokens=False)
    assert r.decode(body + [eos]) == "<answer>97</answer>"
    assert r.decode(body) == "<answer>97</answer>"  # a cut response has no stop token
    assert r.decode([eos]) == ""
    assert r.decode([]) == ""
    # a stop token inside the response (not last) is kept, and tool-call markup stays text
    text = call("1 + 1")
    ids = tok.encode(text, add_special_tokens=False)
    assert r.decode(ids + [eos]) == text
    assert r.decode([eos] + body + [eos]) == "<|im_end|><answer>97</answer>"
