"""A verifiers environment whose second turn message is not a chat message (tests)."""

from __future__ import annotations

import verifiers.v1 as vf

from tests.tasks.verifiers_task.vf_envs.guess import GuessEnvConfig, GuessTaskset

__all__ = ["MalformedEnv", "MalformedTaskset"]


class MalformedTaskset(GuessTaskset):
    pass


class MalformedEnv(vf.Env[GuessEnvConfig]):
    async def run(self, task, agents):
        async with agents.player.interaction(task) as interaction:
            await interaction.turn()
            await interaction.turn([{"role": "user", "content": 42}])
