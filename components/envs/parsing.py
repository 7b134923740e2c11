"""Find tool calls in a model's raw output text (hermes / Qwen2.5 ``<tool_call>`` markup).

A call is written ``<tool_call>\\n{"name": "...", "arguments": {...}}\\n</tool_call>``; one response may
hold several. :func:`parse_tool_calls` returns every call it finds, in order, each either a
:class:`ToolCall` (well-formed, known tool, arguments valid against the tool's JSON schema) or a
:class:`CallError` whose message is meant to be shown to the model as feedback. Text with no tool-call
markup at all is a final answer. Model output is untrusted: the parser reads at most ``max_chars``
characters and ``max_calls`` calls, uses ``json`` (never ``eval``) and never raises on any string.

It does not execute tools, and it does not judge final answers (that is the task's reward).

Departures from the hermes format as served by vLLM's hermes parser:
1. ``arguments`` given as a JSON *string* holding an object (OpenAI wire style) is accepted and decoded.
2. A ``<tool_call>`` without its ``</tool_call>`` is an error, not a call (no guessing where it ends).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

__all__ = [
    "CLOSE_TAG",
    "OPEN_TAG",
    "CallError",
    "ParsedAction",
    "ToolCall",
    "check_call",
    "format_tool_call",
    "parse_tool_calls",
    "short",
    "tool_validators",
]

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"
# Feedback strings are cut to this many characters (a 1 MB argument must not become a 1 MB message).
_MAX_MESSAGE = 200


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class CallError:
    """A tool call that cannot be executed; ``message`` is feedback for the model."""

    message: str
    name: str | None = None  # the tool name, when it could be read


@dataclass(frozen=True)
class ParsedAction:
    calls: tuple[ToolCall | CallError, ...]
    is_final: bool  # no tool-call markup at all: the text is a final answer
    truncated: bool  # the text was longer than max_chars; only its head was parsed
    text: str  # the parsed text (the head, when truncated)

    @property
    def valid_calls(self) -> list[ToolCall]:
        return [c for c in self.calls if isinstance(c, ToolCall)]

    @property
    def errors(self) -> list[CallError]:
        return [c for c in self.calls if isinstance(c, CallError)]


def short(value: object, limit: int = _MAX_MESSAGE) -> str:
    """``str(value)`` cut to ``limit`` characters, with a marker when cut."""
    try:
        text = str(value)
    except Exception:  # a hostile __str__ or a recursion limit
        text = f"<unprintable {type(value).__name__}>"
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} more chars]"


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """The text a model writes to call ``name`` (what the hermes chat template renders)."""
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{OPEN_TAG}\n{body}\n{CLOSE_TAG}"


@lru_cache(maxsize=64)
def _validators(tools_json: str) -> dict[str, Draft202012Validator]:
    out = {}
    for i, tool in enumerate(json.loads(tools_json)):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ValueError(
                f"tools[{i}] is not an OpenAI function schema {{'type': 'function', 'function': {{'name': ...}}}}"
            )
        schema = fn.get("parameters") or {"type": "object"}
        Draft202012Validator.check_schema(schema)
        out[fn["name"]] = Draft202012Validator(schema)
    return out


def tool_validators(tools: Sequence[dict]) -> dict[str, Draft202012Validator]:
    """JSON-schema validators of the arguments of each tool, by name (cached; raises on a bad schema)."""
    return _validators(json.dumps(list(tools), sort_keys=True))


def _parse_body(body: str, validators: dict[str, Draft202012Validator] | None) -> ToolCall | CallError:
    body = body.strip()
    if not body:
        return CallError('empty <tool_call>; write {"name": ..., "arguments": {...}} inside it')
    try:
        obj = json.loads(body)
    except RecursionError:
        return CallError("tool call JSON is nested too deeply")
    except ValueError as err:  # JSONDecodeError, and ints longer than Python's digit limit
        return CallError(f"tool call is not valid JSON: {short(err)}")
    if not isinstance(obj, dict):
        return CallError(
            f"tool call must be a JSON object with 'name' and 'arguments', got {type(obj).__name__}"
        )
    return check_call(obj.get("name"), obj.get("arguments", {}), validators)


def check_call(
    name: object, args: object, validators: dict[str, Draft202012Validator] | None
) -> ToolCall | CallError:
    """A call read by any format's parser, checked: ``name`` a non-empty string, ``args`` a JSON object
    (or a JSON string holding one), known tool and valid arguments when ``validators`` are given."""
    if not isinstance(name, str) or not name:
        return CallError("tool call has no 'name' (a non-empty string)")
    name = short(name, 64)
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):
            return CallError(f"'arguments' of {name} is a string that is not a JSON object", name)
    if not isinstance(args, dict):
        return CallError(f"'arguments' of {name} must be a JSON object, got {type(args).__name__}", name)
    if validators is None:
        return ToolCall(name, args)
    validator = validators.get(name)
    if validator is None:
        return CallError(f"unknown tool {name!r}; available tools: {sorted(validators)}", name)
    try:
        err = best_match(validator.iter_errors(args))
    except RecursionError:
        return CallError(f"arguments of {name} are nested too deeply", name)
    if err is not None:
        return CallError(f"invalid arguments for {name}: {_schema_message(err)}", name)
    return ToolCall(name, args)


_JSON_TYPES = {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer", float: "number"}


def _schema_message(err: Any) -> str:
    """A short jsonschema error: jsonschema's own message, or (when it is long) its gist."""
    where = "/".join(str(p) for p in err.absolute_path) or "arguments"
    if err.validator == "type":
        got = _JSON_TYPES.get(type(err.instance), type(err.instance).__name__)
        return f"{where} must be of type {err.validator_value!r}, got {got}"
    message = short(err.message)
    return message if where == "arguments" else f"{where}: {message}"


def parse_tool_calls(
    text: str,
    tools: Sequence[dict] | None = None,
    *,
    max_chars: int = 16_384,
    max_calls: int = 8,
) -> ParsedAction:
    """Every tool call in ``text``, in order; with ``tools`` (OpenAI schemas) names and arguments are checked.

    Never raises on model output: anything unusable becomes a :class:`CallError` entry.
    """
    text = "" if text is None else str(text)
    truncated = len(text) > max_chars
    head = text[:max_chars]
    if OPEN_TAG not in head and CLOSE_TAG not in head:
        return ParsedAction(calls=(), is_final=True, truncated=truncated, text=head)
    validators = tool_validators(tools) if tools is not None else None
    calls: list[ToolCall | CallError] = []
    pos = 0
    while True:
        start = head.find(OPEN_TAG, pos)
        if start < 0:
            break
        if len(calls) == max_calls:
            calls.append(
                CallError(f"too many tool calls in one turn (at most {max_calls}); the rest were ignored")
            )
            break
        body_start = start + len(OPEN_TAG)
        end = head.find(CLOSE_TAG, body_start)
        if end < 0:
            cut = " (the response was cut)" if truncated else ""
            calls.append(CallError(f"<tool_call> is missing its closing </tool_call>{cut}"))
            break
        body = head[body_start:end]
        if OPEN_TAG in body:
            calls.append(CallError("nested <tool_call> tags; write one call per <tool_call>...</tool_call>"))
        else:
            calls.append(_parse_body(body, validators))
        pos = end + len(CLOSE_TAG)
    if not calls:  # only closing tags
        calls.append(CallError("found </tool_call> without an opening <tool_call>"))
    return ParsedAction(calls=tuple(calls), is_final=False, truncated=truncated, text=head)
