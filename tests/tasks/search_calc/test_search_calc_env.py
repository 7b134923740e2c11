"""The search_calc environment on hand-made trajectories: process rewards per step, per-tool metrics
(calls, valid calls, right tool for the step), hostile model text, and the real agent loop."""

from __future__ import annotations

import json

import pytest

from components.agent.loop import Episode, run_episodes
from components.agent.render import ChatRenderer
from components.envs import get_task
from components.model.tokenizer import EOS_TOKEN
from tests.agent.agent_helpers import ScriptedEngine, tokenizer


def search(query) -> str:
    return "<tool_call>\n" + json.dumps({"name": "search", "arguments": {"query": query}}) + "\n</tool_call>"


def calc(expression) -> str:
    return (
        "<tool_call>\n"
        + json.dumps({"name": "calculator", "arguments": {"expression": expression}})
        + "\n</tool_call>"
    )


def _row(sc_data, kind: str) -> dict:
    return next(r for r in sc_data.splits["test"].iter_rows(named=True) if r["kind"] == kind)


def _expression(row) -> str:
    msgs = [m for m in json.loads(row["expert"]) if m.get("tool_calls")]
    return msgs[-1]["tool_calls"][0]["function"]["arguments"]["expression"]


def _play(env, row, actions):
    env.reset(row)
    outs = [env.step(a) for a in actions]
    return outs, json.loads(outs[-1].info["task_metrics"])


@pytest.fixture
def env(sc_data_dir):
    return get_task("search_calc").make_env(data_dir=sc_data_dir)


def test_expert_trajectory_scores_every_call(env, sc_data):
    row = _row(sc_data, "founder_age")
    gold = json.loads(row["gold_titles"])
    outs, m = _play(
        env,
        row,
        [search(gold[0]), search(gold[1]), calc(_expression(row)), f"<answer>{row['answer']}</answer>"],
    )
    assert outs[-1].reward == 1.0 and outs[-1].done
    assert env.process_rewards() == [1.0, 1.0, 1.0, None]
    assert m["search_calls"] == 2 and m["search_valid"] == 2 and m["search_right"] == 2
    assert m["calculator_calls"] == 1 and m["calculator_right"] == 1
    assert (m["steps"], m["right_steps"], m["gold_hit"], m["correct"]) == (4, 4, 1.0, 1.0)


def test_useless_repeated_search_and_skipped_calculator(env, sc_data):
    """A search for nothing, the same gold search twice (the second finds nothing new), then the answer
    without the calculator: the answer step needed the calculator, so it is the wrong action."""
    row = _row(sc_data, "age_in")
    name = json.loads(row["gold_titles"])[0]
    outs, m = _play(
        env, row, [search("zzz qqq"), search(name), search(name), f"<answer>{row['answer']}</answer>"]
    )
    assert outs[-1].reward == 1.0  # right, but by mental arithmetic
    assert env.process_rewards() == [0.0, 1.0, 0.0, None]
    assert (m["search_calls"], m["search_right"], m["calculator_calls"]) == (3, 2, 0)
    assert (m["steps"], m["right_steps"]) == (4, 2)


def test_calculator_feeding_the_next_call_is_rewarded(env, sc_data):
    """A calculator call whose result is no answer but appears in the next call's expression scores 1;
    a wrong one scores 0; a right one scores 1."""
    row = _row(sc_data, "population_sum")
    gold = json.loads(row["gold_titles"])
    a, b = (int(x) for x in _expression(row).split(" + "))
    _play(
        env,
        row,
        [
            search(gold[0]),
            search(gold[1]),
            calc(f"{a} + 1"),
            calc(f"{a + 1} + {b - 1}"),
            "<answer>0</answer>",
        ],
    )
    assert env.process_rewards() == [1.0, 1.0, 1.0, 1.0, None]
    _play(env, row, [search(gold[0]), calc("2 + 2"), calc(f"{a} + {b}")])
    assert env.process_rewards() == [1.0, 0.0, 1.0]


@pytest.mark.parametrize(
    "action",
    [
        "<tool_call>{not json</tool_call>",
        '<tool_call>{"name": "calculator", "arguments": {"expression": "__import__(\'os\')"}}</tool_call>',
        '<tool_call>{"name": "calculator", "arguments": {"expression": "9**9**9**9"}}</tool_call>',
        '<tool_call>{"name": "calculator", "arguments": {"expr": "1+1"}}</tool_call>',
        '<tool_call>{"name": "search", "arguments": {"query": ""}}</tool_call>',
        '<tool_call>{"name": "search", "arguments": {"query": 7}}</tool_call>',
        '<tool_call>{"name": "rm", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "search", "arguments": {"query": "' + "x" * 5000 + '"}}</tool_call>',
        "<tool_call>" * 50,
    ],
)
def test_hostile_calls_are_feedback_scored_zero(env, sc_data, action):
    row = _row(sc_data, "age_in")
    outs, m = _play(env, row, [action, "<answer>1</answer>"])
    assert not outs[0].done and outs[0].messages  # feedback, no crash
    assert env.process_rewards() in ([0.0, None], [None, None])
    assert m["search_valid"] + m["calculator_valid"] == 0


def test_mixed_step_scores_the_mean_of_its_calls(env, sc_data):
    row = _row(sc_data, "age_in")
    name = json.loads(row["gold_titles"])[0]
    _play(env, row, [search(name) + "\n" + calc("1 +"), f"<answer>{row['answer']}</answer>"])
    assert env.process_rewards() == [0.5, None]


def test_process_rewards_reach_the_step_rows(sc_data, sc_data_dir):
    """Through the real agent loop: each step row holds its process reward; the recipe's metrics read
    the per-tool numbers; a cut episode keeps its numbers."""
    recipe = get_task("search_calc")
    right, weak = [r for r in sc_data.splits["test"].iter_rows(named=True) if r["kind"] == "age_in"][:2]
    scripts = {
        right["question"]: [
            search(json.loads(right["gold_titles"])[0]),
            calc(_expression(right)),
            f"<answer>{right['answer']}</answer>",
        ],
        weak["question"]: [
            search(json.loads(weak["gold_titles"])[0]),
            search("zzz"),
            search("qqq"),
        ],  # cut at max_steps
    }
    tok = tokenizer()
    episodes = [Episode(r["id"], r["id"], recipe.make_env(r, data_dir=sc_data_dir), r) for r in (right, weak)]
    steps = run_episodes(
        ScriptedEngine(tok, scripts), ChatRenderer(tok, recipe.tools(), EOS_TOKEN), episodes,
        max_steps=3, max_prompt_len=4096, max_response_len=256, temperature=1.0,
    )  # fmt: skip
    assert [s["process_reward"] for s in steps] == [1.0, 1.0, None, 1.0, 0.0, 0.0]
    m = recipe.task_metrics(steps)
    assert m["search/calls_per_episode"] == 2.0 and m["calculator/calls_per_episode"] == 0.5
    assert m["search/right_tool_rate"] == 0.5  # 2 of 4 searches were needed
    assert m["calculator/valid_rate"] == 1.0 and m["calculator/right_tool_rate"] == 1.0
    assert m["right_tool_rate"] == 4 / 6 and m["both_tools_rate"] == 0.5 and m["gold_hit_rate"] == 1.0
