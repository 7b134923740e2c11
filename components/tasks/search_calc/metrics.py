"""The search_calc task's episode metrics (the recipe's ``episode_metrics`` hook), per tool.

Reads step records (one per agent step); each episode's numbers are the JSON ``task_metrics`` of its
last step that has one (``env.py`` writes them at every step, so episodes cut by ``max_steps`` count).

- ``<tool>/calls_per_episode``: calls of ``search`` / ``calculator`` per episode (valid or not);
- ``<tool>/valid_rate``: calls that ran without error / calls;
- ``<tool>/right_tool_rate``: calls made when that tool was the one the step needed (search while a
  gold passage was missing, the calculator once all were found and the answer not yet computed) /
  calls;
- ``right_tool_rate``: agent steps (answers included) whose action was the one the step needed;
- ``both_tools_rate``: episodes that called both tools at least once (validly);
- ``gold_hit_rate``: mean fraction of a question's gold passages that its searches returned.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from components.tasks.search_calc.env import TOOLS
from components.tasks.step_records import by_trajectory, final_numbers

__all__ = ["episode_metrics"]


def episode_metrics(steps: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    finals = [final_numbers(t) for t in by_trajectory(steps).values()]
    n = max(len(finals), 1)
    total = lambda key: sum(float(f.get(key) or 0.0) for f in finals)  # noqa: E731
    out: dict[str, float] = {}
    for tool in TOOLS:
        calls = total(f"{tool}_calls")
        out[f"{tool}/calls_per_episode"] = calls / n
        out[f"{tool}/valid_rate"] = total(f"{tool}_valid") / calls if calls else 0.0
        out[f"{tool}/right_tool_rate"] = total(f"{tool}_right") / calls if calls else 0.0
    steps_total = total("steps")
    out["right_tool_rate"] = total("right_steps") / steps_total if steps_total else 0.0
    out["both_tools_rate"] = sum(all(f.get(f"{t}_valid", 0) for t in TOOLS) for f in finals) / n
    hits = [float(f["gold_hit"]) for f in finals if f.get("gold_hit") is not None]
    out["gold_hit_rate"] = sum(hits) / len(hits) if hits else 0.0
    return out
