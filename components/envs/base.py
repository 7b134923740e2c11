"""The environment interface (AgentEnv), tools (BaseTool) and ToolEnv, an env made of tools only.

An episode: ``reset(row)`` gives the first messages (system + user); then each model response goes to
``step(action_text)``, which returns the observation messages to append (tool results or error
feedback), the step's reward, whether the episode is over, and an ``info`` dict. Messages are HF/OpenAI
chat dicts, so the chat template turns them into tokens (the agent loop owns tokens, not the env).

ToolEnv turns every problem in the model's output into feedback text: a malformed call, an unknown
tool, bad arguments, a tool that raises, times out or prints too much. ``step`` never raises on model
output. It does not count turns (``max_steps`` is the agent loop's job) and does not render tokens.

Departures from Agent-R1's ToolEnv:
1. The episode ends at the first response without tool-call markup (a final answer); its reward is the
   task's outcome reward. Tool (process) rewards and the malformed-call penalty land on their own step.
2. A tool's time limit is enforced with a daemon thread: a tool that overruns is reported as timed out
   and abandoned, not killed, so tools must bound their own work.
"""

from __future__ import annotations

import math
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from components.envs.parsing import CallError, short, tool_validators
from components.envs.tool_formats import get_format

__all__ = ["AgentEnv", "BaseTool", "StepOutcome", "ToolEnv", "ToolResult", "run_tool"]


@dataclass(frozen=True)
class ToolResult:
    text: str
    reward: float | None = None  # a process reward for this call, if the tool gives one
    is_error: bool = False  # the call failed (the text explains why)


class BaseTool(ABC):
    """A tool the model can call: a name, a description and a JSON schema of its arguments."""

    name: ClassVar[str]
    description: ClassVar[str]
    parameters: ClassVar[dict[str, Any]]

    @abstractmethod
    def execute(self, args: dict[str, Any]) -> ToolResult:
        """Run on arguments already validated against ``parameters``."""

    @classmethod
    def schema(cls) -> dict[str, Any]:
        """The OpenAI function schema (what ``apply_chat_template(tools=...)`` takes); from the class
        alone, so a task lists its tools without building them (a search tool needs its index)."""
        return {
            "type": "function",
            "function": {"name": cls.name, "description": cls.description, "parameters": cls.parameters},
        }


@dataclass
class StepOutcome:
    messages: list[dict[str, Any]]  # observation messages to append; empty when done
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)
    truncated: bool = False  # the env itself cut the episode (e.g. a time limit), not a natural end


class AgentEnv(ABC):
    """One episode at a time: ``reset(row)`` then ``step(action_text)`` until ``done``."""

    tools: list[dict[str, Any]]  # OpenAI tool schemas, for the chat template
    # How many episodes' ``step`` calls the agent loop may run at once, each in a thread of its own
    # (every episode has its own env instance). 1 (the default): one after another, for envs that
    # compute in this process (threads would only add overhead) or share state between instances.
    # An env whose step waits on another process sets more (the code task: its sandbox's workers).
    concurrent_steps: int = 1

    @abstractmethod
    def reset(self, row: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Start an episode on a task row; return the initial messages (system + user)."""

    @abstractmethod
    def step(self, action_text: str) -> StepOutcome:
        """Apply one model response (raw text) and return what the environment says back."""

    def process_rewards(self) -> list[float | None] | None:
        """The process reward of each ``step`` call of the episode so far, in order: a score of the
        step's tool calls (e.g. a search that found a passage the question needs), None for a step
        the task does not score (a final answer). The agent loop asks once the episode has ended and
        stores the scores in the step rows' ``process_reward`` column, apart from ``reward``; the
        advantage normalises them (docs/algorithms.md, "Process rewards"). None (the default): the
        task scores no step."""
        return None

    def state_key(self) -> str | None:
        """The key of the environment's current state: the state the next action responds to.

        Equal keys mean the same state. ``gigpo`` groups the steps of one prompt group that share a
        key (its "anchor states", arXiv 2505.10978), including a state revisited within one episode.
        The agent loop records it before each action as the step's ``obs_key``. None (the default):
        the environment has no such key, and ``gigpo`` falls back to grouping by step index.
        """
        return None


def _clean(text: str) -> str:
    # Lone surrogates (e.g. from a JSON "\ud800" escape) cannot be tokenised; replace them.
    return text.encode("utf-8", "replace").decode("utf-8")


def run_tool(tool: BaseTool, args: dict[str, Any], *, timeout_s: float, max_output_chars: int) -> ToolResult:
    """Execute ``tool`` within a time limit and an output-size limit; failures become error results."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = tool.execute(args)
        except BaseException as err:
            box["error"] = err

    worker = threading.Thread(target=target, name=f"tool-{tool.name}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        return ToolResult(f"error: {tool.name} timed out after {timeout_s:g} s", is_error=True)
    if "error" in box:
        err = box["error"]
        return ToolResult(f"error: {tool.name} failed: {type(err).__name__}: {short(err)}", is_error=True)
    result = box.get("result")
    if isinstance(result, str):
        result = ToolResult(result)
    if not isinstance(result, ToolResult):
        return ToolResult(
            f"error: {tool.name} returned {type(result).__name__}, not a ToolResult", is_error=True
        )
    text = _clean(str(result.text))
    if len(text) > max_output_chars:
        text = text[:max_output_chars] + f"... [output cut: {len(text) - max_output_chars} more chars]"
    reward = result.reward
    if reward is not None and not (isinstance(reward, (int, float)) and math.isfinite(reward)):
        return ToolResult(f"error: {tool.name} gave a non-finite reward {reward!r}", is_error=True)
    return ToolResult(text, None if reward is None else float(reward), bool(result.is_error))


class ToolEnv(AgentEnv):
    """An AgentEnv made of tools, a system prompt and the task's reward function.

    ``reward_fn(final_text, ground_truth) -> float`` scores the final answer (``correct`` means a
    reward >= 1); ``answer_fn(final_text) -> str | None`` extracts the answer (None: not well formed).
    """

    def __init__(
        self,
        tools: Sequence[BaseTool],
        reward_fn: Callable[[str, str], float],
        system_prompt: str,
        *,
        answer_fn: Callable[[str], str | None],
        question_key: str = "question",
        answer_key: str = "answer",
        malformed_penalty: float = 0.0,
        tool_timeout_s: float = 2.0,
        max_output_chars: int = 1000,
        max_action_chars: int = 16_384,
        max_calls_per_step: int = 8,
        tool_parser: str = "hermes",
    ) -> None:
        names = [t.name for t in tools]
        if len(set(names)) != len(names):
            raise ValueError(f"tool names must be unique, got {names}")
        if malformed_penalty < 0:
            raise ValueError(f"malformed_penalty must be >= 0 (it is subtracted), got {malformed_penalty}")
        if tool_timeout_s <= 0 or max_output_chars < 1 or max_action_chars < 1 or max_calls_per_step < 1:
            raise ValueError(
                "tool_timeout_s, max_output_chars, max_action_chars and max_calls_per_step must be positive, got "
                f"{tool_timeout_s}, {max_output_chars}, {max_action_chars}, {max_calls_per_step}"
            )
        self._tools = {t.name: t for t in tools}
        fmt = get_format(tool_parser)  # an unknown name raises, listing the known ones
        fmt.prepare()
        self._parse = fmt.parse
        self.tool_parser = tool_parser
        self.tools = [t.schema() for t in tools]
        tool_validators(self.tools)  # a bad tool schema fails here, not in the middle of a rollout
        self.reward_fn = reward_fn
        self.answer_fn = answer_fn
        self.system_prompt = system_prompt
        self.question_key = question_key
        self.answer_key = answer_key
        self.malformed_penalty = float(malformed_penalty)
        self.tool_timeout_s = tool_timeout_s
        self.max_output_chars = max_output_chars
        self.max_action_chars = max_action_chars
        self.max_calls_per_step = max_calls_per_step
        self.history: list[dict[str, Any]] = []  # the whole conversation so far, for inspection
        # The last step's tool calls, in order: (tool name or None, arguments or None, result); a call
        # that failed to parse has its error as the result. For subclasses that score or count calls.
        self.last_calls: list[tuple[str | None, dict[str, Any] | None, ToolResult]] = []
        self._truth: str | None = None
        self._done = True

    def reset(self, row: Mapping[str, Any]) -> list[dict[str, Any]]:
        for key in (self.question_key, self.answer_key):
            if key not in row:
                raise KeyError(f"task row has no {key!r} column (columns: {sorted(row)})")
        self._truth = str(row[self.answer_key])
        self._done = False
        messages = [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": str(row[self.question_key])},
        ]
        self.history = [dict(m) for m in messages]
        return messages

    def step(self, action_text: str) -> StepOutcome:
        if self._truth is None:
            raise RuntimeError("step() called before reset()")
        if self._done:
            raise RuntimeError("step() called after the episode ended; call reset() first")
        parsed = self._parse(
            action_text, self.tools, max_chars=self.max_action_chars, max_calls=self.max_calls_per_step
        )
        self.history.append({"role": "assistant", "content": _clean(parsed.text)})
        self.last_calls = []
        info: dict[str, Any] = {"action_truncated": parsed.truncated, "correct": False, "answer": None}
        if parsed.is_final:
            return self._finish(parsed.text, info)

        messages, reward, tool_errors = [], 0.0, 0
        for call in parsed.calls:
            if isinstance(call, CallError):
                messages.append(self._tool_message(call.name or "invalid_call", f"error: {call.message}"))
                self.last_calls.append((call.name, None, ToolResult(f"error: {call.message}", is_error=True)))
                continue
            result = run_tool(
                self._tools[call.name],
                call.arguments,
                timeout_s=self.tool_timeout_s,
                max_output_chars=self.max_output_chars,
            )
            tool_errors += result.is_error
            reward += result.reward or 0.0
            self.last_calls.append((call.name, call.arguments, result))
            messages.append(self._tool_message(call.name, result.text))
        n_errors = len(parsed.errors)
        if n_errors:
            reward -= self.malformed_penalty
        self.history.extend(messages)
        info.update(
            n_calls=len(parsed.calls),
            n_valid_calls=len(parsed.calls) - n_errors,
            n_tool_errors=tool_errors,
            format_error=n_errors > 0,
        )
        return StepOutcome(messages=messages, reward=reward, done=False, info=info)

    def _finish(self, text: str, info: dict[str, Any]) -> StepOutcome:
        self._done = True
        answer = self.answer_fn(text)
        try:
            reward = float(self.reward_fn(text, self._truth))
        except Exception as err:
            reward, info["reward_error"] = 0.0, f"{type(err).__name__}: {short(err)}"
        if not math.isfinite(reward):
            reward, info["reward_error"] = 0.0, f"non-finite reward {reward!r}"
        info.update(
            n_calls=0,
            n_valid_calls=0,
            n_tool_errors=0,
            format_error=answer is None,
            correct=reward >= 1.0,
            answer=answer,
        )
        return StepOutcome(messages=[], reward=reward, done=True, info=info)

    @staticmethod
    def _tool_message(name: str, content: str) -> dict[str, Any]:
        return {"role": "tool", "name": _clean(name), "content": _clean(content)}
