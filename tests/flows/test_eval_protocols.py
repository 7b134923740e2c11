"""The test evaluation and the validation during training under several protocols (greedy, sampled at
0.4 and at 1, and played again with the no-op escape) on calc with a scripted engine that answers right
below temperature 1 and wrong at 1: each protocol's episodes, metrics, MLflow names and per-problem
columns are its own, and the keys from before protocols keep their meaning. Then the per-problem loop
columns of a task with state keys."""

from __future__ import annotations

import polars as pl
import pytest

import flows.evaluate as evaluate
import flows.train as train
from components.agent.loop import NoopEscape, run_episodes
from components.agent.render import ChatRenderer
from components.config import parse_params
from components.envs import get_task
from components.model.tokenizer import EOS_TOKEN
from components.stats import problem_results
from tests.agent.agent_helpers import ScriptedEngine, answer, call, tokenizer

ROWS = [
    {"id": "q1", "question": "What is 6 * 7?", "answer": "42"},
    {"id": "q2", "question": "What is 5 * 3?", "answer": "15"},
]
RIGHT = {"What is 6 * 7?": [call("6 * 7"), answer("42")], "What is 5 * 3?": [call("5 * 3"), answer("15")]}
WRONG = {q: [answer("0")] for q in RIGHT}


class WrongWhenHot(ScriptedEngine):
    """The scripted engine, answering wrong (at once) at temperature 1 and right below it."""

    def generate(self, prompts, sampling, seeds=None):
        self.scripts = WRONG if sampling.temperature >= 1.0 else RIGHT
        return super().generate(prompts, sampling, seeds)


@pytest.fixture
def engine():
    tok = tokenizer()
    return WrongWhenHot(tok, RIGHT), ChatRenderer(tok, get_task("calc").tools(), EOS_TOKEN)


def temperatures(engine) -> list[float]:
    return [c["sampling"].temperature for c in engine.calls]


def test_test_evaluation_runs_every_protocol(engine):
    eng, renderer = engine
    params = parse_params({"task": "calc", "evaluate": {"samples": 2, "temperatures": [0.4, 1.0]}})
    greedy, sampled = evaluate.play.fn(params, "m", ROWS, eng, renderer)
    assert temperatures(eng) == [0.0, 0.0, 0.4, 0.4, 1.0]  # two turns, two turns, one (a wrong answer)
    assert sorted({s["traj_id"] for s in greedy}) == ["q1", "q2"] and sorted(sampled) == ["t0.4", "t1"]
    assert sorted({s["traj_id"] for s in sampled["t0.4"]}) == ["q1#0", "q1#1", "q2#0", "q2#1"]
    record = evaluate.eval_record("calc", greedy, sampled)
    assert record["greedy"]["accuracy"] == 1.0 and "pass_at_k" not in record["greedy"]
    assert record["t0.4"]["accuracy"] == 1.0 and record["t0.4"]["pass_at_k"] == 1.0
    assert record["t1"]["accuracy"] == 0.0 and record["t1"]["samples_per_prompt"] == 2.0
    # the keys from before protocols: the greedy episodes', and mean@k / pass@k at T=1
    assert record["accuracy"] == 1.0 and record["mean_turns"] == 2.0
    assert (
        record["sampled_accuracy"] == 0.0
        and record["pass_at_k"] == 0.0
        and record["sampled_temperature"] == 1.0
    )
    logged = evaluate.mlflow_metrics("eval", record)
    assert logged["eval/t0.4/accuracy"] == 1.0 and logged["eval/t1/accuracy"] == 0.0
    assert logged["eval/greedy/accuracy"] == logged["eval/accuracy"] == 1.0
    problems = problem_results(["q1", "q2"], greedy, sampled["t1"], protocols=sampled)
    assert problems["t0.4_correct"].to_list() == [1.0, 1.0] and problems["t0.4_n"].to_list() == [2, 2]
    assert problems["t1_correct"].to_list() == problems["sampled_correct"].to_list() == [0.0, 0.0]
    assert "loop_rate" not in problems.columns  # calc has no state keys


def test_greedy_only_evaluation_has_no_sampled_keys(engine):
    eng, renderer = engine
    params = parse_params({"task": "calc", "evaluate": {"samples": 0}, "compare": {"headline": "greedy"}})
    greedy, sampled = evaluate.play.fn(params, "m", ROWS, eng, renderer)
    record = evaluate.eval_record("calc", greedy, sampled)
    assert sampled == {} and temperatures(eng) == [0.0, 0.0] and "sampled_accuracy" not in record


class Session:
    """What validate needs of an RL session: ``play`` on the scripted engine."""

    def __init__(self, engine, renderer):
        self.engine, self.renderer = engine, renderer

    def play(self, episodes, **kw):
        return run_episodes(self.engine, self.renderer, episodes, **kw)


def test_validation_runs_greedy_and_each_val_temperature(engine, tmp_path, monkeypatch):
    eng, renderer = engine
    pl.DataFrame(ROWS).write_parquet(tmp_path / "val.parquet")
    monkeypatch.setattr(train, "processed", lambda task: tmp_path)
    params = parse_params({"task": "calc", "train": {"val_samples": 2, "val_temperatures": [0.4, 1.0]}})
    out = train.validate.fn(Session(eng, renderer), "grpo-s3", 4, params, 7)
    assert temperatures(eng) == [0.0, 0.0, 0.4, 0.4, 1.0]
    assert out["val/accuracy"] == out["val/greedy/accuracy"] == out["val/t0.4/accuracy"] == 1.0
    assert out["val/t1/accuracy"] == 0.0 and "val/n_episodes" not in out
    sampled_seeds = [seed for c in eng.calls[2:] for seed in c["seeds"]]
    from components.agent.loop import episode_seed

    assert sampled_seeds[:2] == [episode_seed(7, "val-q1", 0), episode_seed(7, "val-q2", 0)]


def test_per_problem_loop_rates_of_each_protocol():
    """Records with state keys (sokoban, babyai): the greedy episode's loop rate, and each protocol's
    mean over the problem's episodes."""

    def ep(traj, group, keys, actions):
        return [
            {
                "traj_id": traj,
                "group_id": group,
                "step": t,
                "obs_key": k,
                "action": a,
                "correct": False,
                "reward": 0.0,
            }
            for t, (k, a) in enumerate(zip(keys, actions))
        ]

    greedy = ep("a", "a", "XXXX", ["up"] * 4) + ep("b", "b", "XY", ["up", "up"])  # 3 loops of 4; none
    hot = ep("a#0", "a", "XX", ["up", "up"]) + ep("a#1", "a", "XY", ["l", "r"]) + ep("b#0", "b", "X", ["up"])
    problems = problem_results(["a", "b"], greedy, protocols={"t1": hot})
    assert problems["loop_rate"].to_list() == [0.75, 0.0]
    assert problems["t1_loop_rate"].to_list() == [0.25, 0.0]  # (1/2 + 0) / 2, and 0
    with pytest.raises(ValueError, match="protocol t1: 1 problem"):
        problem_results(["a", "b"], greedy, protocols={"t1": hot[:4]})


def test_escape_protocols_play_again_with_the_escape(engine, monkeypatch):
    """evaluate.noop_escape_protocols: each named protocol is played a second time with the escape, as a
    protocol of its own after the plain ones; the plain ones never escape."""
    eng, renderer = engine
    seen = []

    def fake(*a, **kw):
        seen.append((kw["temperature"], kw["noop_escape"]))
        return []

    monkeypatch.setattr(evaluate, "run_episodes", fake)
    ev = {"samples": 1, "temperatures": [0.4, 1.0], "noop_escape_protocols": ["greedy", "t0.4"]}
    params = parse_params(
        {"task": "calc", "evaluate": {**ev, "noop_escape_tries": 3, "noop_escape_temperature": 0.8}}
    )
    _, others = evaluate.play.fn(params, "m", ROWS, eng, renderer)
    assert list(others) == ["t0.4", "t1", "greedy_escape", "t0.4_escape"]
    esc = NoopEscape(3, 0.8)
    assert seen == [(0.0, None), (0.4, None), (1.0, None), (0.0, esc), (0.4, esc)]


def test_a_greedy_escape_protocol_is_greedy_in_the_record(engine):
    """greedy_escape's block has no pass@k (one greedy episode per problem); t0.4_escape's has."""
    eng, renderer = engine
    ev = {"samples": 2, "temperatures": [0.4], "noop_escape_protocols": ["greedy", "t0.4"]}
    params = parse_params({"task": "calc", "evaluate": ev})
    greedy, others = evaluate.play.fn(params, "m", ROWS, eng, renderer)
    record = evaluate.eval_record("calc", greedy, others)
    assert record["greedy_escape"]["accuracy"] == 1.0 and "pass_at_k" not in record["greedy_escape"]
    assert record["t0.4_escape"]["pass_at_k"] == 1.0
    problems = problem_results(["q1", "q2"], greedy, protocols=others)
    assert problems["greedy_escape_n"].to_list() == [1, 1] and problems["t0.4_escape_n"].to_list() == [2, 2]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"noop_escape_protocols": ["t0.5"]}, "'t0.5' is not a protocol the evaluation runs"),
        ({"noop_escape_protocols": ["t0.4"], "samples": 0}, "'t0.4' is not a protocol"),
        ({"noop_escape_protocols": ["greedy", "greedy"]}, "names a protocol twice"),
        ({"noop_escape_protocols": ["greedy_escape"]}, "'greedy_escape' is not a protocol"),
        ({"noop_escape_tries": 0}, "switched on per protocol by evaluate.noop_escape_protocols"),
    ],
)
def test_bad_escape_settings_are_named(settings, message):
    with pytest.raises(ValueError, match=message):
        parse_params({"task": "calc", "evaluate": {"temperatures": [0.4], **settings}})


def test_the_headline_may_be_an_escape_protocol():
    ev = {"temperatures": [0.4], "noop_escape_protocols": ["greedy"]}
    params = parse_params({"task": "calc", "evaluate": ev, "compare": {"headline": "greedy_escape"}})
    assert params.evaluate.protocols == ["greedy", "t0.4", "greedy_escape"]
    with pytest.raises(ValueError, match="compare.headline='t0.4_escape' is not an evaluated protocol"):
        parse_params({"task": "calc", "evaluate": ev, "compare": {"headline": "t0.4_escape"}})
