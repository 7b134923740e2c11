"""The search_calc environment: a ToolEnv with ``search`` (the search task's BM25 tool) and
``calculator`` (the calc task's), the outcome reward of a numeric answer, per-tool bookkeeping and
process rewards.

At each step, before the action, the environment knows which action the question needs next:
``search`` while a gold passage (column ``gold_titles``) has not been returned by any search of the
episode, then ``calculator`` until a calculator call has returned the answer, then ``answer``. Each
call (and a final answer) is "the right tool for the step" when it is that action. Every step writes
the episode's numbers so far as JSON into ``info["task_metrics"]`` (read by ``metrics.py``), so an
episode cut by ``max_steps`` keeps them too: ``correct``, ``gold_hit`` (fraction of gold passages
returned), per tool ``<tool>_calls``, ``<tool>_valid`` (ran without error), ``<tool>_right``, and
``steps`` / ``right_steps`` (every action, answers included).

Process rewards (:meth:`SearchCalcEnv.process_rewards`, one per step; None for a step without a tool
call): the mean over the step's calls of

- a ``search`` that ran and returned a gold passage no earlier search of the episode returned: 1;
- a ``calculator`` call that ran and whose result is the answer, or is a number of a later calculator
  call's expression (it feeds the next call): 1;
- anything else (a search that found nothing new, a wrong sum, a malformed call, an unknown tool): 0.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from fractions import Fraction
from pathlib import Path
from typing import Any

from components.envs.base import StepOutcome, ToolEnv
from components.envs.registry import get_tool
from components.tasks.calc.calculator import CalculatorTool, evaluate
from components.tasks.calc.reward import normalize_number, parse_answer, score
from components.tasks.search.env import gold_titles, search_tool
from components.tasks.search.index import SearchIndex
from components.tasks.search.tool import SearchTool
from components.tasks.search_calc.prompts import SYSTEM_PROMPT

__all__ = ["TOOLS", "SearchCalcEnv", "make_env", "tools"]

TOOLS = ("search", "calculator")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def _numbers(expression: Any) -> set[Fraction]:
    return {Fraction(m) for m in _NUMBER.findall(str(expression)[:200])}


def _titles_in(result: str, titles: list[str]) -> set[str]:
    """The titles among ``titles`` whose passage is a line of a search result (generated passages
    start with their title)."""
    lines = result.splitlines()
    return {t for t in titles if any(line.startswith(t + " ") or line.startswith(t + ":") for line in lines)}


class SearchCalcEnv(ToolEnv):
    def __init__(
        self,
        search: SearchTool,
        *,
        malformed_penalty: float = 0.0,
        max_output_chars: int = 1000,
        tool_parser: str = "hermes",
    ):
        super().__init__(
            [search, get_tool(CalculatorTool.name)()],
            score,
            SYSTEM_PROMPT,
            answer_fn=parse_answer,
            malformed_penalty=malformed_penalty,
            max_output_chars=max_output_chars,
            tool_parser=tool_parser,
        )
        self.search = search
        self._gold: list[str] = []
        self._answer: Fraction | None = None
        self._reset_episode()

    def _reset_episode(self) -> None:
        self._found: set[str] = set()  # gold titles returned so far
        self._computed = False  # a calculator call has returned the answer
        self._steps: list[list[dict[str, Any]]] = []  # per step, its calls (tool, ok, score/value)
        self._counts = {f"{t}_{k}": 0 for t in TOOLS for k in ("calls", "valid", "right")}
        self._counts.update(steps=0, right_steps=0)

    def reset(self, row: Mapping[str, Any]) -> list[dict[str, Any]]:
        messages = super().reset(row)
        self.search.clear()
        self._gold = gold_titles(row)
        truth = normalize_number(str(row["answer"]))
        self._answer = None if truth is None else Fraction(truth)
        self._reset_episode()
        return messages

    def needed(self) -> str:
        """The action the question needs next: search, calculator or answer."""
        if any(t not in self._found for t in self._gold):
            return "search"
        return "answer" if self._computed else "calculator"

    def step(self, action_text: str) -> StepOutcome:
        need = self.needed()
        out = super().step(action_text)
        calls = []
        for name, args, result in self.last_calls:
            call: dict[str, Any] = {"tool": name, "ok": name in TOOLS and not result.is_error, "score": 0.0}
            if name in TOOLS:
                self._counts[f"{name}_calls"] += 1
                self._counts[f"{name}_valid"] += call["ok"]
                self._counts[f"{name}_right"] += name == need
            if call["ok"] and name == "search":
                new = _titles_in(result.text, self._gold) - self._found
                call["score"] = 1.0 if new else 0.0
                self._found |= new
            elif call["ok"] and name == "calculator":
                value = Fraction(evaluate(args["expression"]))  # it ran, so it evaluates
                call["value"], call["numbers"] = value, _numbers(args["expression"])
                if value == self._answer:
                    call["score"], self._computed = 1.0, True
            calls.append(call)
        self._steps.append(calls)
        self._counts["steps"] += 1
        if out.done:
            right = need == "answer"
        else:
            right = bool(calls) and all(c["tool"] == need for c in calls)
        self._counts["right_steps"] += right
        metrics = {
            **self._counts,
            "correct": float(out.info.get("correct", False)),
            "gold_hit": len(self._found) / len(self._gold) if self._gold else None,
        }
        out.info["task_metrics"] = json.dumps(metrics)
        return out

    def process_rewards(self) -> list[float | None]:
        """One score per step so far (the module docstring); None for a step without a tool call."""
        later: list[set[Fraction]] = []  # numbers of the calculator calls after each step
        seen: set[Fraction] = set()
        for calls in reversed(self._steps):
            later.append(set(seen))
            for c in calls:
                seen |= c.get("numbers", set())
        later.reverse()
        out: list[float | None] = []
        for calls, after in zip(self._steps, later):
            if not calls:
                out.append(None)
                continue
            scores = [1.0 if c["score"] or ("value" in c and c["value"] in after) else 0.0 for c in calls]
            out.append(sum(scores) / len(scores))
        return out


def make_env(
    row: Mapping[str, Any] | None = None,
    *,
    malformed_penalty: float = 0.0,
    data_dir: str | Path | None = None,
    index: SearchIndex | None = None,
    top_k: int | None = None,
    max_result_chars: int | None = None,
    tool_parser: str = "hermes",
) -> SearchCalcEnv:
    """A fresh environment over ``index``, or over the index ``prepare`` saved in ``data_dir``
    (the search task's :func:`search_tool`)."""
    search, chars = search_tool(
        "search_calc", data_dir=data_dir, index=index, top_k=top_k, max_result_chars=max_result_chars
    )
    return SearchCalcEnv(
        search,
        malformed_penalty=malformed_penalty,
        max_output_chars=max(chars + 100, 200),
        tool_parser=tool_parser,
    )


def tools() -> list[dict[str, Any]]:
    """The OpenAI tool schemas of the task: search, then calculator."""
    return [get_tool(name).schema() for name in TOOLS]
