"""A plain verifiers taskset (SingleAgentEnv) one of whose tasks has no prompt (tests: refused)."""

from __future__ import annotations

import verifiers.v1 as vf

__all__ = ["NoPromptTaskset"]


class NoPromptTaskset(vf.Taskset[vf.Task, vf.TasksetConfig]):
    def load(self):
        yield vf.Task(vf.TaskData(name="ok", prompt="What is 2 + 2?"), self.config.task)
        yield vf.Task(vf.TaskData(name="empty"), self.config.task)
