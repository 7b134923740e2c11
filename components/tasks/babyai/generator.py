"""BabyAI task tables: levels (reset seeds), the bot's demonstrations and weaker ones, as TaskSchema splits.

A row is one level: ``seed`` (minigrid's reset seed, which makes the level), ``level`` (the
Gymnasium id), ``question`` (the first observation as the model sees it), ``answer`` (the bot's
actions, comma-separated), ``n_calls`` (their number), ``expert`` (the demonstration: one
``<action>...</action>`` turn per bot action, each followed by the next observation as a user message,
the last one by nothing: the mission is done) and ``weak`` (weaker demonstrations).

The expert is minigrid's own ``BabyAIBot``, run on the very environment the model plays (the text
environment's minigrid env), so a demonstration replays exactly. A level is kept only when the bot
completes it within ``max_moves`` actions; the others are dropped and counted (:class:`BotTally`,
saved by prepare as ``bot.json``). The bot giving up (its own assertions, a box it opened) is "not
done"; any other exception of the bot (a minigrid API change, a bug) is a bot error, counted apart
(``bot_errors``, the first one's text in ``first_bot_error``) and logged; when every level tried
ends in one, the stage fails naming it.

The weaker demonstrator is the bot with random detours: each turn, with probability ``weak_epsilon``,
a uniformly random move (turn left, turn right, go forward) instead of the bot's action; the bot is told
what was done (``replan(action_taken)``) and plans on from there. Only its episodes that still complete
the mission within ``max_moves + weak_extra_moves`` actions are kept, so SFT sees detours, never a
failure; RL has to learn from the return which detours to stop making. With ``imitate_detours``
false, a random move other than the bot's own choice is kept with ``"weight": 0`` (context only for
SFT: :mod:`components.model.sft_data`), so SFT learns the way back but not the detour.

Splits come from independent random streams of seeds (seed, split), test first, then val, then train,
each skipping a level (its start state and mission) already taken, so no level is in two splits.
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import polars as pl
from minigrid.utils.baby_ai_bot import BabyAIBot, DisappearedBoxError

from components.envs.gym_text import GymTextEnv
from components.io import write_json
from components.schemas import TaskSchema, validate_table
from components.tasks.babyai.env import ENV_FILE, make_env
from components.tasks.babyai.params import BabyAIParams
from components.tasks.babyai.text import ACTIONS, action_text
from components.tasks.demonstrations import as_context, encode

__all__ = ["BotError", "BotTally", "bot_episode", "make_splits"]

log = logging.getLogger(__name__)

SPLITS = ("test", "val", "train")
BOT_FILE = "bot.json"
# Random detours of the weaker demonstrator: minigrid's left, right, forward.
DETOURS = (0, 1, 2)
# Seeds tried per wanted level before giving up (a level the bot cannot do at all).
MAX_TRIES_PER_LEVEL = 50
# How minigrid's BabyAIBot gives up on a level it cannot do: its assertions, a box it opened.
BOT_GIVES_UP = (AssertionError, DisappearedBoxError)


class BotError(RuntimeError):
    """minigrid's BabyAIBot raised something other than giving up (:data:`BOT_GIVES_UP`)."""


@dataclass
class BotTally:
    """What became of the levels the generator tried: the bot completed it within ``max_moves``
    actions (kept, unless a level already taken), completed it in more, did not (gave up or ran out
    of moves), or raised an error (``bot_errors``; ``first_bot_error`` says what)."""

    tried: int = 0
    solved: int = 0
    within_max_moves: int = 0
    duplicates: int = 0
    bot_errors: int = 0
    first_bot_error: str | None = None

    def rates(self) -> dict[str, float | int]:
        out: dict[str, float | int] = asdict(self)
        out["solve_rate"] = self.solved / max(self.tried, 1)
        out["kept_rate"] = self.within_max_moves / max(self.tried, 1)
        return out


def bot_episode(
    env: GymTextEnv,
    row: dict[str, Any],
    *,
    limit: int,
    rng: random.Random | None = None,
    epsilon: float = 0.0,
    imitate_detours: bool = True,
) -> tuple[list[dict[str, Any]], list[int]] | None:
    """Play ``row``'s level with minigrid's BabyAIBot through the text environment ``env`` (with
    probability ``epsilon`` per turn a random move from ``rng`` instead of the bot's action; with
    ``imitate_detours`` false such a move, when it is not the bot's own, has ``"weight": 0``): the
    messages after the first user prompt and the actions, or None when the mission is not done within
    ``limit`` actions (or the bot gives up: :data:`BOT_GIVES_UP`). Any other exception of the bot
    raises :class:`BotError` naming the level."""
    env.reset(row)
    try:
        bot = BabyAIBot(env.env)
    except BOT_GIVES_UP:  # the bot cannot parse this level's instruction: not a level it does
        return None
    except Exception as err:
        raise _bot_error(err, row) from err
    messages: list[dict[str, Any]] = []
    actions: list[int] = []
    taken: int | None = None
    while len(actions) < limit:
        try:
            suggested = int(bot.replan(taken))
        except BOT_GIVES_UP:  # the bot's own assertions (e.g. a box it opened): it cannot go on
            return None
        except Exception as err:
            raise _bot_error(err, row) from err
        if suggested not in range(len(ACTIONS)):  # "done" before the mission is: a failure
            return None
        action = rng.choice(DETOURS) if rng is not None and rng.random() < epsilon else suggested
        reply = action_text(action)
        out = env.step(reply)
        message = {"role": "assistant", "content": reply}
        messages.append(message if imitate_detours or action == suggested else as_context(message))
        actions.append(action)
        taken = action
        if out.done:
            return (messages, actions) if out.info["correct"] else None
        messages.extend(out.messages)
    return None


def _bot_error(err: Exception, row: dict[str, Any]) -> BotError:
    return BotError(
        f"BabyAIBot raised {type(err).__name__}: {err} (level {row['level']}, seed {row['seed']})"
    )


def _play(env: GymTextEnv, row: dict[str, Any], tally: BotTally, **kwargs: Any):
    """:func:`bot_episode`, with a bot error counted in ``tally`` and logged (then: None)."""
    try:
        return bot_episode(env, row, **kwargs)
    except BotError as err:
        tally.bot_errors += 1
        if tally.first_bot_error is None:
            tally.first_bot_error = str(err)
            log.warning(f"tasks.babyai: {err}: counted as a bot error, not as a level not done")
        return None


def _level_key(env: GymTextEnv) -> str:
    """The level as its start state and mission (two seeds can make the same level)."""
    return f"{env.state_key()}|{env.env.unwrapped.mission}"


def make_splits(
    p: BabyAIParams, *, seed: int, n_train: int, n_val: int, n_test: int, root=None, data_dir=None
) -> dict[str, pl.DataFrame]:
    """The three splits (``root`` is unused: nothing is read from files); the environment's settings
    go to ``data_dir/env.json`` and the bot's tally to ``data_dir/bot.json`` (the prepare output).
    Raises ValueError when the bot completes too few levels of ``p.level`` within ``p.max_moves``."""
    settings = p.env_settings()
    env = make_env(**settings)
    sizes = {"train": n_train, "val": n_val, "test": n_test}
    seen: set[str] = set()
    tally = BotTally()
    out: dict[str, pl.DataFrame] = {}
    for split in SPLITS:
        rng = random.Random(f"babyai|{seed}|{split}")
        weak_rng = random.Random(f"babyai-weak|{seed}|{split}")
        rows: list[dict[str, Any]] = []
        budget = MAX_TRIES_PER_LEVEL * max(sizes[split], 1)
        while len(rows) < sizes[split]:
            if budget == 0:
                errors = (
                    f" ({tally.bot_errors} ended in a bot error, the first: {tally.first_bot_error})"
                    if tally.bot_errors
                    else ""
                )
                raise ValueError(
                    f"tasks.babyai: the bot completed {tally.within_max_moves} of {tally.tried} "
                    f"{p.level} levels within max_moves={p.max_moves} actions{errors}; too few for the "
                    f"{split} split ({sizes[split]} rows): raise max_moves or pick another level"
                )
            budget -= 1
            row: dict[str, Any] = {"seed": rng.randrange(2**31), "level": p.level}
            tally.tried += 1
            first = env.reset(row)
            key = _level_key(env)
            if key in seen:
                tally.duplicates += 1
                continue
            played = _play(env, row, tally, limit=max(p.max_moves, 1000))
            played_levels = tally.tried - tally.duplicates
            if tally.solved == 0 and tally.bot_errors == played_levels >= MAX_TRIES_PER_LEVEL:
                raise BotError(
                    f"tasks.babyai: every one of the {played_levels} {p.level} levels played ended in "
                    f"a bot error, the first: {tally.first_bot_error}"
                )
            if played is None:
                continue
            tally.solved += 1
            messages, actions = played
            if len(actions) > p.max_moves:
                continue
            tally.within_max_moves += 1
            seen.add(key)
            weak: list[list[dict[str, Any]]] = []
            if split == "train" and p.weak_per_question > 0:
                n = int(p.weak_per_question) + (weak_rng.random() < p.weak_per_question % 1)
                for _ in range(n):
                    for _try in range(5):
                        detour = _play(
                            env,
                            row,
                            tally,
                            limit=p.max_moves + p.weak_extra_moves,
                            rng=weak_rng,
                            epsilon=p.weak_epsilon,
                            imitate_detours=p.imitate_detours,
                        )
                        if detour is not None:
                            weak.append(detour[0])
                            break
            rows.append(
                {
                    "id": f"babyai-{split}-{len(rows)}",
                    "question": first[1]["content"],
                    "answer": ", ".join(ACTIONS[a] for a in actions),
                    **row,
                    "n_calls": len(actions),
                    "expert": encode(messages),
                    "weak": json.dumps(weak) if weak else None,
                    "split": split,
                }
            )
        out[split] = validate_table(
            pl.DataFrame(rows, schema_overrides={"weak": pl.String, "seed": pl.Int64}), TaskSchema, split
        )
    if data_dir is not None:
        Path(data_dir).mkdir(parents=True, exist_ok=True)
        write_json(settings, Path(data_dir) / ENV_FILE)
        write_json({"level": p.level, "max_moves": p.max_moves, **tally.rates()}, Path(data_dir) / BOT_FILE)
    if tally.bot_errors:
        log.warning(
            f"tasks.babyai: {tally.bot_errors} bot errors in {tally.tried} levels tried (bot.json's "
            f"bot_errors; the first: {tally.first_bot_error})"
        )
    return {k: out[k] for k in ("train", "val", "test")}
