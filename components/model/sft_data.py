"""SFT examples from chat conversations: token ids of the full rendering, labels on assistant tokens only.

What it does: renders a conversation with the tokenizer's own chat template, finds the character
span of every assistant turn by rendering message prefixes and diffing the strings, tokenises the
full rendering once (so the ids are exactly those of the whole conversation) and maps the spans onto
tokens with the offset mapping. Labels are the token id inside an assistant span and -100 elsewhere:
the system turn with the tool listing, user turns, tool responses and the ``<|im_start|>assistant\\n``
headers are masked; the assistant's content or tool-call markup and its closing end-of-turn token
are labelled. This needs no ``{% generation %}`` tags, so it works with any HF chat template whose
rendering of ``messages[:k]`` plus the generation prompt is a prefix of the full rendering (Qwen2.5,
Llama 3, ours...); a template for which that is false raises ``ValueError`` naming the message.
A template that renders an assistant turn differently once later messages follow (Qwen3: the last
turn gets an empty ``<think>`` block, earlier ones lose theirs) gets the example the agent loop would
build instead: the first observation, then each response as written after the generation prompt and
the observation after it (``ChatRenderer``, whose docstring names this departure), responses labelled.

Span of assistant message k: ``P = render(messages[:k], add_generation_prompt=True)``,
``Q = render(messages[:k+1])``; the span is ``Q[len(P):]`` with the trailing whitespace the template
puts between turns removed (so it ends at the end-of-turn token, e.g. ``<|im_end|>``). A token is
labelled when its characters overlap a span.

Labels are aligned with ``input_ids`` (not shifted): HF causal LMs shift them internally.
What it does not do: pack several conversations into one row, or truncate (too long -> ``None``).

An assistant message with ``"weight": 0`` (OpenAI's fine-tuning format; 1, the default, is the
other allowed value) is context only: it is rendered and read, never labelled. A task marks so a
reply its demonstrator did not mean (a weaker demonstrator's random detour) when SFT should learn
the recovery that follows it but not the detour itself.

Windowed context (``rollout.context_window`` = k, :func:`encode_turns`): the agent loop then shows the
policy, at step t, the first observation followed by the token segments of the last k turns only (a
segment: the turn's response ids + the observation ids after it). To imitate that, every assistant
turn becomes an example of its own whose context is built the way the loop builds it (the loop's
``ChatRenderer`` renders the first observation and every observation) and whose labels cover that
turn's response only. A response's ids are its span of the full rendering, tokenised on its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from components.agent.render import ChatRenderer

__all__ = ["IGNORE_INDEX", "assistant_char_spans", "collate", "encode_conversation", "encode_turns"]

IGNORE_INDEX = -100


def _render(tokenizer: Any, messages: list[dict], tools: list[dict] | None, generation_prompt: bool) -> str:
    text = tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=generation_prompt
    )
    if not isinstance(text, str):
        raise TypeError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}, expected str")
    return text


def _check_messages(messages: Sequence[dict]) -> list[dict]:
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError(f"messages must be a non-empty list of dicts, got {messages!r:.80}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ValueError(f"messages[{i}] must be a dict with a string 'role', got {m!r:.80}")
        if "weight" in m and (
            m["role"] != "assistant" or m["weight"] not in (0, 1) or isinstance(m["weight"], bool)
        ):
            raise ValueError(
                f"messages[{i}]: 'weight' must be 0 or 1 on an assistant message, got {m['weight']!r} "
                f"on a {m['role']!r} message"
            )
    return list(messages)


def _trained(message: dict) -> bool:
    """Whether SFT learns an assistant message (its ``weight`` is 1 or absent)."""
    return message.get("weight", 1) == 1


class _NotInPlace(ValueError):
    """The template renders an assistant turn differently inside the whole conversation."""


def _turn_spans(
    tokenizer: Any, msgs: list[dict], tools: list[dict] | None
) -> list[tuple[int, str, int, int]]:
    """For each assistant message k: ``(k, upto, start, end)``, ``upto`` the rendering of messages[:k+1]
    and ``upto[start:end]`` the message as the template writes it after the generation prompt."""
    out = []
    for k, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        if k == 0:
            raise ValueError("messages[0] is an assistant message: nothing precedes it to condition on")
        prefix = _render(tokenizer, msgs[:k], tools, True)
        upto = _render(tokenizer, msgs[: k + 1], tools, False)
        if not upto.startswith(prefix):
            raise ValueError(
                f"chat template renders messages[:{k}] + generation prompt as {prefix[-60:]!r}, "
                f"which is not a prefix of the rendering with assistant messages[{k}]"
            )
        end = len(upto.rstrip())
        if end <= len(prefix):
            raise ValueError(f"assistant messages[{k}] renders as nothing after the generation prompt")
        out.append((k, upto, len(prefix), end))
    if not out:
        raise ValueError("conversation has no assistant message: nothing to learn")
    return out


def assistant_char_spans(
    tokenizer: Any, messages: Sequence[dict], tools: list[dict] | None = None
) -> tuple[str, list[tuple[int, int]]]:
    """The full rendering and the ``[start, end)`` character span of each assistant message in it."""
    msgs = _check_messages(messages)
    tools = tools or None
    full = _render(tokenizer, msgs, tools, False)
    spans: list[tuple[int, int]] = []
    for k, upto, start, end in _turn_spans(tokenizer, msgs, tools):
        if full[:end] != upto[:end]:
            raise _NotInPlace(
                f"chat template renders assistant messages[{k}] differently inside the whole "
                "conversation than at the end of its prefix; its spans cannot be found by prefix rendering"
            )
        spans.append((start, end))
    return full, spans


def _responses(tokenizer: Any, msgs: list[dict], tools: list[dict] | None, stop: str) -> list[list[int]]:
    """Each assistant message's ids as the agent loop samples them: the template's writing of it after
    the generation prompt, ending with the stop token (raises naming the message where it does not)."""
    out = []
    for k, upto, start, end in _turn_spans(tokenizer, msgs, tools):
        if not upto[start:end].endswith(stop):
            raise ValueError(
                f"assistant messages[{k}] renders as {upto[start:end][-40:]!r}, which does not end with "
                f"the stop token {stop!r}"
            )
        out.append(tokenizer.encode(upto[start:end], add_special_tokens=False))
    return out


def _loop_example(
    tokenizer: Any, msgs: list[dict], tools: list[dict] | None, max_len: int
) -> tuple[list[int], list[int]] | None:
    """One conversation built as the agent loop builds a context (first observation, then each
    response + the observation after it; ``ChatRenderer``), every trained response labelled: for a
    template that renders earlier turns differently once more follow (Qwen3's think blocks)."""
    renderer = ChatRenderer(tokenizer, tools, stop_token=tokenizer.eos_token)
    responses = _responses(tokenizer, msgs, tools, renderer.stop_token)
    turns = [k for k, m in enumerate(msgs) if m["role"] == "assistant"]
    ids = renderer.prompt(msgs[: turns[0]])
    labels = [IGNORE_INDEX] * len(ids)
    for i, (k, response) in enumerate(zip(turns, responses)):
        ids += response
        labels += response if _trained(msgs[k]) else [IGNORE_INDEX] * len(response)
        if i + 1 < len(turns):
            obs = renderer.observation(msgs[k + 1 : turns[i + 1]])
            ids += obs
            labels += [IGNORE_INDEX] * len(obs)
    return None if len(ids) > max_len else (ids, labels)


def encode_conversation(
    tokenizer: Any, messages: Sequence[dict], tools: list[dict] | None, max_len: int
) -> tuple[list[int], list[int]] | None:
    """``(input_ids, labels)`` of one conversation, or ``None`` when it is longer than ``max_len`` tokens.

    ``labels[i] == input_ids[i]`` for tokens the assistant produced, else ``-100``.
    Raises ``ValueError`` for malformed messages, a conversation without an assistant message, or a
    template whose prefixes are not prefixes (see the module docstring).
    """
    if not isinstance(max_len, int) or max_len < 1:
        raise ValueError(f"max_len={max_len!r} must be a positive int")
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("encode_conversation needs a fast tokenizer (it uses return_offsets_mapping)")
    msgs = _check_messages(messages)
    if not any(_trained(m) for m in msgs if m["role"] == "assistant") and any(
        m["role"] == "assistant" for m in msgs
    ):
        raise ValueError("every assistant message has weight 0: nothing to learn")
    try:
        full, spans = assistant_char_spans(tokenizer, msgs, tools)  # checks the messages
    except _NotInPlace:
        return _loop_example(tokenizer, msgs, tools or None, max_len)
    trained = [_trained(m) for m in msgs if m["role"] == "assistant"]
    spans = [span for span, keep in zip(spans, trained) if keep]
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids: list[int] = list(enc["input_ids"])
    if len(ids) > max_len:
        return None
    labels = [IGNORE_INDEX] * len(ids)
    j = 0  # spans and offsets are both increasing: one merge-like pass
    for i, (start, end) in enumerate(enc["offset_mapping"]):
        while j < len(spans) and spans[j][1] <= start:
            j += 1
        if j == len(spans):
            break
        s, e = spans[j]
        if start < e and (end > s or (start == end and start >= s)):
            labels[i] = ids[i]
    return ids, labels


def encode_turns(
    tokenizer: Any, messages: Sequence[dict], tools: list[dict] | None, max_len: int, *, context_window: int
) -> list[tuple[list[int], list[int]] | None]:
    """One ``(input_ids, labels)`` example per assistant turn (``None`` where longer than ``max_len``),
    none for a turn of weight 0 (which is still in the later examples' context).

    Example i: the first observation (the messages before the first assistant turn, rendered with the
    generation prompt) + the segments of turns max(0, i - k) .. i - 1 (k = ``context_window``; a
    segment is a response's ids + the rendered observation that followed it) + turn i's response ids,
    labelled; everything before them is -100. The stop token that ends a response is
    ``tokenizer.eos_token``, as in the agent loop. Messages after the last assistant turn are ignored.
    """
    if not isinstance(context_window, int) or context_window < 1:
        raise ValueError(f"context_window={context_window!r} must be an int >= 1")
    if not isinstance(max_len, int) or max_len < 1:
        raise ValueError(f"max_len={max_len!r} must be a positive int")
    msgs = _check_messages(messages)
    tools = tools or None
    renderer = ChatRenderer(tokenizer, tools, stop_token=tokenizer.eos_token)
    turns = [k for k, m in enumerate(msgs) if m["role"] == "assistant"]
    responses = _responses(tokenizer, msgs, tools, renderer.stop_token)
    first = renderer.prompt(msgs[: turns[0]])
    ends = turns[1:] + [len(msgs)]
    segments = [r + renderer.observation(msgs[k + 1 : e]) for r, k, e in zip(responses, turns, ends)]
    out: list[tuple[list[int], list[int]] | None] = []
    for i, response in enumerate(responses):
        if not _trained(msgs[turns[i]]):
            continue
        context = first + [t for seg in segments[max(0, i - context_window) : i] for t in seg]
        if len(context) + len(response) > max_len:
            out.append(None)
        else:
            out.append((context + response, [IGNORE_INDEX] * len(context) + response))
    return out


def collate(examples: Sequence[tuple[Sequence[int], Sequence[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad ``(input_ids, labels)`` pairs into ``input_ids``, ``labels``, ``attention_mask``: (B, T)."""
    if not examples:
        raise ValueError("collate got no examples")
    if not isinstance(pad_id, int):
        raise ValueError(f"pad_id={pad_id!r} must be an int")
    for i, ex in enumerate(examples):
        if len(ex) != 2 or len(ex[0]) != len(ex[1]) or not len(ex[0]):
            raise ValueError(f"examples[{i}] must be a pair (input_ids, labels) of equal, non-zero length")
    t = max(len(ids) for ids, _ in examples)
    b = len(examples)
    input_ids = torch.full((b, t), pad_id, dtype=torch.long)  # (B, T)
    labels = torch.full((b, t), IGNORE_INDEX, dtype=torch.long)  # (B, T)
    attention_mask = torch.zeros((b, t), dtype=torch.long)  # (B, T)
    for i, (ids, labs) in enumerate(examples):
        n = len(ids)
        input_ids[i, :n] = torch.as_tensor(ids, dtype=torch.long)
        labels[i, :n] = torch.as_tensor(labs, dtype=torch.long)
        attention_mask[i, :n] = 1
    return {"input_ids": input_ids, "labels": labels, "attention_mask": attention_mask}
