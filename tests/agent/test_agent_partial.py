"""Partial rollouts in the agent loop: ``until`` stops a batch mid-episode, and ``replay_episode``
rebuilds a stopped episode from its records so that it goes on with the same token ids, seeds and
environment state as an episode that was never stopped; a record the environment or the prompt does
not reproduce is named, not played on."""

from __future__ import annotations

from agent_helpers import ScriptedEngine, answer, call, row

from components.agent.loop import Episode, episode_seed, replay_episode, run_episodes
from components.envs import get_task

Q1, Q3 = "What is 60 + 37?", "What is 5 - 9 + 100?"
LIMITS = dict(max_steps=4, max_prompt_len=2048, max_response_len=128, temperature=1.0, seed=7)
SCRIPTS = {Q3: [call("5 - 9"), call("-4 + 100"), answer("96")], Q1: [answer("97")]}
ROWS = {Q3: row("long", Q3, "96"), Q1: row("short", Q1, "97")}


def _episode(question: str, sample: int = 0) -> Episode:
    r = ROWS[question]
    return Episode(f"{r['id']}-{sample}", r["id"], get_task("calc").make_env(r), r)


def _after_one_turn(engine) -> bool:
    return len(engine.calls) >= 1


def test_until_stops_the_batch_and_leaves_the_unfinished_episode_as_it_is(tok, renderer):
    engine = ScriptedEngine(tok, SCRIPTS)
    eps = [_episode(Q3), _episode(Q1)]
    steps = run_episodes(engine, renderer, eps, **LIMITS, until=lambda: _after_one_turn(engine))

    assert len(engine.calls) == 1
    assert [ep.done for ep in eps] == [False, True]
    assert [ep.turn for ep in eps] == [1, 1]
    assert [(s["traj_id"], s["step"], s["done"]) for s in steps] == [
        ("long-0", 0, False),
        ("short-0", 0, True),
    ]


def test_a_replayed_episode_goes_on_exactly_as_one_never_stopped(tok, renderer):
    whole_engine = ScriptedEngine(tok, SCRIPTS)
    whole = run_episodes(whole_engine, renderer, [_episode(Q3)], **LIMITS)
    assert len(whole) == 3 and whole[-1]["correct"]

    first_engine = ScriptedEngine(tok, SCRIPTS)
    stopped = run_episodes(
        first_engine, renderer, [_episode(Q3)], **LIMITS, until=lambda: _after_one_turn(first_engine)
    )
    assert len(stopped) == 1 and not stopped[0]["done"]

    resumed = _episode(Q3)
    assert replay_episode(resumed, renderer, stopped) is None
    assert resumed.turn == 1 and not resumed.done
    assert resumed.context == whole[1]["prompt_ids"]  # the replayed env answered as the first run's
    later_engine = ScriptedEngine(tok, SCRIPTS)
    rest = run_episodes(later_engine, renderer, [resumed], **LIMITS)

    assert len(rest) == 3  # the replayed record, then the two turns played now
    for a, b in zip(whole, rest, strict=True):
        assert {k: v for k, v in a.items()} == {k: v for k, v in b.items()}
    # each turn is seeded by (seed, trajectory, turn), wherever the episode was resumed
    assert [c["seeds"] for c in later_engine.calls] == [
        [episode_seed(LIMITS["seed"], "long-0", t)] for t in (1, 2)
    ]


def test_a_windowed_episode_replays_to_the_same_context(tok, renderer):
    whole = run_episodes(ScriptedEngine(tok, SCRIPTS), renderer, [_episode(Q3)], **LIMITS, context_window=1)
    resumed = _episode(Q3)
    assert replay_episode(resumed, renderer, whole[:2], context_window=1) is None
    assert resumed.context == whole[2]["prompt_ids"]
    assert resumed.turn == 2


def test_replay_names_a_record_it_cannot_reproduce(tok, renderer):
    engine = ScriptedEngine(tok, SCRIPTS)
    stopped = run_episodes(engine, renderer, [_episode(Q3)], **LIMITS, until=lambda: len(engine.calls) >= 2)
    assert len(stopped) == 2

    other_answer = [stopped[0], {**stopped[1], "feedback": "1000"}]
    assert "answered otherwise than recorded" in replay_episode(_episode(Q3), renderer, other_answer)
    other_prompt = [stopped[0], {**stopped[1], "prompt_ids": stopped[1]["prompt_ids"][:-1]}]
    assert "step 1: the rebuilt prompt differs" in replay_episode(_episode(Q3), renderer, other_prompt)
    ended = [{**stopped[0], "done": True}]
    assert "the record says the episode ended" in replay_episode(_episode(Q3), renderer, ended)
