"""Demonstrations replayed through the real environment, the episode metrics hook, the recipe."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from components.envs import get_task
from components.envs.parsing import format_tool_call
from components.schemas import TaskSchema, validate_table
from components.tasks.search import demonstrations, episode_metrics, make_env


def replay(env, row, messages):
    """Feed a demonstration's assistant turns to the env; check tool messages match; final outcome."""
    env.reset(row)
    out = None
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        if m.get("tool_calls"):
            fn = m["tool_calls"][0]["function"]
            out = env.step(format_tool_call(fn["name"], fn["arguments"]))
            assert out.messages == [messages[i + 1]], row["id"]
        else:
            out = env.step(m["content"])
    return out


def test_every_expert_scores_one_with_every_gold_passage_found(small_data, small_data_dir):
    env = make_env(data_dir=small_data_dir)
    for split, df in small_data.splits.items():
        for row in df.iter_rows(named=True):
            out = replay(env, row, demonstrations(row)[0])
            assert out.done and out.reward == 1.0, (split, row["id"])
            m = json.loads(out.info["task_metrics"])
            assert m == {"em": 1.0, "f1": 1.0, "n_queries": float(row["n_hops"]), "gold_hit": 1.0}


def test_weak_demonstrations_score_one_without_searching(small_data, small_data_dir):
    env = make_env(data_dir=small_data_dir)
    train = small_data.splits["train"]
    rows = [r for r in train.iter_rows(named=True) if r["weak"]]
    assert rows
    for row in rows:
        for demo in demonstrations(row)[1:]:
            out = replay(env, row, demo)
            assert out.reward == 1.0
            assert json.loads(out.info["task_metrics"])["gold_hit"] == 0.0


def test_env_reads_the_tool_settings_saved_with_the_index(small_data, tmp_path):
    from components.tasks.search.params import save_index

    save_index(small_data.index, tmp_path, top_k=1, max_result_chars=80)
    env = make_env(data_dir=tmp_path)
    env.reset({"id": "x", "question": "q", "answer": "a"})
    out = env.step(format_tool_call("search", {"query": small_data.kb.of_kind("city")[0].name}))
    assert "\n" not in out.messages[0]["content"] and len(out.messages[0]["content"]) <= 80
    with pytest.raises(ValueError, match="data_dir"):
        make_env()


def step(traj, n_valid=0, metrics=None):
    return {"traj_id": traj, "n_valid_calls": n_valid, "task_metrics": json.dumps(metrics) if metrics else ""}


def test_episode_metrics_by_hand():
    steps = [
        step("a", 1),
        step("a", 1),
        step("a", 0, {"em": 1.0, "f1": 1.0, "n_queries": 2.0, "gold_hit": 1.0}),
        step("b", 0, {"em": 0.0, "f1": 0.5, "n_queries": 0.0, "gold_hit": 0.0}),
        step("c", 1),  # cut before answering: EM 0, F1 0, 1 query, no hit rate
        step("d", 0, {"em": 0.0, "f1": 0.0, "n_queries": 1.0, "gold_hit": None}),  # no gold passages
    ]
    assert episode_metrics(steps) == {
        "em": pytest.approx(1 / 4),
        "f1": pytest.approx(1.5 / 4),
        "queries_per_episode": pytest.approx(4 / 4),
        "gold_hit_rate": pytest.approx(1 / 2),
    }
    with pytest.raises(ValueError, match="traj_id"):
        episode_metrics([{"step": 0}])


def test_recipe_prepare_writes_the_index_and_validates(tmp_path):
    recipe = get_task("search")
    section = {"n_entities": 40, "max_hops": 2}
    splits = recipe.make_splits(
        recipe.params(section), seed=0, n_train=30, n_val=5, n_test=5, root=Path.cwd(), data_dir=tmp_path
    )
    for name, df in splits.items():
        validate_table(df, TaskSchema, name)
    assert (tmp_path / "index" / "passages.parquet").is_file()
    row = splits["test"].row(0, named=True)
    assert replay(recipe.make_env(row, data_dir=tmp_path), row, recipe.expert_messages(row)).reward == 1.0


@pytest.mark.parametrize(
    "section, key",
    [
        ({"min_hops": 3, "max_hops": 2}, "min_hops"),
        ({"top_k": 0}, "top_k"),
        ({"n_entities": 5000}, "n_entities"),
        ({"corpus_path": "c.jsonl"}, "questions_path"),
        ({"hops": 2}, "hops"),
    ],
)
def test_params_section_errors_name_the_key(section, key):
    with pytest.raises(ValidationError, match=key):
        get_task("search").params(section)


def test_missing_questions_file_names_the_key(tmp_path):
    recipe = get_task("search")
    with pytest.raises(ValueError, match="tasks.search.questions_path"):
        recipe.make_splits(
            recipe.params({"questions_path": "nope.jsonl"}),
            seed=0,
            n_train=1,
            n_val=1,
            n_test=1,
            root=tmp_path,
        )
