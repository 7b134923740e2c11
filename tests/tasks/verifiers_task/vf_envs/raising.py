"""A verifiers environment whose run() raises on the second reply (tests)."""

from __future__ import annotations

import verifiers.v1 as vf

from tests.tasks.verifiers_task.vf_envs.guess import GuessEnvConfig, GuessTaskset

__all__ = ["RaisingEnv", "RaisingTaskset"]


class RaisingTaskset(GuessTaskset):
    pass


class RaisingEnv(vf.Env[GuessEnvConfig]):
    async def run(self, task, agents):
        async with agents.player.interaction(task) as interaction:
            await interaction.turn()
            await interaction.turn("again")
            raise RuntimeError("the board caught fire")
