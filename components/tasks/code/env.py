"""The code task's environment: a ToolEnv with the ``python`` tool, graded by reasoning-gym's checker.

The sandbox is the process's shared one for the task's settings (``data_dir/sandbox.json``, written
by prepare from ``tasks.code``; the defaults without it), started on the first environment and
reused by every later one; the agent loop steps up to the sandbox's ``workers`` episodes at once
(``concurrent_steps``), so their programs run side by side. A traceback or a wrong print is a tool
result like any other: the model can try again within ``rollout.max_steps``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from components.envs.base import ToolEnv
from components.envs.registry import get_tool
from components.sandbox import SandboxLimits, shared_sandbox
from components.tasks.code.generator import score_answer
from components.tasks.code.params import SANDBOX_FILE, CodeParams
from components.tasks.code.tool import PythonTool
from components.tasks.prompts import answer_content, question_messages

__all__ = ["SYSTEM_PROMPT", "CodeEnv", "initial_messages", "make_env", "parse_answer", "tools"]

SYSTEM_PROMPT = (
    "Solve the problem by running Python with the python tool: it returns what your program printed. "
    "Then give the final answer as <answer>...</answer>."
)


def parse_answer(text: str) -> str | None:
    """The content of the final ``<answer>...</answer>``, or None."""
    return answer_content(text)


class CodeEnv(ToolEnv):
    """A ToolEnv whose reward is reasoning-gym's ``score_answer`` of the row's generator (column
    ``generator``) on the row's item (``question``, ``answer`` and reasoning-gym's ``metadata``)."""

    def __init__(
        self, tool: PythonTool, *, malformed_penalty: float = 0.0, tool_parser: str = "hermes"
    ) -> None:
        super().__init__(
            [tool],
            self._score,
            SYSTEM_PROMPT,
            answer_fn=parse_answer,
            malformed_penalty=malformed_penalty,
            # the sandbox stops a program at wall_s; a call may also wait for a free worker
            tool_timeout_s=tool.sandbox.limits.wall_s * 4 + 10,
            max_output_chars=tool.sandbox.limits.output_bytes,
            tool_parser=tool_parser,
        )
        self._generator = ""
        self._item: dict[str, Any] = {}
        # the sandbox runs this many programs at once: the agent loop steps as many episodes together
        self.concurrent_steps = tool.sandbox.workers

    def reset(self, row: Mapping[str, Any]) -> list[dict[str, Any]]:
        missing = [c for c in ("generator", "metadata") if c not in row]
        if missing:
            raise KeyError(f"task row has no {missing} column (columns: {sorted(row)})")
        self._generator = str(row["generator"])
        metadata = json.loads(row["metadata"]) if isinstance(row["metadata"], str) else row["metadata"]
        self._item = {"question": row.get("question", ""), "answer": str(row["answer"]), "metadata": metadata}
        return super().reset(row)

    def _score(self, text: str, truth: str) -> float:
        return score_answer(self._generator, parse_answer(text), {**self._item, "answer": truth})


def make_env(
    row: Mapping[str, Any] | None = None,
    *,
    malformed_penalty: float = 0.0,
    data_dir: str | Path | None = None,
    tool_parser: str = "hermes",
) -> CodeEnv:
    """A fresh code environment on the shared sandbox (``row`` is accepted for the common factory
    signature and unused: reset() takes the row)."""
    settings = CodeParams().sandbox_settings()
    if data_dir is not None and (Path(data_dir) / SANDBOX_FILE).is_file():
        settings = json.loads((Path(data_dir) / SANDBOX_FILE).read_text())
    sandbox = shared_sandbox(
        SandboxLimits(**settings["limits"]),
        workers=settings["workers"],
        allow_weaker=settings["allow_weaker"],
    )
    return CodeEnv(
        get_tool(PythonTool.name)(sandbox), malformed_penalty=malformed_penalty, tool_parser=tool_parser
    )


def tools() -> list[dict[str, Any]]:
    """The OpenAI tool schemas of the code task."""
    return [get_tool(PythonTool.name).schema()]


initial_messages = question_messages(SYSTEM_PROMPT)
