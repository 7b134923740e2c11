"""One question = one episode against an OpenAI-compatible server, with the task's real tools.

Each turn sends the conversation and the task's tool schemas (``tools=``, ``tool_choice="auto"``) to
``/v1/chat/completions``; the server's tool parser (``rollout.tool_parser``, hermes by default)
returns the tool calls. The reply is written back into the text the model produced
(:func:`action_text`: its content, then each call in the format's markup, for hermes
``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>``, the markup the chat template renders)
and handed to the task's own environment (``env.step``), so every call runs the task's real tool with
its time and output limits, and a malformed call gets the feedback training gave it, never an
exception. (When the server cannot parse a call, e.g. bad JSON inside ``<tool_call>``, it returns the
raw text as content, and the environment answers it with its error message, as in training.)

The environment's messages go back to the server as ``tool`` messages; the assistant turn as the
server returned it (its ``tool_calls``), or as raw text when the server parsed no call. An episode
ends at the first turn without a tool call (the final answer), at ``max_turns`` agent turns (training's
``rollout.max_steps``), at a response cut at ``max_tokens`` (not executed), or when the server
refuses a context longer than its ``--max-model-len``.

Departures from the training rollout:
1. The server re-renders the conversation from messages at every turn instead of appending the
   sampled token ids, so a response the model tokenised unusually is re-tokenised canonically.
2. vLLM's parser also reads a ``<tool_call>`` whose ``</tool_call>`` is missing when its JSON is
   complete; the call is then written back closed, and run.
3. A response cut at ``max_tokens`` ends the chat's episode, shown to the user; the training rollout
   hands it to the environment as a malformed action and goes on (components/agent/loop.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ChatAgent", "ChatError", "Event", "action_text"]


class ChatError(RuntimeError):
    """The server stopped answering mid-chat; the message is one line for the user."""


@dataclass(frozen=True)
class Event:
    """What happened, for the terminal: ``kind`` is text, call, result, answer or stop."""

    kind: str
    text: str
    name: str = ""
    is_error: bool = False


def _get(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, Mapping) else getattr(obj, key, None)


def _calls(message: Any) -> list[dict[str, str]]:
    """The server's tool calls of ``message`` as ``{"id", "name", "arguments"}`` (arguments: its JSON text)."""
    out = []
    for i, call in enumerate(_get(message, "tool_calls") or []):
        fn = _get(call, "function") or {}
        args = _get(fn, "arguments")
        out.append(
            {
                "id": str(_get(call, "id") or f"call_{i}"),
                "name": str(_get(fn, "name") or ""),
                "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False),
            }
        )
    return out


def action_text(message: Any, tool_parser: str = "hermes") -> str:
    """The text the model wrote, rebuilt from a chat-completion ``message`` (its content, then each
    tool call in the markup of format ``tool_parser``, as the chat template renders it)."""
    content = _get(message, "content") or ""
    parts = [content] if content else []
    for call in _calls(message):
        if tool_parser == "hermes":  # the server's arguments text as it came
            body = f'{{"name": {json.dumps(call["name"], ensure_ascii=False)}, "arguments": {call["arguments"]}}}'
            parts.append(f"<tool_call>\n{body}\n</tool_call>")
            continue
        from components.envs.tool_formats import get_format

        try:
            args = json.loads(call["arguments"])
        except (ValueError, RecursionError):
            args = call["arguments"]  # written as given: the environment answers with its error
        parts.append(get_format(tool_parser).format_call(call["name"], args))
    return "\n".join(parts)


@dataclass
class ChatAgent:
    """Plays questions on ``client`` (an ``openai.OpenAI``) with model ``model``.

    ``make_env()`` returns a fresh environment of the task (a ToolEnv: ``reset(row)`` gives
    [system, user], ``step(text)`` runs the calls); ``tools``: the task's OpenAI tool schemas."""

    client: Any
    model: str
    tools: list[dict[str, Any]]
    make_env: Callable[[], Any]
    max_turns: int = 4
    max_tokens: int = 64
    temperature: float = 0.0
    url: str = ""
    extra_body: dict[str, Any] = field(default_factory=dict)
    tool_parser: str = "hermes"  # the server's --tool-call-parser: calls are written back in its format

    def _complete(self, messages: list[dict[str, Any]]) -> tuple[Any, str] | str:
        """(message, finish_reason) of one completion, or the server's refusal text (a 400)."""
        import openai

        try:
            r = self.client.chat.completions.create(
                model=self.model,
                messages=messages,
                tools=self.tools,
                tool_choice="auto",
                temperature=self.temperature,
                max_tokens=self.max_tokens,
                extra_body=self.extra_body or None,
            )
        except openai.BadRequestError as err:  # e.g. the context is longer than --max-model-len
            return str(getattr(err, "message", err)).splitlines()[0][:300]
        except (openai.APIConnectionError, openai.APIStatusError) as err:
            raise ChatError(f"the server at {self.url or 'its URL'} stopped answering: {err}") from None
        choice = r.choices[0]
        return choice.message, str(choice.finish_reason)

    def ask(
        self, question: str, *, answer: str | None = None, on_event: Callable[[Event], None] | None = None
    ) -> dict[str, Any]:
        """Play one episode on ``question``; its trajectory (JSON-able). With ``answer`` (the expected
        one) the task's reward and ``correct`` are filled in, else they are None."""
        emit = on_event or (lambda _e: None)
        env = self.make_env()
        messages = env.reset({"question": question, "answer": "" if answer is None else str(answer)})
        traj: dict[str, Any] = {"question": question, "turns": [], "final_text": None, "final_answer": None}
        stop = "max_turns"
        for turn in range(self.max_turns):
            got = self._complete(messages)
            if isinstance(got, str):
                stop = "refused"
                emit(Event("stop", f"the server refused the request: {got}", is_error=True))
                traj["error"] = got
                break
            message, finish = got
            text, calls = action_text(message, self.tool_parser), _calls(message)
            record = _turn_record(turn, text, finish, calls)
            traj["turns"].append(record)
            if finish == "length":
                stop = "cut"
                emit(Event("stop", f"[response cut at {self.max_tokens} tokens]: {text}", is_error=True))
                break
            out = env.step(text)
            if out.done:
                stop = "answer"
                traj["final_text"], traj["final_answer"] = text, out.info.get("answer")
                messages = messages + [{"role": "assistant", "content": text}]
                record.update(reward=out.reward, correct=bool(out.info.get("correct")))
                emit(Event("answer", text, name=str(out.info.get("answer") or "")))
                break
            content = _get(message, "content") or ""
            record["results"] = _show_tool_turn(content, calls, text, out.messages, emit)
            messages = messages + [
                _assistant_message(content, calls, text),
                *_tool_messages(out.messages, calls, turn),
            ]
        if stop == "max_turns":
            emit(Event("stop", f"[no answer after {self.max_turns} turns]", is_error=True))
        traj.update(messages=messages, stop=stop, expected=answer)
        return _scored(traj, stop, answer)


def _turn_record(turn: int, text: str, finish: str | None, calls: list[dict[str, str]]) -> dict[str, Any]:
    """A turn of the trajectory: what the model wrote and the calls the server parsed from it."""
    return {
        "turn": turn,
        "text": text,
        "finish_reason": finish,
        "server_tool_calls": [{"name": c["name"], "arguments": c["arguments"]} for c in calls],
    }


def _show_tool_turn(
    content: str,
    calls: list[dict[str, str]],
    text: str,
    results: list[dict[str, Any]],
    emit: Callable[[Event], None],
) -> list[dict[str, Any]]:
    """Emit a turn that did not end the episode (its text beside calls, each call, each tool result)
    and return the results as the trajectory records them."""
    if calls and content:
        emit(Event("text", content))
    for call in calls:
        emit(Event("call", call["arguments"], name=call["name"]))
    if not calls:  # the server found no well-formed call: the raw markup is what the model wrote
        emit(Event("call", text, name="(unparsed)", is_error=True))
    out = []
    for m in results:
        is_error = str(m.get("content", "")).startswith("error:")
        out.append({"name": m.get("name"), "content": m.get("content"), "is_error": is_error})
        emit(Event("result", str(m.get("content", "")), name=str(m.get("name", "")), is_error=is_error))
    return out


def _assistant_message(content: str, calls: list[dict[str, str]], text: str) -> dict[str, Any]:
    """The assistant turn sent back: as the server returned it (its tool calls), or as raw text when
    the server parsed no call."""
    if not calls:
        return {"role": "assistant", "content": text}
    return {
        "role": "assistant",
        "content": content or None,
        "tool_calls": [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in calls
        ],
    }


def _tool_messages(
    results: list[dict[str, Any]], calls: list[dict[str, str]], turn: int
) -> list[dict[str, Any]]:
    """The environment's messages as ``tool`` messages answering the server's call ids in order (an
    id of our own where the environment answered more than the server parsed)."""
    ids = [c["id"] for c in calls]
    return [
        {
            "role": "tool",
            "tool_call_id": ids[i] if i < len(ids) else f"call_t{turn}_{i}",
            "name": m.get("name"),
            "content": m.get("content", ""),
        }
        for i, m in enumerate(results)
    ]


def _scored(traj: dict[str, Any], stop: str, answer: str | None) -> dict[str, Any]:
    """``traj`` with its ``reward`` and ``correct``: the last turn's with an expected ``answer`` (0 and
    False when the episode ended without one), None without."""
    last = traj["turns"][-1] if traj["turns"] else {}
    traj["reward"] = last.get("reward") if answer is not None else None
    traj["correct"] = bool(last.get("correct")) if answer is not None and stop == "answer" else None
    if answer is not None and stop != "answer":
        traj["reward"], traj["correct"] = 0.0, False
    return traj
