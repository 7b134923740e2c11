"""The calc task's environment: a ToolEnv with the calculator, the calc system prompt and reward."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from components.envs.base import ToolEnv
from components.envs.registry import get_tool
from components.tasks.calc.calculator import CalculatorTool
from components.tasks.calc.prompts import SYSTEM_PROMPT
from components.tasks.calc.reward import parse_answer, score

__all__ = ["make_env", "tools"]


def make_env(
    row: Mapping[str, Any] | None = None,
    *,
    malformed_penalty: float = 0.0,
    data_dir: str | Path | None = None,
    tool_parser: str = "hermes",
) -> ToolEnv:
    """A fresh calc environment, its tool looked up by name in TOOLS (``row`` and ``data_dir`` are
    accepted for the common factory signature and unused: reset() takes the row); ``tool_parser``:
    the tool-call format the env reads (components.envs.tool_formats)."""
    return ToolEnv(
        [get_tool(CalculatorTool.name)()],
        score,
        SYSTEM_PROMPT,
        answer_fn=parse_answer,
        malformed_penalty=malformed_penalty,
        tool_parser=tool_parser,
    )


def tools() -> list[dict[str, Any]]:
    """The OpenAI tool schemas of the calc task (for ``apply_chat_template(tools=...)``)."""
    return [get_tool(CalculatorTool.name).schema()]
