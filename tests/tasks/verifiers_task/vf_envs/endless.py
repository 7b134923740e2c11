"""A verifiers environment that never completes: it ignores a terminated segment and asks again (tests)."""

from __future__ import annotations

import verifiers.v1 as vf

from tests.tasks.verifiers_task.vf_envs.guess import GuessEnvConfig, GuessTaskset

__all__ = ["EndlessEnv", "EndlessTaskset"]


class EndlessTaskset(GuessTaskset):
    pass


class EndlessEnv(vf.Env[GuessEnvConfig]):
    async def run(self, task, agents):
        async with agents.player.interaction(task) as interaction:
            await interaction.turn()
            while True:
                await interaction.turn("go on")
