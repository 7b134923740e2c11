"""An RL prompt pool smaller than an iteration asks for is said, not silently obeyed (flows.train)."""

from __future__ import annotations

from components.config import parse_params
from flows.train import algo_params, prompt_pool_note, prompts_per_iteration
from flows.train_settings import group_filter
from tests.test_config import RAW


def _params(**train):
    params = parse_params(RAW)
    return params.model_copy(update={"train": params.train.model_copy(update=train)})


def test_a_pool_smaller_than_a_batch_is_said():
    params = _params(trajectories_per_iteration=64)
    spp = params.algorithms["grpo"].samples_per_prompt
    need = prompts_per_iteration(params, "grpo")
    assert need == 64 // spp
    assert prompt_pool_note(params, "grpo", pool=need) is None
    note = prompt_pool_note(params, "grpo", pool=need - 1)
    assert f"asks for {need} prompts per iteration" in note
    assert (
        f"holds {need - 1}: each iteration plays {need - 1} prompts, {(need - 1) * spp} trajectories" in note
    )


def test_dynamic_samplings_rounds_beyond_the_pool_are_said():
    params = _params(trajectories_per_iteration=64, dynamic_sampling=True, dynamic_sampling_rounds=3)
    need = prompts_per_iteration(params, "grpo")
    note = prompt_pool_note(params, "grpo", pool=need)
    assert f"up to {3 * need} prompt groups per iteration, the RL prompt pool holds {need}" in note
    assert prompt_pool_note(params, "grpo", pool=3 * need) is None


def test_an_algorithms_own_dynamic_sampling_sets_its_runs_filter_and_is_named():
    params = parse_params(RAW)
    grpo = params.algorithms["grpo"].model_copy(update={"dynamic_sampling": True})
    params = params.model_copy(update={"algorithms": {**params.algorithms, "grpo": grpo}})
    params = params.model_copy(
        update={"train": params.train.model_copy(update={"trajectories_per_iteration": 64})}
    )
    assert group_filter(params, "grpo").dynamic and not group_filter(params, "ppo").dynamic
    # MLflow's algo.dynamic_sampling is what the run does, not the null of an unset key
    assert algo_params(params, "grpo", 0)["algo.dynamic_sampling"] is True
    assert algo_params(params, "ppo", 0)["algo.dynamic_sampling"] is False
    need = prompts_per_iteration(params, "grpo")
    assert prompt_pool_note(params, "grpo", pool=need).startswith(
        "algorithms.grpo.dynamic_sampling may sample"
    )
