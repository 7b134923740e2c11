"""A task that lives only under tests/: proof that a task is a plug-in (no edit to components/ or flows/).

Params ``plugins: [tests.tasks.toy_task]`` imports this module before params.yaml is validated;
importing it registers the tool ``shout`` in TOOLS and the task ``toy`` in TASKS. Its own params
section is ``tasks.toy`` (:class:`ToyParams`). A problem asks for a word in capitals
("Shout the word: kiwi"); the expert calls ``shout`` with the word and answers with the tool's output
(``<answer>KIWI</answer>``). The reward is exact match; the task's own metric (the episode_metrics
hook) is the share of episodes that called ``shout``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import polars as pl
from pydantic import Field

from components.envs import BaseTool, ToolEnv, ToolResult, get_tool, register_task, register_tool
from components.tasks.recipe import TaskParams, TaskRecipe

SYSTEM = "Use the shout tool, then answer as <answer>WORD</answer>."
LETTERS = "abcdefgh"


class ToyParams(TaskParams):
    # Letters per generated word (from a-h).
    word_len: int = Field(3, ge=1, le=8)
    # Demonstrations per question: the expert's, then this many copies of it (SFT sees more data).
    copies: int = Field(0, ge=0, le=4)


@register_tool("shout")
class ShoutTool(BaseTool):
    name = "shout"
    description = "Return the text in capitals."
    parameters = {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
        "additionalProperties": False,
    }

    def execute(self, args: dict[str, Any]) -> ToolResult:
        return ToolResult(str(args["text"]).upper())


def _answer(text: str) -> str | None:
    start, end = text.find("<answer>"), text.find("</answer>")
    return text[start + len("<answer>") : end].strip() if 0 <= start < end else None


def reward(text: str, answer: str) -> float:
    return 1.0 if _answer(text) == answer else 0.0


def initial_messages(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": row["question"]}]


def _expert(word: str) -> list[dict[str, Any]]:
    call = {"type": "function", "function": {"name": "shout", "arguments": {"text": word}}}
    return [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "shout", "content": word.upper()},
        {"role": "assistant", "content": f"<answer>{word.upper()}</answer>"},
    ]


def expert_messages(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    return json.loads(row["expert"])


def demonstrations(row: Mapping[str, Any]) -> list[list[dict[str, Any]]]:
    return [expert_messages(row)] * (1 + int(row["copies"]))


def make_splits(
    p: ToyParams, *, seed: int, n_train: int, n_val: int, n_test: int, root: Path, data_dir: Path | None
) -> dict[str, pl.DataFrame]:
    rng = random.Random(seed)
    need = n_train + n_val + n_test
    if need > len(LETTERS) ** p.word_len:
        raise ValueError(f"tasks.toy.word_len={p.word_len} has fewer than {need} distinct words")
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < need:
        w = "".join(rng.choice(LETTERS) for _ in range(p.word_len))
        if w not in seen:
            seen.add(w)
            words.append(w)
    out, start = {}, 0
    for split, n in (("train", n_train), ("val", n_val), ("test", n_test)):
        chunk = words[start : start + n]
        start += n
        out[split] = pl.DataFrame(
            {
                "id": [f"{split}-{i}" for i in range(n)],
                "question": [f"Shout the word: {w}" for w in chunk],
                "answer": [w.upper() for w in chunk],
                "expert": [json.dumps(_expert(w)) for w in chunk],
                "split": [split] * n,
                "n_calls": [1] * n,
                "copies": [p.copies] * n,
            }
        )
    return out


def make_env(
    row: Mapping[str, Any] | None = None,
    *,
    malformed_penalty: float = 0.0,
    data_dir: str | Path | None = None,
    tool_parser: str = "hermes",
) -> ToolEnv:
    return ToolEnv(
        [get_tool("shout")()],
        reward,
        SYSTEM,
        answer_fn=_answer,
        malformed_penalty=malformed_penalty,
        tool_parser=tool_parser,
    )


def tools() -> list[dict[str, Any]]:
    return [get_tool("shout")().schema()]


def episode_metrics(steps: list[dict[str, Any]]) -> dict[str, float]:
    """Share of episodes with at least one ``shout`` call."""
    called: dict[str, bool] = {}
    for s in steps:
        called[s["traj_id"]] = called.get(s["traj_id"], False) or int(s.get("n_calls") or 0) > 0
    return {"shout_rate": sum(called.values()) / max(len(called), 1)}


RECIPE = register_task(
    "toy",
    TaskRecipe(
        name="toy",
        params_model=ToyParams,
        make_splits=make_splits,
        make_env=make_env,
        tools=tools,
        reward=reward,
        initial_messages=initial_messages,
        expert_messages=expert_messages,
        demonstrations=demonstrations,
        episode_metrics=episode_metrics,
    ),
)
