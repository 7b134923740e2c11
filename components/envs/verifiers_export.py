"""A steprl task as a verifiers (0.4, ``verifiers.v1``) environment: what ``vf-eval`` loads.

verifiers 0.4 splits an environment into a ``Taskset`` (the rows), an ``Env`` (how one row becomes
one episode: its ``run(task, agents)``) and a ``Harness`` (the program that plays a seat and calls
the model). This module gives a steprl task all three, the way verifiers' own TextArena taskset does
for a game engine:

- :class:`StepRLTaskset`: the task's generated split (``recipe.prepare`` with the params section
  ``params``, seed ``seed``, ``size`` rows of ``split``), one ``vf.Task`` per row; its prompt is the
  system and user messages the steprl environment's ``reset(row)`` gives.
- :class:`StepRLEnv`: plays one episode with one seat, ``player``: each reply of the model goes to
  the steprl environment's ``step`` (host-side, in scope), whose feedback (the next grid, or why an
  action was invalid) is the next user turn, until the episode is done or ``max_turns`` replies.
  The rubric is steprl's reward: the episode's return (the sum of the step rewards) is the reward
  ``return`` (weight 1); ``success``, ``steps`` and ``invalid_actions`` are metrics.
- :class:`LocalChatHarness`: verifiers' own chat program (the one its ``null`` harness runs) run by
  this Python, in the subprocess runtime; verifiers' ``null`` harness builds a uv script
  environment instead, which needs the network. It is the seat's default; ``--env.player.harness.id
  null`` takes verifiers' own.

A package per task exports a subclass of each (``environments/steprl-sokoban``), since verifiers
finds them by the package's ``__all__``. Tasks whose actions are tool calls (code, calc, search) are
not exported: their tools run in steprl's environment, while a verifiers harness executes a
model's tool calls itself (MCP); :class:`StepRLTaskset` refuses such a task by name.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal

import verifiers.v1 as vf
from pydantic import Field
from verifiers.v1.harnesses.null.harness import NullHarness
from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE

from components.envs.registry import get_task

__all__ = [
    "LocalChatHarness",
    "StepRLData",
    "StepRLEnv",
    "StepRLEnvConfig",
    "StepRLTask",
    "StepRLTaskset",
    "StepRLTasksetConfig",
]

# The chat program's file in the runtime's work directory (LocalChatHarness).
_PROGRAM = f".vf-steprl-chat-{hashlib.sha256(CHAT_PROGRAM_SOURCE.encode()).hexdigest()[:16]}.py"
# Task-table columns a row's episode does not need (the demonstrations SFT imitates).
_DROP = ("expert", "weak")


class StepRLTasksetConfig(vf.TasksetConfig):
    """``--env.taskset.*``: which of the task's generated rows load."""

    split: Literal["train", "val", "test"] = "test"
    seed: int = 0
    # rows of the split (the other two splits are empty)
    size: int = Field(100, ge=1, le=100_000)
    # the task's params section (``tasks.<task>`` of params.yaml); {} = its defaults
    params: dict[str, Any] = Field(default_factory=dict)
    # model replies per episode at most (steprl's rollout.max_steps)
    max_turns: int = Field(10, ge=1, le=1000)


class StepRLData(vf.TaskData):
    row: dict[str, Any]
    """The steprl task row (its columns but the demonstrations), what the environment resets on."""


class StepRLTask(vf.Task[StepRLData, vf.State, vf.TaskConfig]):
    pass


class StepRLTaskset(vf.Taskset[StepRLTask, StepRLTasksetConfig]):
    """The rows of steprl task ``TASK`` (set by the subclass): see the module docstring."""

    TASK: ClassVar[str] = ""

    def __init__(self, config: StepRLTasksetConfig) -> None:
        super().__init__(config)
        if not self.TASK:
            raise TypeError(f"{type(self).__name__} names no steprl task (set TASK)")
        self.recipe = get_task(self.TASK)
        if self.recipe.tools():
            raise ValueError(
                f"steprl task {self.TASK!r} acts through tools "
                f"({[t['function']['name'] for t in self.recipe.tools()]}); only tasks whose actions "
                "are text (sokoban, babyai) are exported as verifiers environments"
            )
        self.params = self.recipe.params(config.params)  # a bad key fails here, naming it
        # what prepare writes beside the tables (e.g. sokoban's reward settings), read by make_env
        self.data_dir = Path(tempfile.mkdtemp(prefix=f"steprl-{self.TASK}-"))
        # the other splits get one row (a task may refuse an empty split); their rows are not used
        sizes = {f"n_{s}": config.size if s == config.split else 1 for s in ("train", "val", "test")}
        splits = self.recipe.prepare(self.params, seed=config.seed, data_dir=self.data_dir, **sizes)
        self.rows = [
            {k: v for k, v in row.items() if k not in _DROP}
            for row in splits[config.split].iter_rows(named=True)
        ]

    def make_env(self):
        """A fresh steprl environment of the task, with the prepared settings."""
        return self.recipe.make_env(data_dir=self.data_dir)

    def load(self) -> Iterator[StepRLTask]:
        for row in self.rows:
            system, user = self.make_env().reset(row)
            yield StepRLTask(
                StepRLData(
                    id=str(row["id"]),
                    name=f"{self.TASK}/{row['id']}",
                    prompt=str(user["content"]),
                    system_prompt=str(system["content"]),
                    row=json.loads(json.dumps(row, default=str)),
                ),
                self.config.task,
            )


class StepRLEnvConfig(vf.EnvConfig):
    # the one seat; the subprocess runtime on this machine and LocalChatHarness by default
    player: vf.AgentConfig = vf.AgentConfig(runtime=vf.SubprocessConfig())


def _feedback(messages: list[Mapping[str, Any]]) -> str:
    return "\n".join(str(m.get("content", "")) for m in messages)


class StepRLEnv(vf.Env[StepRLEnvConfig]):
    """One episode of a steprl task: each model reply is a ``step`` of the task's environment."""

    async def run(self, task: StepRLTask, agents: vf.Agents) -> None:
        taskset = self.taskset
        if not isinstance(taskset, StepRLTaskset):
            raise TypeError(f"StepRLEnv plays a StepRLTaskset, got {type(taskset).__name__}")
        env = taskset.make_env()
        env.reset(task.data.row)
        total, steps, invalid, success = 0.0, 0, 0, False
        async with agents.player.interaction(task) as interaction:
            segment = await interaction.turn()  # the prompt opens the exchange
            while not segment.terminated:
                # a step may compute (a search, a solver): off the event loop
                outcome = await asyncio.to_thread(env.step, segment.last_reply)
                steps += 1
                total += float(outcome.reward)
                invalid += bool(outcome.info.get("invalid_action") or outcome.info.get("format_error"))
                success = success or bool(outcome.info.get("correct", False))
                if outcome.done or steps >= taskset.config.max_turns:
                    break
                segment = await interaction.turn(_feedback(outcome.messages))
            # recorded before the exchange closes, so the rollout's own reward includes it
            trace = interaction.trace
            trace.record_reward("return", total, 1.0)
            trace.record_metrics(
                {"success": float(success), "steps": float(steps), "invalid_actions": float(invalid)}
            )


class LocalChatHarness(NullHarness):
    """verifiers' chat program (its ``null`` harness's), run by this Python instead of a uv script
    environment: offline, with the packages installed here (openai, mcp, httpx, tenacity)."""

    async def setup(self, runtime: vf.Runtime) -> None:
        await runtime.write(_PROGRAM, CHAT_PROGRAM_SOURCE.encode())

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, tool_interception_url=None):
        system_prompt, prompt = self.resolve_prompt(data)
        args = [f"--base-url={endpoint}", f"--api-key={secret}", f"--model={ctx.model}"]
        if system_prompt:
            args.append(f"--system-prompt={system_prompt}")
        if isinstance(prompt, str):
            args.append(f"--prompt={prompt}")
        elif prompt is not None:
            from verifiers.v1.dialects.chat import message_to_wire

            path = f".vf-initial-messages-{trace.id}.json"
            await runtime.write(path, json.dumps([message_to_wire(m) for m in prompt]).encode())
            args.append(f"--initial-messages-file={path}")
        return await runtime.run_program([sys.executable, _PROGRAM, *args], dict(self.config.resolved_env))
