"""TextArena's Mastermind as a verifiers (0.4) environment, offline, with a solver for demonstrations.

verifiers ships a TextArena taskset (``verifiers.v1.tasksets.textarena``), but only for word games
(Wordle, Hangman, WordLadder, WordSearch) whose ``load`` calls ``nltk.download``, which cannot run
offline. Mastermind ships everything it needs in the ``textarena`` wheel. This module follows that
taskset's design: a seeded game per task (the task prompt and the engine's reset share the seed),
the engine stepped host-side in ``Env.run`` as the seat's user, each observation's newest game
message the next user turn. Departures:

1. The game's size is configurable (``code_length``, ``num_numbers``, ``max_turns``: TextArena's
   ``Mastermind-v0`` is 4 of 6 digits in 20 turns; the default here is 3 of 5 in 8, for the embedded
   model); the process-global ``random`` state the engine seeds is restored after each reset.
2. The rubric is two ``@vf.reward`` functions on the task: ``solved`` (1 when the code is cracked,
   weight 1) and ``progress`` (TextArena's completion score of the last guess, (black + white / 2) /
   code length, weight 0.2; verifiers' ``task.rewards.progress.weight`` overrides it), and a
   ``@vf.metric`` ``guesses``.
3. ``expert_policy`` (steprl's demonstration hook): a solver that guesses the first code, in
   lexicographic order, consistent with all feedback so far (at most 4 guesses for 3 of 5).

``tasks.verifiers.env: components.tasks.verifiers.envs.mastermind`` (the default).
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Callable, Iterator
from typing import Any

import textarena as ta
import verifiers.v1 as vf
from pydantic import Field

__all__ = ["MastermindEnv", "MastermindEnvConfig", "MastermindTaskset", "expert_policy"]

SYSTEM_PROMPT = "You are playing Mastermind. Reply with your guess only, e.g. [1 2 3]."
_FEEDBACK = re.compile(r"(\d+) black peg\(s\), (\d+) white peg\(s\)")
_GUESS = re.compile(r"\[(\d+(?:\s+\d+)*)\]")


class MastermindConfig(vf.TasksetConfig):
    code_length: int = Field(3, ge=2, le=6)
    num_numbers: int = Field(5, ge=2, le=9)
    max_turns: int = Field(8, ge=1, le=50)


class MastermindData(vf.TaskData):
    info: dict
    """The game's settings and the seed the env reproduces the episode from."""


class MastermindTask(vf.Task[MastermindData, vf.State, vf.TaskConfig]):
    @vf.reward(weight=1.0)
    async def solved(self, trace: vf.Trace) -> float:
        return float(bool(trace.info.get("solved", False)))

    @vf.reward(weight=0.2)
    async def progress(self, trace: vf.Trace) -> float:
        return float(trace.info.get("progress", 0.0))

    @vf.metric
    async def guesses(self, trace: vf.Trace) -> float:
        return float(trace.info.get("guesses", 0))


def _game(info: dict) -> Any:
    state = random.getstate()
    try:
        random.seed(info["seed"])
        game = ta.make(
            env_id="Mastermind-v0",
            code_length=info["code_length"],
            num_numbers=info["num_numbers"],
            max_turns=info["max_turns"],
            duplicate_numbers=False,
        )
        game.reset(num_players=1)
    finally:
        random.setstate(state)
    return game


def _latest(observation: str) -> str:
    """The newest game message of an observation (the engine's wrapper repeats the history)."""
    return observation.split("[GAME]")[-1].strip()


class MastermindTaskset(vf.Taskset[MastermindTask, MastermindConfig]):
    INFINITE = True

    def load(self) -> Iterator[MastermindTask]:
        c = self.config
        settings = {"code_length": c.code_length, "num_numbers": c.num_numbers, "max_turns": c.max_turns}
        prompt = _latest(str(_game({**settings, "seed": 0}).get_observation()[1]))
        for i in itertools.count():
            yield MastermindTask(
                MastermindData(
                    name=f"mastermind#{i}",
                    prompt=prompt,  # the same rules for every seed; the secret code differs
                    system_prompt=SYSTEM_PROMPT,
                    info={**settings, "seed": i},
                ),
                self.config.task,
            )


class MastermindEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()


class MastermindEnv(vf.Env[MastermindEnvConfig]):
    async def run(self, task: MastermindTask, agents: vf.Agents) -> None:
        game = _game(task.data.info)
        outcome: dict[str, Any] = {"solved": False, "progress": 0.0, "guesses": 0}
        async with agents.player.interaction(task) as interaction:
            segment = await interaction.turn()
            while not segment.terminated:
                done, _ = game.step(segment.last_reply)
                history = game.state.game_state["history"]
                outcome["guesses"] = len(history)
                if history:
                    last = history[-1]
                    outcome["progress"] = (last["black"] + 0.5 * last["white"]) / task.data.info[
                        "code_length"
                    ]
                    outcome["solved"] = last["black"] == task.data.info["code_length"]
                if done:
                    break
                segment = await interaction.turn(_latest(str(game.get_observation()[1])))
        interaction.trace.info.update(outcome)


def _score(guess: tuple[int, ...], code: tuple[int, ...]) -> tuple[int, int]:
    black = sum(g == c for g, c in zip(guess, code))
    return black, len(set(guess) & set(code)) - black


def expert_policy(task: MastermindTask) -> Callable[[list[dict[str, Any]]], str]:
    """The solver: the first code consistent with every (guess, feedback) pair in the conversation."""
    info = task.data.info
    codes = list(itertools.permutations(range(1, info["num_numbers"] + 1), info["code_length"]))

    def policy(messages: list[dict[str, Any]]) -> str:
        left = codes
        for reply, answer in itertools.pairwise(messages):
            guess, feedback = (
                _GUESS.search(str(reply.get("content", ""))),
                _FEEDBACK.search(str(answer.get("content", ""))),
            )
            if reply.get("role") == "assistant" and guess and feedback:
                g = tuple(int(x) for x in guess.group(1).split())
                pegs = (int(feedback.group(1)), int(feedback.group(2)))
                left = [c for c in left if _score(g, c) == pegs]
        return "[" + " ".join(str(d) for d in left[0]) + "]"

    return policy
