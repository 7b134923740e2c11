"""The verifiers task: environments written in the tests (vf_envs/) through the adapter and steprl's
agent loop (a scripted engine), every way an episode ends, and the bad input refused before any work.

The Mastermind environment of the repo (TextArena) is in test_mastermind.py.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from components.agent.loop import Episode, run_episodes
from components.agent.render import ChatRenderer
from components.envs import get_task
from components.model.tokenizer import EOS_TOKEN
from components.tasks.verifiers.loader import load
from components.tasks.verifiers.params import VerifiersParams
from components.tasks.verifiers.recipe import episode_metrics, make_env, make_splits
from tests.agent.agent_helpers import ScriptedEngine, tokenizer

ENVS = "tests.tasks.verifiers_task.vf_envs"
GUESS = f"{ENVS}.guess"
LOOSE = dict(max_steps=6, max_prompt_len=4096, max_response_len=128, temperature=1.0, seed=3)


def splits(env: str = GUESS, **kw):
    p = VerifiersParams(
        env=env, max_turns=kw.pop("max_turns", 5), turn_timeout_s=kw.pop("turn_timeout_s", 30.0)
    )
    sizes = dict(n_train=kw.pop("n_train", 2), n_val=kw.pop("n_val", 1), n_test=kw.pop("n_test", 1))
    return p, make_splits(p, seed=0, root=Path("."), **sizes, **kw)


def tool_call(x: int) -> str:
    return "<tool_call>\n" + json.dumps({"name": "double", "arguments": {"x": x}}) + "\n</tool_call>"


@pytest.fixture(scope="module")
def tok():
    return tokenizer()


def rollout(tok, p, rows, scripts, max_steps=6):
    """Play ``rows`` through the loop with ``scripts`` (prompt text -> replies); (steps, renderer, envs)."""
    envs = [make_env() for _ in rows]
    renderer = ChatRenderer(tok, envs[0].tools, EOS_TOKEN)
    engine = ScriptedEngine(tok, scripts)
    eps = [Episode(f"{r['id']}-0", r["id"], env, r) for r, env in zip(rows, envs)]
    steps = run_episodes(engine, renderer, eps, **{**LOOSE, "max_steps": max_steps})
    return steps, renderer, envs


# --- the environment written in the tests, through the loop -------------------------------------


def test_multi_turn_tool_and_rubric_through_the_loop_token_for_token(tok):
    p, s = splits()
    questions = [q for split in ("train", "val", "test") for q in s[split]["question"].to_list()]
    assert sorted(questions) == [f"Guess my digit, game {i}." for i in range(4)]  # shuffled, cut by seed
    assert s["train"]["expert"].to_list() == [None, None]  # the module has no expert_policy
    row = s["train"].row(0, named=True)
    secret = json.loads(row["task"])["info"]["secret"]
    wrong = 9 if secret != 9 else 1
    replies = [tool_call(4), str(wrong), str(secret)]
    steps, renderer, envs = rollout(tok, p, [row], {row["question"]: replies})

    assert [st["step"] for st in steps] == [0, 1, 2]
    assert steps[0]["feedback"] == "8" and steps[0]["n_calls"] == 1  # the tool's answer
    assert steps[1]["feedback"] == ("higher" if wrong < secret else "lower")  # the env's own turn
    # continuity: each step's prompt is the last one + its sampled ids + the rendered observation
    observations = [
        [{"role": "tool", "name": "double", "content": "8"}],
        [{"role": "user", "content": steps[1]["feedback"]}],
    ]
    for t in (0, 1):
        assert steps[t + 1]["prompt_ids"] == (
            steps[t]["prompt_ids"] + steps[t]["response_ids"] + renderer.observation(observations[t])
        )
    last = steps[-1]
    assert last["done"] and not last["truncated"] and last["correct"]
    # the rubric: found (1, weight 1) + brevity (1 / 2 guesses, weight 0.5)
    assert last["reward"] == pytest.approx(1.0 + 0.5 * 0.5)
    numbers = json.loads(last["task_metrics"])
    assert (
        numbers["reward/found"] == 1.0
        and numbers["reward/brevity"] == 0.5
        and numbers["metric/guesses"] == 2.0
    )
    trace = envs[0].trace
    assert trace.last_reply == str(secret) and trace.num_turns == 3  # the vf.Trace holds the conversation
    metrics = episode_metrics(steps)
    assert metrics["reward/found"] == 1.0 and metrics["error/env_raised"] == 0.0


def test_max_turns_ends_the_exchange_and_the_rubric_still_scores(tok):
    p, s = splits(max_turns=2)
    row = s["test"].row(0, named=True)
    steps, _, _ = rollout(tok, p, [row], {row["question"]: ["0", "0", "0"]})
    assert len(steps) == 2
    last = steps[-1]
    assert last["done"] and last["truncated"] and not last["correct"]
    numbers = json.loads(last["task_metrics"])
    assert numbers["stop/max_turns"] == 1.0 and numbers["reward/found"] == 0.0
    assert last["reward"] == pytest.approx(0.5 * 0.5)  # brevity of 2 guesses


def test_a_bad_tool_call_is_feedback_not_a_crash(tok):
    _, s = splits()
    env = make_env()
    row = s["test"].row(0, named=True)
    env.reset(row)
    out = env.step('<tool_call>\n{"name": "double", "arguments": {"x": "many"}}\n</tool_call>')
    assert not out.done and out.messages[0]["content"].startswith("error:")
    out = env.step("<tool_call>\nnot json\n</tool_call>")
    assert not out.done and out.info["format_error"]


@pytest.mark.parametrize(
    "env,reason",
    [("raising", "env_raised"), ("malformed", "malformed_message"), ("endless", "turn_after_end")],
)
def test_a_failing_env_ends_its_episode_with_a_named_error_and_the_run_goes_on(tok, env, reason):
    """Beside a healthy episode of the guess env in the same batch: that one is scored as usual."""
    p, s = splits(env=f"{ENVS}.{env}", max_turns=3)
    bad_row = s["test"].row(0, named=True)
    bad = VerifiersEnv_for(p)
    good = VerifiersEnv_for(VerifiersParams(env=GUESS, max_turns=5))
    good_row = dict(bad_row, id="good")
    secret = json.loads(good_row["task"])["info"]["secret"]
    renderer = ChatRenderer(tok, bad.tools, EOS_TOKEN)
    engine = ScriptedEngine(tok, {bad_row["question"]: [str(secret)] * 6})
    eps = [Episode("bad-0", "bad", bad, bad_row), Episode("good-0", "good", good, good_row)]
    steps = run_episodes(engine, renderer, eps, **LOOSE)
    bad_steps = [st for st in steps if st["traj_id"] == "bad-0"]
    good_steps = [st for st in steps if st["traj_id"] == "good-0"]
    last = bad_steps[-1]
    assert last["done"] and last["reward"] == 0.0 and not last["correct"]
    assert json.loads(last["task_metrics"])[f"error/{reason}"] == 1.0
    assert good_steps[-1]["correct"] and good_steps[-1]["reward"] > 1.0
    assert episode_metrics(steps)[f"error/{reason}"] == 0.5


def VerifiersEnv_for(p: VerifiersParams):
    from components.tasks.verifiers.adapter import VerifiersEnv

    return VerifiersEnv(load(p.env, p.args), max_turns=p.max_turns, turn_timeout_s=p.turn_timeout_s)


def test_an_env_that_stops_answering_times_out_with_a_named_error():
    import asyncio

    _, s = splits()
    env = VerifiersEnv_for(VerifiersParams(env=GUESS, turn_timeout_s=0.5))
    env.reset(s["test"].row(0, named=True))
    env._run.inbox = asyncio.Queue()  # the reply goes nowhere: the env never answers
    out = env.step("1")
    assert out.done and out.info["error"] == "env_timeout" and out.reward == 0.0


# --- bad input, before any work -------------------------------------------------------------------


def test_an_environment_that_is_not_installed_names_the_package_and_the_install_command():
    with pytest.raises(
        ValueError, match=r"'vf-no-such-env' is not installed .*uv pip install vf-no-such-env"
    ):
        load("vf-no-such-env")
    with pytest.raises(ValueError, match=r"no module 'tests.tasks.verifiers_task.vf_envs.nothing'"):
        load(f"{ENVS}.nothing")


def test_unsupported_classes_are_named_with_the_supported_ones():
    with pytest.raises(
        ValueError,
        match=r"TwoSeatEnv declares 2 agent seats \['solver', 'judge'\].*Supported: SingleAgentEnv",
    ):
        load(f"{ENVS}.two_seats")


def test_a_task_without_a_needed_column_is_named_with_its_row():
    p = VerifiersParams(env=f"{ENVS}.no_prompt")
    with pytest.raises(ValueError, match=r"task 1 \(empty\) has no 'prompt'"):
        make_splits(p, seed=0, n_train=1, n_val=0, n_test=1, root=Path("."))


def test_taskset_args_are_validated_naming_the_key():
    with pytest.raises(ValueError, match=r"(?s)tasks.verifiers.args: .*secrets"):
        load(GUESS, {"secrets": "many"})
    with pytest.raises(ValueError, match=r"(?s)tasks.verifiers.args: .*no_such_key"):
        load(GUESS, {"no_such_key": 1})


def test_too_few_tasks_for_the_splits():
    with pytest.raises(ValueError, match=r"has 4 tasks, fewer than .* = 5"):
        splits(n_train=3, n_val=1, n_test=1)


def test_params_section_rejects_unknown_keys_and_the_recipe_is_registered():
    with pytest.raises(ValidationError, match="no_such_key"):
        VerifiersParams.model_validate({"no_such_key": 1})
    with pytest.raises(ValidationError):
        VerifiersParams.model_validate({"max_turns": 0})
    recipe = get_task("verifiers")
    assert recipe.params({"env": GUESS}).env == GUESS
    assert [t["function"]["name"] for t in recipe.tools()] == ["double"]  # the last validated section's


# --- a real rollout: a random tiny Qwen3 on the hf engine ----------------------------------------


def test_a_real_model_plays_the_guess_env_token_for_token(tok, tmp_path):
    """Whatever a random model writes (tool-call markup, digits, garbage), every episode ends scored
    or at max turns, no error, and each step's prompt continues the last one token for token."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from components.rollout.hf_engine import HFEngine

    eos = tok.convert_tokens_to_ids(EOS_TOKEN)
    config = Qwen3Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                         max_position_embeddings=4096, eos_token_id=eos, pad_token_id=0)  # fmt: skip
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).save_pretrained(tmp_path)
    engine = HFEngine(str(tmp_path), stop_token_ids=[eos])
    p, s = splits(max_turns=3)
    rows = list(s["train"].iter_rows(named=True)) + list(s["test"].iter_rows(named=True))
    envs = [VerifiersEnv_for(p) for _ in rows]
    renderer = ChatRenderer(tok, envs[0].tools, EOS_TOKEN)
    eps = [Episode(f"{r['id']}-{k}", r["id"], env, r) for k, (r, env) in enumerate(zip(rows, envs))]
    steps = run_episodes(engine, renderer, eps, **{**LOOSE, "max_steps": 3, "max_response_len": 12})
    by_traj: dict[str, list[dict]] = {}
    for st in steps:
        by_traj.setdefault(st["traj_id"], []).append(st)
    assert len(by_traj) == len(rows)
    for traj in by_traj.values():
        assert traj[-1]["done"]
        numbers = json.loads(traj[-1]["task_metrics"]) if traj[-1]["task_metrics"] else {}
        assert not any(k.startswith("error/") for k in numbers), numbers
        for a, b in itertools.pairwise(traj):
            assert (
                b["prompt_ids"][: len(a["prompt_ids"]) + len(a["response_ids"])]
                == a["prompt_ids"] + a["response_ids"]
            )
