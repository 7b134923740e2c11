"""The verifiers task's data, environments, demonstrations and metrics (the recipe's functions).

Data: the environment's taskset is its one stream of tasks (verifiers 0.4 has no train/eval split):
a finite taskset is shuffled by ``seed`` and cut into test, val and train (in that order); an
infinite one (a seeded game) gives its tasks ``seed * total`` to ``(seed + 1) * total - 1``. A row
holds the task (``task``: its TaskData as JSON, what the environment resets on), ``question`` (the
prompt's text), ``initial`` (the opening messages as the environment gives them), and, when the
environment module has an ``expert_policy``, the expert's episode played through the environment
(``expert``; ``answer`` its weighted reward). Without one, ``expert`` is null: the task has no
demonstrations for SFT.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import polars as pl

from components.schemas import TaskSchema, validate_table
from components.tasks.demonstrations import encode
from components.tasks.recipe import split_sizes
from components.tasks.step_records import by_trajectory, step_numbers
from components.tasks.verifiers.adapter import ERRORS, VerifiersEnv
from components.tasks.verifiers.loader import Loaded, load
from components.tasks.verifiers.params import VerifiersParams, current

__all__ = [
    "demonstrations",
    "episode_metrics",
    "expert_messages",
    "initial_messages",
    "make_env",
    "make_splits",
    "play_expert",
    "tools",
]

SETTINGS_FILE = "verifiers.json"


def _env(p: VerifiersParams, loaded: Loaded, tool_parser: str = "hermes") -> VerifiersEnv:
    return VerifiersEnv(
        loaded,
        max_turns=p.max_turns,
        turn_timeout_s=p.turn_timeout_s,
        success_reward=p.success_reward,
        tool_parser=tool_parser,
    )


def _tasks(loaded: Loaded, total: int, seed: int) -> list[Any]:
    taskset = loaded.taskset
    if taskset.bounded:
        tasks = list(taskset)
        if len(tasks) < total:
            raise ValueError(
                f"tasks.verifiers.env: {loaded.env_id} has {len(tasks)} tasks, fewer than "
                f"prepare.n_train + n_val + n_test = {total}"
            )
        random.Random(seed).shuffle(tasks)
        return tasks[:total]
    return list(itertools.islice(taskset, seed * total, (seed + 1) * total))


def _check_task(loaded: Loaded, task: Any, n: int) -> None:
    data = task.data
    if loaded.single_agent and data.prompt is None:
        raise ValueError(
            f"tasks.verifiers.env: {loaded.env_id} task {n} ({data.name or data.id or data.idx}) has no "
            "'prompt': SingleAgentEnv needs one to open the conversation"
        )
    if data.prompt is not None and not isinstance(data.prompt, str):
        for i, m in enumerate(data.prompt):
            if not isinstance(getattr(m, "content", None), str):
                raise ValueError(
                    f"tasks.verifiers.env: {loaded.env_id} task {n} ({data.name or data.id}): column "
                    f"'prompt' message {i} has no text content (multimodal prompts are not supported)"
                )


def play_expert(
    env: VerifiersEnv, row: Mapping[str, Any], policy: Any
) -> tuple[list[dict], list[dict], float]:
    """(opening messages, the expert's messages after them, its reward): ``policy(messages) -> reply``
    played through ``env`` until the episode ends."""
    opening = env.reset(row)
    conversation, after = list(opening), []
    for _ in range(env.max_turns + 1):
        reply = str(policy(conversation))
        out = env.step(reply)
        turn = [{"role": "assistant", "content": reply}, *out.messages]
        conversation += turn
        after += turn
        if out.done:
            if out.info.get("error"):
                raise ValueError(
                    f"the expert's episode ended with {out.info['error']}: {out.info.get('error_message')}"
                )
            return opening, after, out.reward
    raise ValueError("the expert's episode did not end within tasks.verifiers.max_turns replies")


def make_splits(
    p: VerifiersParams,
    *,
    seed: int,
    n_train: int,
    n_val: int,
    n_test: int,
    root: Path,
    data_dir: Path | None = None,
) -> dict[str, pl.DataFrame]:
    sizes = split_sizes(n_train, n_val, n_test)
    loaded = load(p.env, p.args)  # bad input fails here, before any row is made
    tasks = _tasks(loaded, sum(sizes.values()), seed)
    for n, task in enumerate(tasks):
        _check_task(loaded, task, n)
    env = _env(p, loaded)
    policy_of = loaded.expert_policy
    out, start = {}, 0
    for split in ("test", "val", "train"):
        rows = []
        for task in tasks[start : start + sizes[split]]:
            data = task.data.model_dump(mode="json", exclude_none=True)
            row = {"id": f"{split}-{len(rows)}", "task": json.dumps(data, sort_keys=True)}
            if policy_of is not None:
                opening, expert, reward = play_expert(env, row, policy_of(task))
                answer, n_calls = f"{reward:g}", sum(m["role"] == "assistant" for m in expert)
            else:
                opening, expert, answer, n_calls = env.reset(row), None, "", 0
            question = next((m["content"] for m in opening if m["role"] == "user"), "") or "(no prompt)"
            rows.append(
                row
                | {
                    "question": question,
                    "answer": answer,
                    "expert": None if expert is None else encode(expert),
                    "initial": encode(opening),
                    "n_calls": n_calls,
                    "split": split,
                }
            )
        start += sizes[split]
        schema = {"expert": pl.String, "n_calls": pl.Int64}
        frame = (
            pl.DataFrame(rows, schema_overrides=schema)
            if rows
            else pl.DataFrame(
                schema={
                    c: pl.String for c in ("id", "task", "question", "answer", "expert", "initial", "split")
                }
                | {"n_calls": pl.Int64}
            )
        )
        out[split] = validate_table(frame, TaskSchema, split)
    if data_dir is not None:
        Path(data_dir).mkdir(parents=True, exist_ok=True)
        (Path(data_dir) / SETTINGS_FILE).write_text(json.dumps(p.model_dump(), sort_keys=True))
    return {k: out[k] for k in ("train", "val", "test")}


def _params(data_dir: str | Path | None) -> VerifiersParams:
    """The section prepare ran with (``data_dir/verifiers.json``), else the last validated one."""
    if data_dir is not None and (Path(data_dir) / SETTINGS_FILE).is_file():
        return VerifiersParams.model_validate(json.loads((Path(data_dir) / SETTINGS_FILE).read_text()))
    return current()


def make_env(
    row: Mapping[str, Any] | None = None,
    *,
    malformed_penalty: float = 0.0,
    data_dir: str | Path | None = None,
    tool_parser: str = "hermes",
) -> VerifiersEnv:
    """A fresh environment of the section prepare ran with (``row`` is accepted for the common
    factory signature: reset() takes the row; ``malformed_penalty`` is unused: the rubric scores)."""
    p = _params(data_dir)
    return _env(p, load(p.env, p.args), tool_parser)


def tools() -> list[dict[str, Any]]:
    """The tools of the environment named by the last validated ``tasks.verifiers`` section."""
    p = current()
    return load(p.env, p.args).tool_schemas()


def initial_messages(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    if "initial" not in row:
        raise KeyError(f"task row has no 'initial' column (columns: {sorted(row)})")
    return json.loads(row["initial"])


def expert_messages(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    raw = row.get("expert")
    if raw is None:
        raise ValueError(
            f"task row {row.get('id')!r} has no expert trajectory: the verifiers environment's module "
            "has no expert_policy (docs/tasks/verifiers.md)"
        )
    return json.loads(raw)


def demonstrations(row: Mapping[str, Any]) -> list[list[dict[str, Any]]]:
    return [expert_messages(row)]


def episode_metrics(steps: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Means over episodes of each rubric reward (``reward/<name>``) and metric (``metric/<name>``)
    of the environment, the weighted reward (``reward``), replies per episode (``turns``), and the
    rate of each named error (``error/<reason>``) and of the max-turns stop (``stop/max_turns``)."""
    by_traj = by_trajectory(steps, ("traj_id", "step"))
    finals = []
    for traj in by_traj.values():
        last = max(traj, key=lambda s: int(s["step"]))
        finals.append(step_numbers(last))
    keys = {k for m in finals for k in m} | {f"error/{e}" for e in ERRORS} | {"stop/max_turns"}
    out = {}
    for key in sorted(keys):
        values = [float(m.get(key, 0.0)) for m in finals if key in m or key.startswith(("error/", "stop/"))]
        out[key] = sum(values) / len(values) if values else 0.0
    return out
