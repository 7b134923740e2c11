"""Run a batch of agent episodes turn by turn and emit one record per agent step.

At each turn, ONE generate call covers every still-active episode; then each environment steps on
its action (several at once, in threads, where the environments allow it: ``concurrent_steps``).
The context of the next step is the exact previous context + the sampled response ids + the
rendered observation ids, so ``prompt_ids``/``response_ids`` are what the model saw and sampled.

With ``context_window`` k, the context of step t is the first observation's ids (system + first user
message, rendered) followed by the token segments of the last k turns, a segment being that turn's
sampled response ids + the rendered observation ids that followed it: still exact ids, never
re-encoded. ``None`` keeps the whole history. Each record also holds ``obs_key``, the environment's
``state_key()`` before the step's action ("" when it gives None), which ``gigpo`` groups steps by,
and ``process_reward``: the environment's score of the step's tool calls (``AgentEnv.process_rewards``,
asked once every episode has ended), None where it gives none (a step it does not score, a response
cut before the environment saw it, a task without process rewards).

With ``noop_escape`` (evaluation and serving, never training), a reply that already changed nothing
from the same state earlier in the episode (compared without surrounding white space and case) is not
played again: that episode's turn is resampled at ``noop_escape.temperature`` with another seed, up to
``noop_escape.tries`` times, and the first reply not known to change nothing there is played (the last
try if every one is). A greedy agent then cannot answer a wall with the same move turn after turn.
Each record then holds ``escapes``, the resamples its step took. Only tasks with state keys.

An episode ends when its environment says done, at ``max_steps`` turns (``truncated``), or when its
context would exceed ``max_prompt_len`` (the last recorded step is marked ``truncated``). A response
cut at ``max_response_len`` is model output like any other: the environment parses it (it is almost
always malformed: a tag left open) and answers with its feedback and its penalty, the step is a
format error, and the episode goes on; the stop token that closes the cut turn is part of the next
observation (not sampled, not trained). Ending the episode there instead, with no penalty, paid the
policy for rambling wherever a failed episode earns less than nothing (sokoban's step penalty: a cut
first turn scored 0 against -1 for ten moves, and a GRPO run learned to ramble in three iterations).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from tqdm.auto import tqdm

from components.agent.render import ChatRenderer
from components.rollout.base import RolloutEngine, SamplingConfig
from components.tasks.step_records import reply_key


@dataclass
class Episode:
    traj_id: str
    group_id: str
    env: Any  # an AgentEnv
    row: Mapping[str, Any]
    context: list[int] = field(default_factory=list)
    first: list[int] = field(default_factory=list)  # the first observation's ids
    segments: list[list[int]] = field(default_factory=list)  # window: the last turns (response + obs ids)
    steps: list[dict] = field(default_factory=list)
    done: bool = False
    env_steps: list[int] = field(default_factory=list)  # the records made by env.step, in order
    noops: dict[str, set[str]] = field(default_factory=dict)  # state key -> replies that changed nothing
    turn: int = 0  # turns played so far (the next step's index)


@dataclass(frozen=True)
class NoopEscape:
    """A reply that changed nothing is not played again from the same state (module docstring)."""

    tries: int = 4
    temperature: float = 1.0

    def __post_init__(self) -> None:
        if self.tries < 1 or not self.temperature > 0:
            raise ValueError(f"NoopEscape needs tries >= 1 and temperature > 0, got {self}")


def episode_seed(seed: int, traj_id: str, turn: int) -> int:
    """A sampling seed that depends only on (seed, trajectory, turn), not on batch composition."""
    return (seed * 1_000_003 + zlib.crc32(traj_id.encode()) * 101 + turn) % (2**31 - 1)


def run_episodes(
    engine: RolloutEngine,
    renderer: ChatRenderer,
    episodes: list[Episode],
    *,
    max_steps: int,
    max_prompt_len: int,
    max_response_len: int,
    temperature: float,
    top_p: float = 1.0,
    seed: int = 0,
    desc: str = "rollout",
    context_window: int | None = None,
    noop_escape: NoopEscape | None = None,
    until: Callable[[], bool] | None = None,
) -> list[dict]:
    """Play every episode to its end; return the step records of all episodes, in episode order.

    ``context_window``: the number of past turns a prompt keeps after the first observation (None: all).
    ``noop_escape``: resample a reply known to change nothing (module docstring); None: never.
    ``until`` (partial rollouts): asked after each turn; when it says True the call returns with the
    unfinished episodes as they are (their records so far; process rewards only on ended episodes).
    An episode that already has its first observation (:func:`replay_episode`) goes on from its
    ``turn``; the others are reset. Each episode's turn ``t`` samples with the seed of (``seed``,
    its trajectory, ``t``), so where an episode is resumed does not change what it could sample.
    """
    if context_window is not None and context_window < 1:
        raise ValueError(f"context_window must be >= 1 or None, got {context_window}")
    for ep in episodes:
        if ep.first:  # replayed: goes on where it stopped
            continue
        ep.first = renderer.prompt(ep.env.reset(ep.row))
        ep.context, ep.segments, ep.env_steps, ep.turn = list(ep.first), [], [], 0
    bar = tqdm(total=len(episodes), desc=desc, unit="episode", leave=False)
    bar.update(sum(ep.done for ep in episodes))
    for _ in range(max_steps):
        if until is not None and until():
            break
        active = [ep for ep in episodes if not ep.done]
        overlong = [ep for ep in active if len(ep.context) > max_prompt_len]
        for ep in overlong:
            _end_overlong(ep, ep.turn)
        bar.update(len(overlong))
        active = [ep for ep in active if not ep.done]
        if not active:
            break
        sampling = SamplingConfig(max_tokens=max_response_len, temperature=temperature, top_p=top_p)
        gens = engine.generate(
            [ep.context for ep in active],
            sampling,
            seeds=[episode_seed(seed, ep.traj_id, ep.turn) for ep in active],
        )
        actions = [renderer.decode(gen.token_ids) for (gen,) in gens]
        keys = [_state_key(ep.env) for ep in active]  # the states the actions respond to
        escapes = [0] * len(active)
        if noop_escape is not None:
            escapes = _escape_noops(
                engine, renderer, active, gens, actions, keys, noop_escape, sampling, seed
            )
        outcomes = _step_envs([ep.env for ep in active], actions)
        if noop_escape is not None:
            for ep, action, key in zip(active, actions, keys):
                if key and _state_key(ep.env) == key:  # the reply changed nothing
                    ep.noops.setdefault(key, set()).add(reply_key(action))
        for ep, (gen,), action, key, out, n in zip(active, gens, actions, keys, outcomes, escapes):
            _advance(
                ep, gen, action, key, out, renderer, last_turn=ep.turn == max_steps - 1, window=context_window
            )
            if noop_escape is not None:
                ep.steps[-1]["escapes"] = n
        bar.update(sum(ep.done for ep in active))
        bar.set_postfix(turn=max(ep.turn for ep in episodes), active=sum(not ep.done for ep in episodes))
    bar.close()
    for ep in episodes:
        if not ep.done:  # stopped by ``until``: its process rewards come when it ends
            continue
        _add_process_rewards(ep)
        if noop_escape is not None:
            for s in ep.steps:
                s.setdefault("escapes", 0)  # a record made without a generation (overlong first prompt)
    steps = [s for ep in episodes for s in ep.steps]
    if any("policy_version" in s for s in steps):  # every row gets the column (None: no generation)
        for s in steps:
            s.setdefault("policy_version", None)
    return steps


def _escape_noops(
    engine: RolloutEngine,
    renderer: ChatRenderer,
    active: list[Episode],
    gens: list,
    actions: list[str],
    keys: list[str],
    escape: NoopEscape,
    sampling: SamplingConfig,
    seed: int,
) -> list[int]:
    """Resample, in place in ``gens``/``actions``, every reply that already changed nothing from its
    state; return the resamples each episode took."""
    taken = [0] * len(active)

    def known(i: int) -> bool:
        return bool(keys[i]) and reply_key(actions[i]) in active[i].noops.get(keys[i], ())

    stuck = [i for i in range(len(active)) if known(i)]
    hot = replace(sampling, temperature=escape.temperature)
    for attempt in range(1, escape.tries + 1):
        if not stuck:
            break
        redo = engine.generate(
            [active[i].context for i in stuck],
            hot,
            seeds=[episode_seed(seed + attempt, active[i].traj_id, active[i].turn) for i in stuck],
        )
        for i, gen in zip(stuck, redo):
            gens[i], actions[i], taken[i] = gen, renderer.decode(gen[0].token_ids), attempt
        stuck = [i for i in stuck if known(i)]
    return taken


def _add_process_rewards(ep: Episode) -> None:
    """Copy the environment's process rewards (one per ``step`` call) onto the records it made."""
    scores = ep.env.process_rewards() if hasattr(ep.env, "process_rewards") else None
    if scores is None:
        return
    scores = list(scores)
    if len(scores) != len(ep.env_steps):
        raise ValueError(
            f"episode {ep.traj_id}: the environment gave {len(scores)} process rewards for "
            f"{len(ep.env_steps)} steps"
        )
    for row, score in zip(ep.env_steps, scores):
        if score is not None and not math.isfinite(float(score)):
            raise ValueError(f"episode {ep.traj_id}: non-finite process reward {score!r}")
        ep.steps[row]["process_reward"] = None if score is None else float(score)


def _record(
    ep: Episode,
    turn: int,
    prompt: list[int],
    ids: list[int],
    logprobs: list[float],
    *,
    reward: float,
    done: bool,
    truncated: bool,
    action: str,
    feedback: str,
    info: Mapping[str, Any],
    obs_key: str,
    version: int | None = None,
) -> None:
    ep.steps.append(
        {
            "traj_id": ep.traj_id,
            "group_id": ep.group_id,
            "step": turn,
            "obs_key": obs_key,
            "prompt_ids": list(prompt),
            "response_ids": list(ids),
            "response_logprobs": [float(x) for x in logprobs],
            "reward": float(reward),
            "done": done,
            "truncated": truncated,
            "action": action,
            "feedback": feedback,
            "n_calls": int(info.get("n_calls", 0)),
            "n_valid_calls": int(info.get("n_valid_calls", 0)),
            "format_error": bool(info.get("format_error", False)),
            "correct": bool(info.get("correct", False)),
            # The task's own numbers of the episode, as the environment wrote them (a JSON string in
            # info["task_metrics"] of the final step, else ""): read by the recipe's episode_metrics hook.
            "task_metrics": str(info.get("task_metrics") or ""),
            "process_reward": None,  # filled in when the episode has ended (_add_process_rewards)
            # the policy version the engine stamped the generation with (an in-flight engine's), if any
            **({} if version is None else {"policy_version": version}),
        }
    )


def _state_key(env: Any) -> str:
    """The env's ``state_key()`` as a string ("" when it has none)."""
    key = env.state_key() if hasattr(env, "state_key") else None
    return "" if key is None else str(key)


def _step_envs(envs: list[Any], actions: list[str]) -> list[Any]:
    """``env.step(action)`` for each pair, in order. When every env allows it (``concurrent_steps``
    > 1), up to the smallest such number of steps run at once in threads: an env that waits on another
    process (a sandbox) then waits side by side with the others. The outcomes are in the envs' order
    whatever order the steps finish in, and an exception in one step is raised as it would be
    unthreaded (after the others have finished)."""
    workers = min((int(getattr(env, "concurrent_steps", 1)) for env in envs), default=1)
    if workers <= 1 or len(envs) <= 1:
        return [env.step(action) for env, action in zip(envs, actions)]
    with ThreadPoolExecutor(max_workers=min(workers, len(envs)), thread_name_prefix="env-step") as pool:
        return list(pool.map(lambda pair: pair[0].step(pair[1]), zip(envs, actions)))


def _advance(
    ep: Episode,
    gen,
    action: str,
    obs_key: str,
    out: Any,
    renderer: ChatRenderer,
    last_turn: bool,
    window: int | None,
) -> None:
    """Record the step that ``gen`` (decoded: ``action``) made from the state ``obs_key``, whose
    environment answered ``out``, and extend the episode's context."""
    cut = gen.finish_reason != "stop"  # cut at max_response_len: no stop token
    ep.env_steps.append(len(ep.steps))
    feedback = _feedback(out.messages, cut, len(gen.token_ids))
    info = dict(out.info)
    if cut:
        info["format_error"] = True
    ep.done = bool(out.done) or last_turn
    _record(
        ep,
        ep.turn,
        ep.context,
        gen.token_ids,
        gen.logprobs,
        reward=out.reward,
        done=ep.done,
        truncated=(ep.done and not out.done) or bool(out.truncated),
        action=action,
        feedback=feedback,
        info=info,
        obs_key=obs_key,
        version=getattr(gen, "policy_version", None),
    )
    ep.turn += 1
    if not ep.done:
        _extend(ep, gen.token_ids, cut, out.messages, renderer, window)


def _feedback(messages: Sequence[Mapping], cut: bool, n_tokens: int) -> str:
    """The record's ``feedback``: the environment's messages, after a note when the response was cut."""
    text = "\n".join(str(m.get("content", "")) for m in messages)
    return f"[response cut at {n_tokens} tokens] {text}" if cut else text


def _extend(
    ep: Episode,
    ids: Sequence[int],
    cut: bool,
    messages: Sequence[Mapping],
    renderer: ChatRenderer,
    window: int | None,
) -> None:
    """The next context: the response ids (closed by the stop token where it was cut) and the rendered
    observation after the current context, or after the first observation within the window."""
    close = [renderer.stop_id] if cut else []  # the cut turn is closed by the observation
    segment = list(ids) + close + renderer.observation(list(messages))
    if window is None:
        ep.context = ep.context + segment
    else:
        ep.segments = (ep.segments + [segment])[-window:]
        ep.context = ep.first + [t for seg in ep.segments for t in seg]


def replay_episode(
    ep: Episode, renderer: ChatRenderer, records: Sequence[Mapping], *, context_window: int | None = None
) -> str | None:
    """Rebuild an unfinished episode from its step ``records`` (a partial rollout carried to the next
    iteration): reset its environment, play each recorded action again and rebuild the context exactly
    as :func:`run_episodes` built it, so the episode goes on from ``records``' last step with the
    same token ids. Each step's recorded prompt must equal the rebuilt context and the environment
    must answer as recorded; None when every step does, else the departure in words (``ep`` is then
    left unusable: end the episode at its last record). The records are copied onto ``ep.steps``."""
    ep.first = renderer.prompt(ep.env.reset(ep.row))
    ep.context, ep.segments, ep.env_steps, ep.steps, ep.turn = list(ep.first), [], [], [], 0
    for i, rec in enumerate(records):
        where = f"episode {ep.traj_id} step {i}"
        if list(rec["prompt_ids"]) != ep.context:
            return f"{where}: the rebuilt prompt differs from the recorded one"
        if rec["done"]:
            return f"{where}: the record says the episode ended"
        ids = list(rec["response_ids"])
        cut = not ids or ids[-1] != renderer.stop_id
        out = ep.env.step(str(rec["action"]))
        if bool(out.done) or _feedback(out.messages, cut, len(ids)) != rec["feedback"]:
            return f"{where}: the environment answered otherwise than recorded"
        ep.env_steps.append(len(ep.steps))
        ep.steps.append(dict(rec))
        ep.turn += 1
        _extend(ep, ids, cut, out.messages, renderer, context_window)
    return None


def _end_overlong(ep: Episode, turn: int) -> None:
    ep.done = True
    if ep.steps:
        ep.steps[-1]["done"] = True
        ep.steps[-1]["truncated"] = True
    else:
        _record(
            ep,
            turn,
            ep.context,
            [],
            [],
            reward=0.0,
            done=True,
            truncated=True,
            action="",
            feedback="[prompt longer than max_prompt_len]",
            info={},
            obs_key=_state_key(ep.env),
        )


def episode_correctness(steps: Sequence[Mapping]) -> dict[str, dict[str, bool]]:
    """problem id (group_id) -> episode id (traj_id) -> whether any step of the episode is correct."""
    out: dict[str, dict[str, bool]] = {}
    for i, s in enumerate(steps):
        for key in ("group_id", "traj_id", "correct"):
            if key not in s:
                raise ValueError(f"step record {i} has no {key!r} (keys: {sorted(s)})")
        group = out.setdefault(str(s["group_id"]), {})
        group[str(s["traj_id"])] = group.get(str(s["traj_id"]), False) or bool(s["correct"])
    return out


def sampled_metrics(steps: list[dict]) -> dict[str, float]:
    """mean@k and pass@k of k sampled episodes per prompt (episodes grouped by ``group_id``).

    ``sampled_accuracy`` is the mean over prompts of the fraction of its episodes that are correct,
    ``pass_at_k`` the fraction of prompts with at least one correct episode, ``samples_per_prompt`` the
    k (the smallest group, so an uneven batch never overstates it).
    """
    correct = episode_correctness(steps)
    if not correct:
        return {"sampled_accuracy": 0.0, "pass_at_k": 0.0, "samples_per_prompt": 0.0}
    groups = [list(g.values()) for g in correct.values()]
    return {
        "sampled_accuracy": sum(sum(g) / len(g) for g in groups) / len(groups),
        "pass_at_k": sum(any(g) for g in groups) / len(groups),
        "samples_per_prompt": float(min(len(g) for g in groups)),
    }


def _answered(traj: list[dict]) -> bool:
    """The episode ended on the agent's own final turn (its environment said done), not on a cut."""
    return any(s["done"] and not s["truncated"] for s in traj)


def episode_metrics(steps: list[dict]) -> dict[str, float]:
    """Accuracy, turns, tool use and error rates of a set of step records (any order).

    - ``mean_turns``: agent steps per episode.
    - ``tool_calls_per_step``: tool calls (``n_calls``, valid or not) per agent step, over all steps;
      ``tool_calls_per_episode``: the same per episode.
    - ``answer_without_tool_rate``: fraction of ALL episodes that ended on their own final turn (done,
      not truncated; a final text without ``<answer>`` tags counts, it is a format error as well)
      without a single tool call in the whole episode. Truncated episodes never count.
    - ``valid_tool_call_rate``: valid calls / calls; ``format_error_rate``: per step;
      ``truncated_rate``: per episode.
    - ``noop_escapes_per_step``: resamples of a reply known to change nothing, per step (only where
      the records were played with a ``noop_escape``).
    """
    by_traj: dict[str, list[dict]] = {}
    for s in steps:
        by_traj.setdefault(s["traj_id"], []).append(s)
    n_traj = max(len(by_traj), 1)
    calls = sum(s["n_calls"] for s in steps)
    return {
        "accuracy": sum(any(s["correct"] for s in t) for t in by_traj.values()) / n_traj,
        "mean_turns": sum(len(t) for t in by_traj.values()) / n_traj,
        "tool_calls_per_step": calls / max(len(steps), 1),
        "tool_calls_per_episode": calls / n_traj,
        "answer_without_tool_rate": sum(
            _answered(t) and not any(s["n_calls"] for s in t) for t in by_traj.values()
        )
        / n_traj,
        "valid_tool_call_rate": (sum(s["n_valid_calls"] for s in steps) / calls) if calls else 0.0,
        "format_error_rate": sum(s["format_error"] for s in steps) / max(len(steps), 1),
        "truncated_rate": sum(any(s["truncated"] for s in t) for t in by_traj.values()) / n_traj,
        "n_episodes": float(len(by_traj)),
    } | (
        {"noop_escapes_per_step": sum(s["escapes"] for s in steps) / max(len(steps), 1)}
        if steps and "escapes" in steps[0]
        else {}
    )
