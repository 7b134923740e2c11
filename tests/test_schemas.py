"""TaskSchema / StepSchema and validate_table: good tables pass, bad rows are named by row and column."""

from __future__ import annotations

import polars as pl
import pytest

from components.schemas import ProblemSchema, StepSchema, TaskSchema, validate_table


def task_df(**overrides) -> pl.DataFrame:
    data = {
        "id": ["a", "b", "c"],
        "question": ["What is 1+1?", "What is 2+2?", "What is 3+3?"],
        "answer": ["2", "4", "6"],
        "expert": ['[{"role": "assistant", "content": "<answer>2</answer>"}]', None, None],
        "split": ["train", "val", "test"],
    }
    data.update(overrides)
    return pl.DataFrame(data)


def step_df(**overrides) -> pl.DataFrame:
    data = {
        "traj_id": ["t0", "t0", "t1"],
        "group_id": ["g0", "g0", "g0"],
        "step": [0, 1, 0],
        "obs_key": ["s0", "s1", ""],
        "prompt_ids": [[1, 2, 3], [1, 2, 3, 4, 5], [1, 2]],
        "response_ids": [[4, 5], [6], []],
        "response_logprobs": [[-0.5, -0.1], [-2.0], []],
        "reward": [0.0, 1.0, -0.1],
        "done": [False, True, True],
        "truncated": [False, False, True],
        "feedback": ["60", "", "[prompt longer than max_prompt_len]"],
        "n_calls": [1, 0, 0],  # extra analysis columns are allowed
    }
    data.update(overrides)
    return pl.DataFrame(data)


def test_good_tables_pass_and_keep_extra_columns():
    assert validate_table(task_df(n_calls=[1, 0, 0]), TaskSchema, "t").columns[-1] == "n_calls"
    out = validate_table(step_df(), StepSchema, "s")
    assert out.height == 3 and "n_calls" in out.columns


def test_coercion_of_narrow_dtypes_and_all_null_expert():
    df = step_df().with_columns(
        pl.col("prompt_ids").cast(pl.List(pl.Int32)),
        pl.col("response_logprobs").cast(pl.List(pl.Float32)),
        pl.col("step").cast(pl.Int32),
    )
    out = validate_table(df, StepSchema, "s")
    assert out.schema["prompt_ids"] == pl.List(pl.Int64) and out.schema["response_logprobs"] == pl.List(
        pl.Float64
    )
    out = validate_table(task_df(expert=[None, None, None]), TaskSchema, "t")
    assert out.schema["expert"] == pl.String


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            {"split": ["train", "tst", "test"]},
            "tasks.parquet row 2: column 'split' failed isin(['train', 'val', 'test']) (value: 'tst')",
        ),
        (
            {"question": ["q", "q", ""]},
            "tasks.parquet row 3: column 'question' failed str_length(1, None) (value: '')",
        ),
        (
            {"question": ["q", None, "q"]},
            "tasks.parquet row 2: column 'question' failed not_nullable (value: null)",
        ),
        ({"id": ["a", "b", "a"]}, "tasks.parquet row 1: column 'id' failed field_uniqueness (value: 'a')"),
        ({"answer": [None, "4", "6"]}, "tasks.parquet row 1: column 'answer' failed not_nullable"),
    ],
)
def test_task_schema_rejects_bad_rows(overrides, message):
    with pytest.raises(ValueError) as err:
        validate_table(task_df(**overrides), TaskSchema, "tasks.parquet")
    assert str(err.value).splitlines()[0].startswith(message), str(err.value)


def test_duplicate_ids_report_both_rows():
    with pytest.raises(ValueError) as err:
        validate_table(task_df(id=["a", "b", "a"]), TaskSchema, "x")
    assert "x row 3: column 'id' failed field_uniqueness" in str(err.value)


def test_several_problems_are_counted_and_listed():
    with pytest.raises(ValueError) as err:
        validate_table(task_df(split=["a", "b", "c"]), TaskSchema, "x")
    lines = str(err.value).splitlines()
    assert lines[0].endswith("(and 2 more problems)")
    assert [line.strip()[:5] for line in lines[1:]] == ["x row", "x row"]


def test_missing_column():
    with pytest.raises(ValueError, match=r"^tasks.parquet: missing column\(s\) \['split'\]"):
        validate_table(task_df().drop("split"), TaskSchema, "tasks.parquet")


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            {"step": [0, -1, 0]},
            "rollouts.parquet row 2: column 'step' failed greater_than_or_equal_to(0) (value: '-1')",
        ),
        (
            {"response_logprobs": [[-0.5], [-2.0], []]},
            "rollouts.parquet row 1: column 'response_logprobs' failed len(response_logprobs) == len(response_ids)",
        ),
        (
            {"response_logprobs": [[-0.5, -0.1], [-2.0], [-1.0]]},
            "rollouts.parquet row 3: column 'response_logprobs' failed len(response_logprobs) == len(response_ids)",
        ),
        ({"reward": [0.0, float("inf"), 0.0]}, "rollouts.parquet row 2: column 'reward' failed finite"),
        ({"reward": [0.0, 1.0, float("nan")]}, "rollouts.parquet row 3: column 'reward'"),
        ({"prompt_ids": [[1], None, [2]]}, "rollouts.parquet row 2: column 'prompt_ids' failed not_nullable"),
        ({"done": [True, None, False]}, "rollouts.parquet row 2: column 'done' failed not_nullable"),
        (
            {"response_ids": [["a", "b"], ["c"], []]},
            "rollouts.parquet: column 'response_ids' has dtype List(String)",
        ),
        ({"step": ["0", "one", "2"]}, "rollouts.parquet: column 'step' has dtype String"),
    ],
)
def test_step_schema_rejects_bad_rows(overrides, message):
    with pytest.raises(ValueError) as err:
        validate_table(step_df(**overrides), StepSchema, "rollouts.parquet")
    assert str(err.value).splitlines()[0].startswith(message), str(err.value)


def test_step_schema_missing_columns():
    with pytest.raises(ValueError, match=r"missing column\(s\) \['response_logprobs', 'feedback'\]"):
        validate_table(step_df().drop("response_logprobs", "feedback"), StepSchema, "r")
    with pytest.raises(ValueError, match=r"missing column\(s\) \['obs_key'\]"):
        validate_table(step_df().drop("obs_key"), StepSchema, "r")


# --- ProblemSchema (per-problem evaluation results) ---------------------------------------------------


def problem_df(**overrides) -> pl.DataFrame:
    data = {
        "id": ["a", "b", "c"],
        "correct": [1, 0, 1],
        "sampled_correct": [0.5, 0.0, 1.0],
        "n_sampled": [2, 2, 2],
        "return": [10.8, -1.0, 10.9],
        "turns": [2, 10, 1],
    }
    data.update(overrides)
    return pl.DataFrame(data)


def test_problem_schema_accepts_results_with_and_without_samples():
    assert validate_table(problem_df(), ProblemSchema, "p").height == 3
    greedy_only = problem_df(sampled_correct=[None, None, None], n_sampled=[0, 0, 0])
    assert validate_table(greedy_only, ProblemSchema, "p")["sampled_correct"].null_count() == 3


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            {"correct": [1, 2, 0]},
            "problems_grpo-s0.parquet row 2: column 'correct' failed isin([0, 1]) (value: '2')",
        ),
        (
            {"id": ["a", "b", "a"]},
            "problems_grpo-s0.parquet row 1: column 'id' failed field_uniqueness (value: 'a')",
        ),
        (
            {"sampled_correct": [0.5, 1.5, 0.0]},
            "problems_grpo-s0.parquet row 2: column 'sampled_correct' failed less_than_or_equal_to(1) (value: '1.5')",
        ),
        (
            {"sampled_correct": [0.5, None, 0.0]},
            "problems_grpo-s0.parquet row 2: column 'sampled_correct' failed null exactly when n_sampled == 0 (value: null)",
        ),
        (
            {"turns": [2, 0, 1]},
            "problems_grpo-s0.parquet row 2: column 'turns' failed greater_than_or_equal_to(1) (value: '0')",
        ),
        (
            {"n_sampled": [2, 0, 2]},
            "problems_grpo-s0.parquet row 2: column 'sampled_correct' failed null exactly when n_sampled == 0 (value: '0.0')",
        ),
    ],
)
def test_problem_schema_rejects_bad_rows(overrides, message):
    with pytest.raises(ValueError) as err:
        validate_table(problem_df(**overrides), ProblemSchema, "problems_grpo-s0.parquet")
    assert str(err.value).splitlines()[0].startswith(message), str(err.value)


def test_process_reward_column_is_optional_nullable_and_typed():
    assert "process_reward" not in validate_table(step_df(), StepSchema, "s").columns
    out = validate_table(step_df().with_columns(process_reward=pl.lit(None)), StepSchema, "s")
    assert out.schema["process_reward"] == pl.Float64
    with pytest.raises(ValueError, match="process_reward"):
        validate_table(step_df().with_columns(process_reward=pl.lit("x")), StepSchema, "s")


def test_policy_version_column_is_optional_and_a_version():
    """rollout.staleness >= 1 writes each step's policy version; a synchronous run's table has none."""
    assert "policy_version" not in validate_table(step_df(), StepSchema, "s").columns
    out = validate_table(step_df(policy_version=[0, 0, 3]), StepSchema, "s")
    assert out["policy_version"].to_list() == [0, 0, 3] and out.schema["policy_version"].is_integer()
    with pytest.raises(ValueError) as err:
        validate_table(step_df(policy_version=[0, -1, 0]), StepSchema, "rollouts.parquet")
    assert str(err.value).startswith("rollouts.parquet row 2: column 'policy_version' failed"), str(err.value)
    with pytest.raises(ValueError, match="policy_version"):
        validate_table(step_df(policy_version=["a", "b", "c"]), StepSchema, "s")
