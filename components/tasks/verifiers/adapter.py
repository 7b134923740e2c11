"""VerifiersEnv: a verifiers (0.4) environment's episode as a steprl AgentEnv, steprl's loop the harness.

verifiers runs an episode as ``Env.run(task, agents)``: the env's own code (a game engine, a user
turn) talks to a seat through ``agents.<seat>.interaction(task)`` and ``await interaction.turn(msg)``,
which runs a harness program that calls the model. Here steprl's agent loop is the seat's harness:

- ``reset(row)`` starts ``setup`` + ``run`` as a coroutine on one event loop in a background thread
  (shared by every VerifiersEnv of the process, so async environment code never blocks the rollout
  and never needs a loop of its own), and returns the conversation's opening messages: the task's
  system prompt and prompt (or the env's first ``turn(message)`` when the task has no prompt).
- ``step(text)``: a reply with tool calls (steprl's tool-call format, ``rollout.tool_parser``) runs
  the toolsets' ``@vf.tool`` methods and answers with their results, within the same verifiers
  segment; a reply without tool calls is the segment's ``last_reply``: ``turn`` returns it to the
  env's ``run``, whose next ``turn(message)`` is the observation. When ``run`` returns, the task's
  rubric scores the trace (``Task.score``: its ``@vf.reward`` functions by weight, its
  ``@vf.metric``s) beside what ``run`` recorded itself, and the episode ends with the weighted sum.
- The trace is a real ``vf.Trace``: its message nodes hold the conversation (the replies marked
  sampled), so reward functions read ``trace.messages`` / ``trace.last_reply`` as under verifiers.

The agent loop keeps the token ids: this env only returns messages, as every steprl env does.

Every failure ends the episode, never the run, with reward 0 and a named reason in
``info["task_metrics"]`` (``error/<reason>`` = 1) and the log: ``env_raised`` (an exception in the
env's setup, run or scoring, or in its first turn), ``malformed_message`` (a ``turn`` message that
is neither text nor chat messages), ``turn_after_end`` (a ``turn`` after the exchange was ended at
``max_turns``), ``no_turn`` (``run`` returned without playing the seat), ``env_timeout`` (no answer
within ``turn_timeout_s``). At ``max_turns`` replies the env's next ``turn`` gets a terminated
segment (verifiers' own max-turns stop); its ``run`` then ends and is scored, the step truncated.

Does not: run harness programs, MCP servers, judges, runtimes or containers (the loader refuses
environments that need them), evaluate ``@vf.stop`` or ``@vf.intercept`` hooks.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import math
import queue
import threading
from collections.abc import Mapping
from typing import Any

from components.envs.base import AgentEnv, StepOutcome
from components.envs.parsing import CallError, short
from components.envs.tool_formats import get_format
from components.tasks.verifiers.loader import Loaded

__all__ = ["DEFAULT_SYSTEM_PROMPT", "ERRORS", "EnvFault", "VerifiersEnv", "event_loop"]

log = logging.getLogger(__name__)

ERRORS = ("env_raised", "malformed_message", "turn_after_end", "no_turn", "env_timeout")
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."

_LOOP: asyncio.AbstractEventLoop | None = None
_LOOP_LOCK = threading.Lock()


def event_loop() -> asyncio.AbstractEventLoop:
    """The process's one event loop for environment coroutines, running in a daemon thread."""
    global _LOOP
    with _LOOP_LOCK:
        if _LOOP is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="verifiers-loop", daemon=True).start()
            _LOOP = loop
        return _LOOP


@functools.cache
def _version() -> Any:
    """verifiers' version stamp of a trace, once (its default factory runs ``git rev-parse`` per trace)."""
    import verifiers
    from verifiers.v1.trace import VersionInfo
    from verifiers.v1.utils.version import verifiers_commit

    return VersionInfo(version=verifiers.__version__, commit=verifiers_commit())


class EnvFault(Exception):
    """A failure of the environment with a named reason (ERRORS)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class _Closed(Exception):
    """The episode was abandoned by steprl (a new reset): the coroutine unwinds."""


def _message_dicts(message: Any) -> list[dict[str, Any]]:
    """A ``turn`` message as chat dicts: text, or a list of chat messages (dicts or typed)."""
    if isinstance(message, str):
        return [{"role": "user", "content": message}]
    if not isinstance(message, list) or not message:
        raise EnvFault(
            "malformed_message", f"turn() got {type(message).__name__}, not text or a message list"
        )
    out = []
    for i, m in enumerate(message):
        if hasattr(m, "model_dump"):
            m = m.model_dump(exclude_none=True)
        if (
            not isinstance(m, Mapping)
            or m.get("role") not in ("user", "system", "tool")
            or not isinstance(m.get("content"), str)
        ):
            raise EnvFault(
                "malformed_message",
                f"turn() message {i} is not a user/system/tool chat message with text content: {short(m)}",
            )
        out.append({"role": m["role"], "content": m["content"]})
    return out


class _Run:
    """One episode's state, shared by steprl's thread and the episode's coroutine (a later reset
    makes a new one, so an abandoned coroutine never touches the next episode)."""

    def __init__(self, loaded: Loaded, task: Any, trace: Any, max_turns: int, inbox: asyncio.Queue) -> None:
        self.loaded, self.task, self.trace, self.max_turns = loaded, task, trace, max_turns
        self.events: queue.Queue = queue.Queue()
        self.inbox = inbox
        self.replies = 0
        self.started = self.ended = self.opened = False

    def add_nodes(self, messages: list[dict[str, Any]], sampled: bool = False) -> None:
        from verifiers.v1.dialects.chat import parse_message
        from verifiers.v1.graph import MessageNode

        for m in messages:
            parent = len(self.trace.nodes) - 1 if self.trace.nodes else None
            wire = dict(m)
            if wire["role"] == "tool":
                wire.setdefault("tool_call_id", f"call_{len(self.trace.nodes)}")
            self.trace.nodes.append(MessageNode(parent=parent, message=parse_message(wire), sampled=sampled))

    async def reply(self) -> str:
        reply = await self.inbox.get()
        if reply is _Closed:
            raise _Closed()
        return reply

    async def play(self) -> None:
        env, agents = self.loaded.env, _Agents(_Seat(self))
        try:
            try:
                await env.setup(agents)
                await env.run(self.task, agents)
                if not self.opened:
                    raise EnvFault("no_turn", f"{type(env).__name__}.run() played no turn of its seat")
                await self.task.score(self.trace)
            except _Closed:
                return
            except Exception as err:  # the env's own failure: ends this episode, never the run
                fault = err if isinstance(err, EnvFault) else err.__cause__
                if isinstance(fault, EnvFault):  # ours, possibly re-raised by the env (vf's boundary)
                    self.events.put(("error", (fault.reason, str(fault))))
                else:
                    self.events.put(("error", ("env_raised", f"{type(err).__name__}: {short(err)}")))
                return
            self.events.put(("done", None))
        except asyncio.CancelledError:
            self.events.put(("error", ("env_raised", "cancelled")))
            raise


class _Seat:
    """``agents.<seat>``: its interaction is this episode's exchange with steprl's loop."""

    def __init__(self, run: _Run) -> None:
        self._run = run
        self.trainable = True
        self.name = run.loaded.seat

    @contextlib.asynccontextmanager
    async def interaction(self, task: Any):
        self._run.opened = True
        yield _Interaction(self._run)

    async def run(self, task: Any) -> Any:
        """SingleAgentEnv's seat: one segment on the task's prompt (tool calls, then a reply)."""
        async with self.interaction(task) as interaction:
            await interaction.turn()
        return self._run.trace


class _Agents:
    def __init__(self, seat: _Seat) -> None:
        self._seat = seat

    def __getattr__(self, name: str) -> _Seat:
        seat = self.__dict__.get("_seat")
        if seat is None or name != seat.name:
            raise AttributeError(f"no agent {name!r}; this config declares [{seat.name if seat else ''!r}]")
        return seat


class _Interaction:
    """What ``Env.run`` talks to: ``turn(message)`` hands the message to steprl and waits for a reply."""

    def __init__(self, run: _Run) -> None:
        self._run = run

    @property
    def trace(self) -> Any:
        return self._run.trace

    async def turn(self, message: Any = None) -> Any:
        import verifiers.v1 as vf

        run = self._run
        if run.ended:
            raise EnvFault("turn_after_end", "run() asked for a turn after the exchange ended (max_turns)")
        if run.replies >= run.max_turns:
            run.ended = True
            run.trace.stop("max_turns")
            return vf.Segment(messages=[], terminated=True)
        if not run.started:
            run.started = True
            prompt = run.task.data.prompt
            if message is None and prompt is None:
                raise EnvFault("malformed_message", "the task has no prompt and turn() got no message")
            opening = [{"role": "system", "content": run.task.data.system_prompt or DEFAULT_SYSTEM_PROMPT}]
            opening += _message_dicts(prompt) if prompt is not None else []
            opening += _message_dicts(message) if message is not None else []
            run.add_nodes(opening)
            run.events.put(("start", opening))
        else:
            messages = _message_dicts(message) if message is not None else []
            if not messages:
                raise EnvFault("malformed_message", "turn() without a message after the opening turn")
            run.add_nodes(messages)
            run.events.put(("obs", messages))
        reply = await run.reply()
        return vf.Segment(messages=[vf.AssistantMessage(content=reply)])


class VerifiersEnv(AgentEnv):
    """One verifiers episode at a time (module docstring). ``row["task"]``: the TaskData as JSON."""

    def __init__(
        self,
        loaded: Loaded,
        *,
        max_turns: int = 10,
        turn_timeout_s: float = 60.0,
        success_reward: float = 1.0,
        tool_parser: str = "hermes",
        max_action_chars: int = 16_384,
        max_calls_per_step: int = 8,
        max_output_chars: int = 2000,
    ) -> None:
        if max_turns < 1 or not turn_timeout_s > 0:
            raise ValueError(
                f"max_turns must be >= 1 and turn_timeout_s > 0, got {max_turns}, {turn_timeout_s}"
            )
        self._loaded = loaded
        self.max_turns = max_turns
        self.turn_timeout_s = turn_timeout_s
        self.success_reward = float(success_reward)
        self.tools = loaded.tool_schemas()
        self._tools = {t.name: t for t in loaded.tools}
        fmt = get_format(tool_parser)
        fmt.prepare()
        self._parse = fmt.parse
        self.max_action_chars = max_action_chars
        self.max_calls_per_step = max_calls_per_step
        self.max_output_chars = max_output_chars
        self._run: _Run | None = None
        self._future: Any = None
        self._failure: tuple[str, str] | None = None
        self._done = True

    @property
    def trace(self) -> Any:
        """The current episode's ``vf.Trace`` (its rewards once the episode is done)."""
        return self._run.trace if self._run is not None else None

    def _wait(self) -> tuple[str, Any]:
        try:
            return self._run.events.get(timeout=self.turn_timeout_s)
        except queue.Empty:
            return ("error", ("env_timeout", f"no answer within {self.turn_timeout_s:g} s"))

    def _close(self) -> None:
        if self._future is not None and not self._future.done():
            event_loop().call_soon_threadsafe(self._run.inbox.put_nowait, _Closed)
            self._future.cancel()
        self._future = None

    # --- AgentEnv ---------------------------------------------------------------------------------
    def reset(self, row: Mapping[str, Any]) -> list[dict[str, Any]]:
        import verifiers.v1 as vf
        from verifiers.v1.trace import AgentInfo, TraceTask

        self._close()
        if "task" not in row:
            raise KeyError(f"task row has no 'task' column (columns: {sorted(row)})")
        raw = row["task"]
        task = self._loaded.task(json.loads(raw) if isinstance(raw, str) else raw)
        trace = vf.Trace(
            task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
            agent=AgentInfo(config=vf.AgentConfig(), name=self._loaded.seat),
            verifiers=_version(),
        )
        loop = event_loop()
        inbox = asyncio.run_coroutine_threadsafe(self._make_inbox(), loop).result()
        self._run = _Run(self._loaded, task, trace, self.max_turns, inbox)
        self._failure = None
        self._done = False
        self._future = asyncio.run_coroutine_threadsafe(self._run.play(), loop)
        kind, value = self._wait()
        if kind == "start":
            return [dict(m) for m in value]
        # the env failed (or finished) before its first turn: the first step ends the episode
        self._failure = value if kind == "error" else ("no_turn", "run() ended before its first turn")
        system = task.data.system_prompt or DEFAULT_SYSTEM_PROMPT
        prompt = task.data.prompt_text or "(the environment did not start)"
        return [{"role": "system", "content": system}, {"role": "user", "content": prompt}]

    @staticmethod
    async def _make_inbox() -> asyncio.Queue:
        return asyncio.Queue()

    def step(self, action_text: str) -> StepOutcome:
        if self._done:
            raise RuntimeError("step() called after the episode ended; call reset() first")
        if self._failure is not None:
            return self._fail(*self._failure)
        if self.tools:
            parsed = self._parse(
                action_text, self.tools, max_chars=self.max_action_chars, max_calls=self.max_calls_per_step
            )
            if not parsed.is_final:
                return self._tool_step(action_text, parsed)
        run = self._run
        run.add_nodes([{"role": "assistant", "content": action_text}], sampled=True)
        run.replies += 1
        event_loop().call_soon_threadsafe(run.inbox.put_nowait, action_text)
        kind, value = self._wait()
        if kind == "obs":
            return StepOutcome([dict(m) for m in value], 0.0, False, {"n_calls": 0, "format_error": False})
        if kind == "done":
            return self._finish()
        return self._fail(*value)

    def _tool_step(self, action_text: str, parsed: Any) -> StepOutcome:
        self._run.add_nodes([{"role": "assistant", "content": action_text}], sampled=True)
        messages, errors = [], 0
        for call in parsed.calls:
            if isinstance(call, CallError):
                errors += 1
                messages.append(
                    {"role": "tool", "name": call.name or "invalid_call", "content": f"error: {call.message}"}
                )
                continue
            messages.append(
                {"role": "tool", "name": call.name, "content": self._call_tool(call.name, call.arguments)}
            )
        self._run.add_nodes(messages)
        info = {
            "n_calls": len(parsed.calls),
            "n_valid_calls": len(parsed.calls) - errors,
            "format_error": errors > 0,
        }
        return StepOutcome(messages, 0.0, False, info)

    def _call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        tool = self._tools[name]
        try:
            args = tool.args_model.model_validate(arguments)
        except Exception as err:
            return f"error: bad arguments for {name}: {short(err)}"

        async def call() -> Any:
            result = tool.fn(**{k: getattr(args, k) for k in type(args).model_fields})
            return await result if asyncio.iscoroutine(result) else result

        future = asyncio.run_coroutine_threadsafe(call(), event_loop())
        try:
            text = str(future.result(timeout=self.turn_timeout_s))
        except TimeoutError:
            future.cancel()
            return f"error: {name} timed out after {self.turn_timeout_s:g} s"
        except Exception as err:
            return f"error: {name} failed: {type(err).__name__}: {short(err)}"
        if len(text) > self.max_output_chars:
            text = (
                text[: self.max_output_chars]
                + f"... [output cut: {len(text) - self.max_output_chars} more chars]"
            )
        return text

    def _scores(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, r in self.trace.rewards.items():
            if r is not None and math.isfinite(r.score):
                out[f"reward/{name}"] = float(r.score)
        for name, v in self.trace.metrics.items():
            if v is not None and math.isfinite(float(v)):
                out[f"metric/{name}"] = float(v)
        return out

    def _finish(self) -> StepOutcome:
        self._done = True
        self._future = None
        rewards = [r for r in self.trace.rewards.values() if r is not None]
        total = sum(r.score * r.weight for r in rewards)
        if not math.isfinite(total):
            return self._fail("env_raised", f"the rubric gave a non-finite reward {total!r}")
        metrics = {"reward": total, "turns": float(self._run.replies), **self._scores()}
        if self._run.ended:
            metrics["stop/max_turns"] = 1.0
        info = {
            "n_calls": 0,
            "format_error": False,
            "correct": total >= self.success_reward,
            "task_metrics": json.dumps(metrics),
        }
        return StepOutcome([], float(total), True, info, truncated=self._run.ended)

    def _fail(self, reason: str, message: str) -> StepOutcome:
        self._done = True
        self._close()
        log.warning("verifiers env %s: episode ended: %s: %s", self._loaded.env_id, reason, message)
        metrics = {"reward": 0.0, "turns": float(self._run.replies), f"error/{reason}": 1.0}
        info = {"n_calls": 0, "format_error": False, "correct": False, "task_metrics": json.dumps(metrics),
                "error": reason, "error_message": message}  # fmt: skip
        return StepOutcome([], 0.0, True, info, truncated=reason in ("env_timeout",))

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self._close()
