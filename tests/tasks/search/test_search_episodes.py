"""Search episodes through the real agent loop (scripted engine): the env's per-episode numbers reach
the step records, and the recipe's episode_metrics hook reads them."""

from __future__ import annotations

import json

from components.agent.loop import Episode, run_episodes
from components.agent.render import ChatRenderer
from components.envs import get_task
from components.model.tokenizer import EOS_TOKEN
from tests.agent.agent_helpers import ScriptedEngine, tokenizer


def call(query: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "search", "arguments": {"query": query}}) + "\n</tool_call>"


def test_metrics_of_scripted_episodes(small_data, small_data_dir):
    recipe = get_task("search")
    rows = [r for r in small_data.splits["test"].iter_rows(named=True) if r["n_hops"] == 2][:2]
    right, wrong = rows
    gold = json.loads(right["gold_titles"])
    scripts = {
        right["question"]: [call(gold[0]), call(gold[1]), f"<answer>{right['answer']}</answer>"],
        # one useless search, then a wrong answer sharing no token with the truth
        wrong["question"]: [call("nothing here"), "<answer>zzz</answer>"],
    }
    tok = tokenizer()
    renderer = ChatRenderer(tok, recipe.tools(), EOS_TOKEN)
    episodes = [Episode(r["id"], r["id"], recipe.make_env(r, data_dir=small_data_dir), r) for r in rows]
    steps = run_episodes(
        ScriptedEngine(tok, scripts),
        renderer,
        episodes,
        max_steps=4,
        max_prompt_len=4096,
        max_response_len=256,
        temperature=1.0,
    )
    assert [s["task_metrics"] != "" for s in steps] == [False, False, True, False, True]
    assert recipe.task_metrics(steps) == {
        "em": 0.5,
        "f1": 0.5,
        "queries_per_episode": 1.5,
        "gold_hit_rate": 0.5,  # 2 of 2 gold passages, and 0 of 2 (nothing here finds neither)
    }
