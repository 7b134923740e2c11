"""The ``search`` tool: the top-k passages of the task's BM25 index for a text query.

The result is one tool message: the passages best first, one per line (``title: text``, or just the
text when it starts with its title, as generated passages do), cut to ``max_result_chars``. Every bad
query gets one ``error: ...`` line, never an exception: a non-string, an empty or blank query, a query
longer than ``max_query_chars``. A query that matches nothing (only stopwords or unknown words) gets
``no results for '<query>'`` (not an error: the model should rephrase). The parser has already
rejected calls whose arguments break the JSON schema (missing ``query``, extra arguments, wrong type);
the tool checks again, so it is safe to call directly.

The titles of every passage the tool returned since the last :meth:`SearchTool.clear` are kept in
``retrieved`` (the environment reads them for the retrieval hit rate).
"""

from __future__ import annotations

from typing import Any

from components.envs.base import BaseTool, ToolResult
from components.envs.registry import register_tool
from components.tasks.search.index import Hit, SearchIndex

__all__ = ["SearchTool", "format_hits"]

DEFAULT_TOP_K = 2
DEFAULT_MAX_RESULT_CHARS = 400
DEFAULT_MAX_QUERY_CHARS = 200


def _line(hit: Hit) -> str:
    return hit.text if not hit.title or hit.text.startswith(hit.title) else f"{hit.title}: {hit.text}"


def format_hits(hits: list[Hit], max_chars: int) -> str:
    """The passages one per line; whole passages while they fit in ``max_chars``, the first one cut if
    it alone is longer."""
    lines: list[str] = []
    used = 0
    for hit in hits:
        line = _line(hit)
        extra = len(line) + (1 if lines else 0)
        if used + extra > max_chars:
            if not lines:
                lines.append(line[: max(max_chars - 3, 0)] + "...")
            break
        lines.append(line)
        used += extra
    return "\n".join(lines)


@register_tool("search")
class SearchTool(BaseTool):
    name = "search"
    description = "Search the encyclopedia. Returns the best matching passages."
    parameters = {
        "type": "object",
        "properties": {"query": {"type": "string", "description": "for example: Ava Lin"}},
        "required": ["query"],
        "additionalProperties": False,
    }

    def __init__(
        self,
        index: SearchIndex,
        *,
        top_k: int = DEFAULT_TOP_K,
        max_result_chars: int = DEFAULT_MAX_RESULT_CHARS,
        max_query_chars: int = DEFAULT_MAX_QUERY_CHARS,
    ) -> None:
        if top_k < 1 or max_result_chars < 10 or max_query_chars < 1:
            raise ValueError(
                "search tool: need top_k >= 1, max_result_chars >= 10, max_query_chars >= 1, got "
                f"top_k={top_k}, max_result_chars={max_result_chars}, max_query_chars={max_query_chars}"
            )
        self.index = index
        self.top_k = top_k
        self.max_result_chars = max_result_chars
        self.max_query_chars = max_query_chars
        self.retrieved: list[str] = []  # titles returned since clear()
        self.n_queries = 0  # valid queries run since clear()

    def clear(self) -> None:
        self.retrieved = []
        self.n_queries = 0

    def execute(self, args: dict[str, Any]) -> ToolResult:
        if not isinstance(args, dict):
            return ToolResult(f"error: arguments must be an object, got {type(args).__name__}", is_error=True)
        extra = sorted(str(k)[:40] for k in args if k != "query")
        if extra:
            return ToolResult(f"error: unknown argument(s) {extra}; search takes only 'query'", is_error=True)
        if "query" not in args:
            return ToolResult("error: missing argument 'query'", is_error=True)
        query = args["query"]
        if not isinstance(query, str):
            return ToolResult(f"error: query must be a string, got {type(query).__name__}", is_error=True)
        query = " ".join(query.split())
        if not query:
            return ToolResult("error: empty query; write a few words, e.g. a name", is_error=True)
        if len(query) > self.max_query_chars:
            return ToolResult(
                f"error: query too long ({len(query)} chars > {self.max_query_chars})", is_error=True
            )
        self.n_queries += 1
        hits = self.index.search(query, self.top_k)
        if not hits:
            return ToolResult(f"no results for {query[:60]!r}")
        self.retrieved.extend(h.title for h in hits)
        return ToolResult(format_hits(hits, self.max_result_chars))
