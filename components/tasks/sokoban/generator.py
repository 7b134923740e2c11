"""Sokoban task tables: generated levels, their expert and weaker demonstrations, as TaskSchema splits.

A row is one level: ``level`` (XSB text, what the environment loads), ``question`` (the start grid as the
model sees it), ``answer`` (a shortest solution, moves separated by spaces), ``n_calls`` (its length),
``expert`` (the demonstration: one ``<action>...</action>`` turn per move, each followed by the new grid
as a user message, the last one by nothing: the level is solved) and ``weak`` (weaker demonstrations).

The weaker demonstrator plays like a careless human: each turn, with probability ``weak_epsilon`` a
uniformly random move (which may walk into a wall, waste moves, or push the box somewhere it cannot be
pushed back from), otherwise the first move of a shortest solution from where it stands. Only its
episodes that end solved within ``max_moves + weak_extra_moves`` moves are kept, so SFT sees detours,
never a lost level; a policy imitating it still makes random moves in states where they are fatal, and
RL has to learn from the return (step penalty, success bonus) which moves to stop making. With
``imitate_detours`` false, a random move other than the solver's next move is kept with
``"weight": 0`` (context only for SFT: :mod:`components.model.sft_data`): SFT learns the way back
from where a detour left the player, not the detour.

Splits come from independent random streams (seed, split), test first, then val, then train, each
skipping levels already taken, so no level is in two splits.
"""

from __future__ import annotations

import json
import random
from collections.abc import Collection
from pathlib import Path
from typing import Any

import polars as pl

from components.schemas import TaskSchema, validate_table
from components.tasks.demonstrations import as_context, encode
from components.tasks.recipe import split_sizes
from components.tasks.sokoban.env import ENV_FILE
from components.tasks.sokoban.level import ACTIONS, Level, State, apply, generate, render, solve, to_xsb
from components.tasks.sokoban.params import SokobanParams

__all__ = ["action_message", "demonstration", "make_splits", "weak_play"]

SPLITS = ("test", "val", "train")


def action_message(action: str) -> dict[str, str]:
    return {"role": "assistant", "content": f"<action>{action}</action>"}


def demonstration(
    level: Level,
    state: State,
    moves: list[str],
    *,
    with_offsets: bool = True,
    blocked_note: bool = False,
    context_only: Collection[int] = (),
) -> list[dict[str, Any]]:
    """The messages after the first user prompt of playing ``moves``: each move, then the new grid
    (none after the last move), with the environment's note after a move that changed nothing; the
    moves at the indices ``context_only`` get ``"weight": 0`` (SFT reads them, never imitates them)."""
    messages: list[dict[str, Any]] = []
    for i, move in enumerate(moves):
        messages.append(as_context(action_message(move)) if i in context_only else action_message(move))
        state, moved = apply(level, state, move)
        if i < len(moves) - 1:
            text = render(level, state, with_offsets=with_offsets, blocked=blocked_note and not moved)
            messages.append({"role": "user", "content": text})
    return messages


def weak_play(
    rng: random.Random, level: Level, state: State, *, epsilon: float, limit: int
) -> tuple[list[str], list[int]] | None:
    """A careless player's moves (see the module docstring) and the indices of its detours, the
    random moves that were not the solver's next move; None when it does not solve the level within
    ``limit`` moves."""
    moves: list[str] = []
    detours: list[int] = []
    plan = solve(level, state)
    while plan and len(moves) < limit:
        if rng.random() < epsilon:
            move = rng.choice(ACTIONS)
            if move != plan[0]:
                detours.append(len(moves))
            nxt, _ = apply(level, state, move)
            plan = solve(level, nxt) if nxt != state else plan
        else:
            move = plan[0]
            nxt, _ = apply(level, state, move)
            plan = plan[1:]
        moves.append(move)
        state = nxt
        if plan is None:  # a fatal push: this episode cannot be won any more
            return None
    return (moves, detours) if plan == [] else None


def make_splits(
    p: SokobanParams, *, seed: int, n_train: int, n_val: int, n_test: int, root=None, data_dir=None
) -> dict[str, pl.DataFrame]:
    """The three splits of generated levels (``root`` is unused: nothing is read from files); the
    environment's reward settings are written to ``data_dir/env.json`` (the prepare output)."""
    if data_dir is not None:
        Path(data_dir).mkdir(parents=True, exist_ok=True)
        (Path(data_dir) / ENV_FILE).write_text(json.dumps(p.env_settings(), indent=2))
    sizes = split_sizes(n_train, n_val, n_test)
    seen: set[str] = set()
    out: dict[str, pl.DataFrame] = {}
    for split in SPLITS:
        rng = random.Random(f"sokoban|{seed}|{split}")
        weak_rng = random.Random(f"sokoban-weak|{seed}|{split}")
        rows = []
        while len(rows) < sizes[split]:
            level, start, solution = generate(
                rng,
                height=p.height,
                width=p.width,
                boxes=p.boxes,
                min_moves=p.min_moves,
                max_moves=p.max_moves,
            )
            xsb = to_xsb(level, start)
            if xsb in seen:
                continue
            seen.add(xsb)
            weak = []
            if split == "train" and p.weak_per_question > 0:
                n = int(p.weak_per_question) + (weak_rng.random() < p.weak_per_question % 1)
                for _ in range(n):
                    for _try in range(5):
                        played = weak_play(
                            weak_rng,
                            level,
                            start,
                            epsilon=p.weak_epsilon,
                            limit=p.max_moves + p.weak_extra_moves,
                        )
                        if played is not None:
                            moves, detours = played
                            weak.append(
                                demonstration(
                                    level,
                                    start,
                                    moves,
                                    with_offsets=p.offsets,
                                    blocked_note=p.blocked_note,
                                    context_only=() if p.imitate_detours else detours,
                                )
                            )
                            break
            rows.append(
                {
                    "id": f"sokoban-{split}-{len(rows)}",
                    "question": render(level, start, with_offsets=p.offsets),
                    "answer": " ".join(solution),
                    "level": xsb,
                    "n_calls": len(solution),
                    "expert": encode(
                        demonstration(
                            level, start, solution, with_offsets=p.offsets, blocked_note=p.blocked_note
                        )
                    ),
                    "weak": json.dumps(weak) if weak else None,
                    "split": split,
                }
            )
        out[split] = validate_table(
            pl.DataFrame(rows, schema_overrides={"weak": pl.String}), TaskSchema, split
        )
    return {k: out[k] for k in ("train", "val", "test")}
