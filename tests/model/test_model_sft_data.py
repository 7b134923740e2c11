"""SFT encoding: labels on assistant tokens only (checked on the label tensor), for several templates."""

from __future__ import annotations

import copy

import pytest
import torch

from components.model.sft_data import IGNORE_INDEX, assistant_char_spans, collate, encode_conversation
from tests.chat_templates import QWEN25_TEMPLATE

# QWEN25_TEMPLATE has no {% generation %} tags.

# A Llama-3-like layout: different role headers, end token with no newline after it, tools ignored.
LLAMA3_LIKE_TEMPLATE = (
    "{{- '<|begin_of_text|>' -}}"
    "{%- for m in messages -%}"
    "{{- '<|start_header_id|>' + m.role + '<|end_header_id|>\\n\\n' + m.content + '<|eot_id|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}"
)

CALL_1 = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "5 * 12"}}\n</tool_call><|im_end|>'
CALL_2 = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "60 + 37"}}\n</tool_call><|im_end|>'
ANSWER = "<answer>97</answer><|im_end|>"


def _labelled_runs(tok, batch_labels: torch.Tensor) -> list[str]:
    """Decode each maximal run of labelled positions of a (T,) label tensor."""
    runs, cur = [], []
    for v in batch_labels.tolist() + [IGNORE_INDEX]:
        if v != IGNORE_INDEX:
            cur.append(v)
        elif cur:
            runs.append(tok.decode(cur, skip_special_tokens=False))
            cur = []
    return runs


def _with_template(tok, template: str):
    other = copy.deepcopy(tok)
    other.chat_template = template
    return other


def test_labels_cover_exactly_the_assistant_turns(tok, calc_tool, calc_messages):
    ids, labels = encode_conversation(tok, calc_messages, [calc_tool], max_len=4096)
    full = tok.apply_chat_template(calc_messages, tools=[calc_tool], tokenize=False)
    assert ids == tok.encode(full, add_special_tokens=False)  # ids of the full rendering, tokenised once
    batch = collate([(ids, labels)], pad_id=tok.pad_token_id)
    lab = batch["labels"][0]  # (T,)
    assert _labelled_runs(tok, lab) == [CALL_1, CALL_2, ANSWER]
    # labelled positions carry the input id; everything else is -100
    inp = batch["input_ids"][0]
    mask = lab != IGNORE_INDEX
    assert torch.equal(lab[mask], inp[mask])
    # the masked tokens are exactly the rest of the rendering: prompt, tool listing, tool outputs, headers
    masked_text = tok.decode(inp[~mask].tolist(), skip_special_tokens=False)
    assert masked_text == full.replace(CALL_1, "").replace(CALL_2, "").replace(ANSWER, "")
    assert "<tool_response>\n60\n</tool_response>" in masked_text and "# Tools" in masked_text
    # every assistant run ends with <|im_end|> and starts right after the "<|im_start|>assistant\n" header
    eos, start = tok.eos_token_id, tok.convert_tokens_to_ids("<|im_start|>")
    idx = mask.nonzero().flatten().tolist()
    run_starts = [i for i in idx if not mask[i - 1]]
    assert len(run_starts) == 3
    for i in run_starts:
        assert tok.decode(inp[i - 3 : i].tolist()) == "<|im_start|>assistant\n" and inp[i - 3] == start
    run_ends = [i for i in idx if i + 1 == len(mask) or not mask[i + 1]]
    assert [int(inp[i]) for i in run_ends] == [eos, eos, eos]


def test_unicode_and_leading_space_content(tok):
    messages = [{"role": "user", "content": "say it"}, {"role": "assistant", "content": " ünï 12 😀"}]
    _, labels = encode_conversation(tok, messages, None, max_len=256)
    assert _labelled_runs(tok, torch.tensor(labels)) == [" ünï 12 😀<|im_end|>"]


@pytest.mark.parametrize("template_name", ["qwen25", "llama3_like"])
def test_masking_is_template_agnostic(tok, calc_tool, calc_messages, template_name):
    template = {"qwen25": QWEN25_TEMPLATE, "llama3_like": LLAMA3_LIKE_TEMPLATE}[template_name]
    other = _with_template(tok, template)
    messages = copy.deepcopy(calc_messages)
    messages[4]["tool_calls"][0]["function"]["arguments"] = {
        "expression": "60 + 37"
    }  # Qwen2.5 tojson's strings
    if template_name == "qwen25":
        expected = [CALL_1, CALL_2, ANSWER]
    else:  # this template renders content only (no tool calls), so give the calls some content
        messages[2]["content"] = "call 5 * 12"
        messages[4]["content"] = "call 60 + 37"
        expected = ["call 5 * 12<|eot_id|>", "call 60 + 37<|eot_id|>", "<answer>97</answer><|eot_id|>"]
    ids, labels = encode_conversation(other, messages, [calc_tool], max_len=4096)
    full = other.apply_chat_template(messages, tools=[calc_tool], tokenize=False)
    assert ids == other.encode(full, add_special_tokens=False)
    assert _labelled_runs(other, torch.tensor(labels)) == expected
    masked = other.decode([i for i, v in zip(ids, labels) if v == IGNORE_INDEX], skip_special_tokens=False)
    for text in expected:
        full = full.replace(text, "", 1)
    assert masked == full
    if template_name == "qwen25":
        assert "You may call one or more functions" in masked and '"description": "e.g. 2 + 3 * 4"' in masked


def test_spans_in_characters(tok):
    messages = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "dd"},
    ]
    full, spans = assistant_char_spans(tok, messages)
    assert [full[s:e] for s, e in spans] == ["b<|im_end|>", "dd<|im_end|>"]
    assert full == (
        "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nb<|im_end|>\n"
        "<|im_start|>user\nc<|im_end|>\n<|im_start|>assistant\ndd<|im_end|>\n"
    )


def test_max_len_boundary(tok, calc_tool, calc_messages):
    ids, _ = encode_conversation(tok, calc_messages, [calc_tool], max_len=4096)
    assert encode_conversation(tok, calc_messages, [calc_tool], max_len=len(ids)) is not None
    assert encode_conversation(tok, calc_messages, [calc_tool], max_len=len(ids) - 1) is None
    with pytest.raises(ValueError, match="max_len=0"):
        encode_conversation(tok, calc_messages, [calc_tool], max_len=0)


def test_bad_conversations_raise(tok):
    with pytest.raises(ValueError, match="no assistant message"):
        encode_conversation(tok, [{"role": "user", "content": "hi"}], None, max_len=64)
    with pytest.raises(ValueError, match=r"messages\[0\] is an assistant"):
        encode_conversation(tok, [{"role": "assistant", "content": "hi"}], None, max_len=64)
    with pytest.raises(ValueError, match=r"messages\[1\] must be a dict"):
        encode_conversation(tok, [{"role": "user", "content": "x"}, "assistant: hi"], None, max_len=64)
    with pytest.raises(ValueError, match="non-empty list"):
        encode_conversation(tok, [], None, max_len=64)


def test_template_whose_prefixes_are_not_prefixes_raises(tok):
    # Renders the number of messages up front: a prefix rendering is never a prefix of the whole.
    counting = _with_template(
        tok,
        "{{- messages | length -}}{%- for m in messages -%}{{- '|' + m.role + ':' + m.content + '<|im_end|>' -}}"
        "{%- endfor -%}{%- if add_generation_prompt -%}{{- '|assistant:' -}}{%- endif -%}",
    )
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    with pytest.raises(ValueError, match=r"not a prefix of the rendering with assistant messages\[1\]"):
        encode_conversation(counting, messages, None, max_len=64)
    # Drops earlier assistant turns (like reasoning-stripping templates): spans differ in the whole.
    dropping = _with_template(
        tok,
        "{%- for m in messages -%}{%- if m.role != 'assistant' or loop.last -%}"
        "{{- '|' + m.role + ':' + m.content + '<|im_end|>' -}}{%- else -%}{{- '|assistant:<|im_end|>' -}}{%- endif -%}"
        "{%- endfor -%}{%- if add_generation_prompt -%}{{- '|assistant:' -}}{%- endif -%}",
    )
    messages = messages + [{"role": "user", "content": "again"}, {"role": "assistant", "content": "ok"}]
    with pytest.raises(ValueError, match=r"assistant messages\[1\] differently"):
        assistant_char_spans(dropping, messages, None)
    # ... so the example is built as the agent loop builds its context: the past is kept as sampled
    ids, labels = encode_conversation(dropping, messages, None, max_len=64)
    text = dropping.decode(ids, skip_special_tokens=False)
    assert text == "|user:hi<|im_end|>|assistant:yo<|im_end|>|user:again<|im_end|>|assistant:ok<|im_end|>"
    learnt = dropping.decode(
        [t for t, lab in zip(ids, labels) if lab != IGNORE_INDEX], skip_special_tokens=False
    )
    assert learnt == "yo<|im_end|>ok<|im_end|>"


def test_collate_right_pads():
    batch = collate([([5, 6, 7], [-100, 6, 7]), ([8], [8])], pad_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 6, 7], [8, -100, -100]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert all(t.dtype == torch.long for t in batch.values())
    with pytest.raises(ValueError, match=r"examples\[1\]"):
        collate([([1], [1]), ([1, 2], [1])], pad_id=0)
    with pytest.raises(ValueError, match="no examples"):
        collate([], pad_id=0)


def test_loss_ignores_masked_positions(tok, calc_tool, calc_messages):
    """Changing a masked label position's token leaves a cross-entropy over labels unchanged."""
    ids, labels = encode_conversation(tok, calc_messages, [calc_tool], max_len=4096)
    batch = collate([(ids, labels)], pad_id=tok.pad_token_id)
    logits = torch.randn(1, len(ids), len(tok), generator=torch.Generator().manual_seed(0))  # (B, T, V)
    lab = batch["labels"][:, 1:]  # (B, T-1)
    loss = torch.nn.functional.cross_entropy(
        logits[:, :-1].flatten(0, 1), lab.flatten(), ignore_index=IGNORE_INDEX
    )
    n = int((lab != IGNORE_INDEX).sum())
    manual = (
        -sum(
            torch.log_softmax(logits[0, t - 1], -1)[labels[t]]
            for t in range(1, len(ids))
            if labels[t] != IGNORE_INDEX
        )
        / n
    )
    assert torch.allclose(loss, manual, atol=1e-5)
    n_expected = sum(len(tok.encode(s, add_special_tokens=False)) for s in (CALL_1, CALL_2, ANSWER))
    assert n == n_expected
