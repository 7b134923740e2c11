"""params.yaml profiles: keys checked at load, values when applied, and the dvc command they become."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path

import pytest
import yaml

from components.config import ConfigError, load_params, parse_params
from flows.repro import params_drift, profile_command, set_param_keys, warn_params_drift

REPO = Path(__file__).resolve().parents[1]
RAW = yaml.safe_load((REPO / "params.yaml").read_text())


def with_profiles(profiles: dict) -> dict:
    out = copy.deepcopy(RAW)
    out["profiles"] = profiles
    return out


def test_shipped_sokoban_profile_is_valid_when_applied():
    p = load_params(REPO / "params.yaml", overrides=RAW["profiles"]["sokoban"])
    assert p.task == "sokoban" and p.rollout.max_steps >= p.task_params.max_moves
    assert p.compare.algorithms == ["grpo", "ppo", "steppo", "gigpo"] and len(p.compare.seeds) >= 3


def test_shipped_babyai_profile_is_valid_when_applied():
    p = load_params(REPO / "params.yaml", overrides=RAW["profiles"]["babyai"])
    assert p.task == "babyai" and p.rollout.max_steps >= p.task_params.max_moves
    assert p.rollout.context_window is not None  # the observation is the state: short prompts
    assert p.compare.algorithms == ["grpo", "ppo", "steppo", "gigpo"] and len(p.compare.seeds) >= 3


@pytest.mark.parametrize("profile", ["sokoban", "babyai"])
def test_shipped_profiles_warm_the_critic_up(profile):
    """PPO and StepPO of each comparison start from a fitted critic, not a cold one."""
    p = load_params(REPO / "params.yaml", overrides=RAW["profiles"][profile])
    assert p.critic_warmup.episodes > 0 and p.train.critic_lr == p.critic_warmup.lr


@pytest.mark.parametrize("profile", ["sokoban", "code"])
def test_profiles_at_t04_run_one_update_behind_with_a_correction(profile):
    """The profiles sample their training rollouts at T=0.4; the engines report that distribution's
    log-probs, so staleness 1 with tis (and pi_old from the rollout) load there."""
    stale = {
        "rollout.staleness": 1,
        **{f"algorithms.{a}.correction": "tis" for a in ("grpo", "ppo", "steppo", "gigpo")},
    }
    p = load_params(REPO / "params.yaml", overrides={**RAW["profiles"][profile], **stale})
    assert p.train.temperature == 0.4 and p.rollout.staleness == 1
    assert p.staleness_problem("grpo") is None
    p = load_params(
        REPO / "params.yaml", overrides={**RAW["profiles"][profile], "train.old_logprobs": "rollout"}
    )
    assert p.train.old_logprobs == "rollout" and p.train.temperature == 0.4


def test_unknown_profile_key_is_named_at_load():
    with pytest.raises(ConfigError, match=r"profiles\.x: 'rollout\.max_stepz' is not a params key"):
        parse_params(with_profiles({"x": {"rollout.max_stepz": 3}}))
    with pytest.raises(ConfigError, match=r"profiles\.x: Input should be a valid dictionary"):
        parse_params(with_profiles({"x": ["task=calc"]}))
    # keys inside free-form sections are checked when the profile is applied
    assert parse_params(with_profiles({"x": {"tasks.sokoban.max_moves": 8}})).profiles["x"]


def test_invalid_values_fail_when_applied(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(with_profiles({"short": {"task": "sokoban", "rollout.max_steps": 3}})))
    with pytest.raises(ConfigError, match=r"rollout\.max_steps=3 < 10"):
        profile_command("short", [], path)
    with pytest.raises(ConfigError, match=r"profiles\.nope: no such profile \(known: \['short'\]\)"):
        profile_command("nope", [], path)


def test_profile_becomes_dvc_exp_run_with_json_values():
    cmd = profile_command("sokoban", ["-S", "sft.steps=10"], REPO / "params.yaml")
    assert cmd[:3] == ["dvc", "exp", "run"] and cmd[-2:] == ["-S", "sft.steps=10"]
    sets = dict(cmd[i + 1].split("=", 1) for i in range(3, len(cmd) - 2, 2))
    assert sets["task"] == '"sokoban"' and sets["rollout.max_steps"] == "10"
    assert sets["compare.algorithms"] == '["grpo", "ppo", "steppo", "gigpo"]'


def test_missing_task_settings_point_at_the_profile():
    with pytest.raises(ConfigError, match=r"python -m flows\.repro --profile sokoban"):
        load_params(REPO / "params.yaml", overrides={"task": "sokoban"})


def test_shipped_code_profile_is_valid_when_applied():
    p = load_params(REPO / "params.yaml", overrides=RAW["profiles"]["code"])
    assert p.task == "code" and p.rollout.max_steps >= p.task_params.turns_needed()
    assert p.compare.algorithms == ["grpo", "ppo", "steppo", "gigpo"] and len(p.compare.seeds) >= 3


@pytest.mark.parametrize("profile", sorted(RAW["profiles"]))
def test_every_profile_key_is_in_params_yaml(profile):
    """`dvc exp run -S key=value` only overrides a key params.yaml has (a new one needs Hydra's `+`),
    so a profile may set only keys written out there (as `loss_agg: null`, the preset's, is)."""
    missing = []
    for key in RAW["profiles"][profile]:
        node = RAW
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                missing.append(key)
                break
            node = node[part]
    assert not missing, f"profiles.{profile} sets keys params.yaml does not have: {missing}"


def test_values_left_by_an_earlier_experiment_are_named():
    """`dvc exp run -S tasks.sokoban.repeat_hint=true` leaves the value in params.yaml; the next
    profile run, which does not set that key, keeps it: the drift names it, and not the keys the run
    sets (the profile's or a -S, or a section above one), nor anything under profiles."""
    committed = copy.deepcopy(RAW)
    current = copy.deepcopy(RAW)
    current["tasks"]["sokoban"]["repeat_hint"] = True  # left by the earlier experiment
    current["sft"]["steps"] = 7  # set by this run's -S
    current["rollout"]["context_window"] = 9  # set by the profile
    current["profiles"]["sokoban"]["sft.lr"] = 0.5  # a profile's own text is not a run's value
    current["critic_warmup"]["new_key"] = 1  # a key the commit does not have
    set_keys = {*RAW["profiles"]["sokoban"], "sft.steps"}
    assert params_drift(current, committed, set_keys) == [
        "critic_warmup.new_key = 1 (committed: absent)",
        "tasks.sokoban.repeat_hint = true (committed: false)",
    ]
    assert params_drift(current, committed, set_keys | {"tasks.sokoban", "critic_warmup"}) == []
    assert params_drift(committed, copy.deepcopy(RAW), set()) == []


@pytest.mark.parametrize(
    "spelling",
    [
        ["-S", "sft.steps=7"],
        ["-S", "params.yaml:sft.steps=7"],
        ["-S", "./params.yaml:sft.steps=7"],
        ["-Ssft.steps=7"],
        ["--set-param", "sft.steps=7"],
        ["--set-param", "params.yaml:sft.steps=7"],
        ["--set-param=sft.steps=7"],
        ["--set-param=params.yaml:sft.steps=7"],
        ["-S", "++sft.steps=7"],
    ],
)
def test_a_key_the_run_sets_is_not_drift_in_any_of_dvc_s_spellings(spelling, tmp_path, capsys):
    """Every way `dvc exp run` takes a param: the warning before a profile run names the key left
    by an earlier experiment (sft.lr), not the one this run sets (sft.steps)."""
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(RAW))
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run([*git, "add", "params.yaml"], cwd=tmp_path, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "params"], cwd=tmp_path, check=True)
    now = copy.deepcopy(RAW)
    now["sft"]["steps"], now["sft"]["lr"] = 7, 0.5
    params.write_text(yaml.safe_dump(now))
    assert set_param_keys(["dvc", "exp", "run", *spelling]) == {"sft.steps"}
    warn_params_drift(["dvc", "exp", "run", "-S", "seed=1", *spelling], params)
    warning = capsys.readouterr().err
    assert "sft.lr = 0.5" in warning and "sft.steps" not in warning, warning


def test_another_file_s_params_are_not_params_yaml_s():
    command = ["dvc", "exp", "run", "-S", "other.yaml:sft.steps=7", "--set-param", "sub/params.yaml:seed=1"]
    assert set_param_keys(command) == set()
    assert set_param_keys(["dvc", "exp", "run", "-S", "~sft.rows", "-S", "+tasks.calc.x=1"]) == {
        "sft.rows",
        "tasks.calc.x",
    }
