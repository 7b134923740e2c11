"""A verifiers (0.4) environment written for the tests: guess a secret digit, multi-turn, one tool,
a rubric of two weighted reward functions and a metric.

The task prompt asks for the secret digit (1-9, the task's ``info``); the env's ``run`` answers each
guess with "higher" or "lower" as the user's turn, until the guess is right or the exchange is
ended (max turns). The tool ``double(x)`` returns 2x (the model may call it before a guess). The
rubric: ``found`` (1 if the last guess was right, weight 1) and ``brevity`` (1 / guesses, weight 0.5);
metric ``guesses``.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator

import verifiers.v1 as vf

__all__ = ["GuessEnv", "GuessEnvConfig", "GuessTaskset"]


class DoubleTools(vf.Toolset):
    @vf.tool
    def double(self, x: int) -> str:
        """Twice x."""
        return str(2 * x)


class GuessConfig(vf.TasksetConfig):
    secrets: list[int] = [3, 7, 5, 1]


class GuessData(vf.TaskData):
    info: dict


class GuessTask(vf.Task[GuessData, vf.State, vf.TaskConfig]):
    @classmethod
    def toolsets(cls, config):
        return [DoubleTools(vf.ToolsetConfig())]

    @vf.reward(weight=1.0)
    async def found(self, trace: vf.Trace) -> float:
        return float(trace.info.get("found", False))

    @vf.reward(weight=0.5)
    async def brevity(self, trace: vf.Trace) -> float:
        return 1.0 / max(int(trace.info.get("guesses", 0)), 1)

    @vf.metric
    async def guesses(self, trace: vf.Trace) -> float:
        return float(trace.info.get("guesses", 0))


class GuessTaskset(vf.Taskset[GuessTask, GuessConfig]):
    def load(self) -> Iterator[GuessTask]:
        for i, secret in enumerate(self.config.secrets):
            yield GuessTask(
                GuessData(
                    name=f"guess#{i}",
                    prompt=f"Guess my digit, game {i}.",
                    system_prompt="Reply with one digit.",
                    info={"secret": secret},
                ),
                self.config.task,
            )


class GuessEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()


class GuessEnv(vf.Env[GuessEnvConfig]):
    async def run(self, task, agents):
        secret, guesses, found = task.data.info["secret"], 0, False
        async with agents.player.interaction(task) as interaction:
            segment = await interaction.turn()
            while not segment.terminated:
                await asyncio.sleep(0)  # async env code runs on the adapter's loop
                digits = re.findall(r"\d", segment.last_reply)
                guesses += 1
                if digits and int(digits[-1]) == secret:
                    found = True
                    break
                hint = "higher" if digits and int(digits[-1]) < secret else "lower"
                segment = await interaction.turn(hint if digits else "Reply with a digit.")
        interaction.trace.info.update(found=found, guesses=guesses)
