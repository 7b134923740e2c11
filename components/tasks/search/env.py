"""The search task's environment: a ToolEnv with the ``search`` tool over a saved index.

Besides the outcome reward (EM of the normalised answer), the final step's ``info["task_metrics"]``
holds the episode's task metrics as JSON (read by ``metrics.episode_metrics``): ``em``, ``f1`` (token F1
of the answer, 0 without ``<answer>``), ``n_queries`` (valid searches run) and ``gold_hit`` (fraction of
the row's gold passages, column ``gold_titles``, that any search of the episode returned; null for a
row without gold passages). The index is loaded once per directory and shared by every environment.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from components.envs.base import StepOutcome, ToolEnv
from components.envs.registry import get_tool
from components.tasks.search.index import SearchIndex, load_index
from components.tasks.search.params import INDEX_DIR, TOOL_FILE
from components.tasks.search.prompts import SYSTEM_PROMPT
from components.tasks.search.reward import f1, parse_answer, score
from components.tasks.search.tool import DEFAULT_MAX_RESULT_CHARS, DEFAULT_TOP_K, SearchTool

__all__ = ["SearchEnv", "gold_titles", "make_env", "tools"]


def gold_titles(row: Mapping[str, Any]) -> list[str]:
    """The titles of a row's gold passages (its ``gold_titles`` JSON list; [] when absent)."""
    raw = row.get("gold_titles")
    if not raw:
        return []
    titles = json.loads(raw) if isinstance(raw, str) else list(raw)
    if not isinstance(titles, list) or not all(isinstance(t, str) for t in titles):
        raise ValueError(f"task row {row.get('id')!r}: column 'gold_titles' is not a JSON list of strings")
    return titles


class SearchEnv(ToolEnv):
    def __init__(
        self,
        tool: SearchTool,
        *,
        malformed_penalty: float = 0.0,
        max_output_chars: int = 1000,
        tool_parser: str = "hermes",
    ):
        super().__init__(
            [tool],
            score,
            SYSTEM_PROMPT,
            answer_fn=parse_answer,
            malformed_penalty=malformed_penalty,
            max_output_chars=max_output_chars,
            tool_parser=tool_parser,
        )
        self.tool = tool
        self._gold: list[str] = []

    def reset(self, row: Mapping[str, Any]) -> list[dict[str, Any]]:
        messages = super().reset(row)
        self.tool.clear()
        self._gold = gold_titles(row)
        return messages

    def _finish(self, text: str, info: dict[str, Any]) -> StepOutcome:
        out = super()._finish(text, info)
        answer = out.info.get("answer")
        retrieved = set(self.tool.retrieved)
        metrics = {
            "em": float(out.reward >= 1.0),
            "f1": 0.0 if answer is None else f1(answer, self._truth or ""),
            "n_queries": float(self.tool.n_queries),
            "gold_hit": (sum(t in retrieved for t in self._gold) / len(self._gold)) if self._gold else None,
        }
        out.info["task_metrics"] = json.dumps(metrics)
        return out


def search_tool(
    task: str,
    *,
    data_dir: str | Path | None,
    index: SearchIndex | None,
    top_k: int | None,
    max_result_chars: int | None,
) -> tuple[SearchTool, int]:
    """The ``search`` tool over ``index``, or over the index ``prepare`` saved in ``data_dir``
    (``data_dir/index``, with the tool settings of ``tool.json`` unless given here), and its
    ``max_result_chars``. ``task`` names the environment in the error when neither is given."""
    settings = {"top_k": DEFAULT_TOP_K, "max_result_chars": DEFAULT_MAX_RESULT_CHARS}
    if index is None:
        if data_dir is None:
            raise ValueError(f"the {task} environment needs data_dir (the task's prepare output) or an index")
        directory = Path(data_dir) / INDEX_DIR
        index = load_index(directory)
        if (directory / TOOL_FILE).is_file():
            settings.update(json.loads((directory / TOOL_FILE).read_text()))
    if top_k is not None:
        settings["top_k"] = top_k
    if max_result_chars is not None:
        settings["max_result_chars"] = max_result_chars
    tool = get_tool("search")(index, top_k=settings["top_k"], max_result_chars=settings["max_result_chars"])
    return tool, settings["max_result_chars"]


def make_env(
    row: Mapping[str, Any] | None = None,
    *,
    malformed_penalty: float = 0.0,
    data_dir: str | Path | None = None,
    index: SearchIndex | None = None,
    top_k: int | None = None,
    max_result_chars: int | None = None,
    tool_parser: str = "hermes",
) -> SearchEnv:
    """A fresh search environment over ``index``, or over the index ``prepare`` saved in ``data_dir``
    (:func:`search_tool`)."""
    tool, chars = search_tool(
        "search", data_dir=data_dir, index=index, top_k=top_k, max_result_chars=max_result_chars
    )
    return SearchEnv(
        tool,
        malformed_penalty=malformed_penalty,
        max_output_chars=max(chars + 100, 200),
        tool_parser=tool_parser,
    )


def tools() -> list[dict[str, Any]]:
    """The OpenAI tool schemas of the search task (for ``apply_chat_template(tools=...)``)."""
    return [get_tool("search").schema()]
