"""A verifiers environment with two agent seats (tests: refused)."""

from __future__ import annotations

import verifiers.v1 as vf

from tests.tasks.verifiers_task.vf_envs.guess import GuessTaskset

__all__ = ["TwoSeatEnv", "TwoSeatTaskset"]


class TwoSeatTaskset(GuessTaskset):
    pass


class TwoSeatConfig(vf.EnvConfig):
    solver: vf.AgentConfig = vf.AgentConfig()
    judge: vf.AgentConfig = vf.AgentConfig()


class TwoSeatEnv(vf.Env[TwoSeatConfig]):
    async def run(self, task, agents):
        await agents.solver.run(task)
