"""compare.seeds (RL seeds of the train/evaluate matrix) and the run names built from it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from components.config import CompareParams, ConfigError, load_params, parse_params

PARAMS = Path(__file__).resolve().parents[1] / "params.yaml"


def test_params_yaml_has_one_rl_seed_and_three_named_runs():
    # one seed on the default since issue 72 (the ten-minute first run); profile `full` keeps two
    p = load_params(PARAMS)
    raw = yaml.safe_load(PARAMS.read_text())
    assert p.compare.seeds == raw["compare"]["seeds"] == [0]
    assert [name for _, _, name in p.compare.runs()] == ["grpo-s0", "ppo-s0", "steppo-s0"]
    assert raw["profiles"]["full"]["compare.seeds"] == [0, 1]
    assert CompareParams.run_name("grpo", 1) == "grpo-s1"
    assert CompareParams().seeds == [0, 1]  # the default when the key is left out


@pytest.mark.parametrize(
    "seeds, words",
    [
        ([], ["compare", "seeds=[]", "at least one"]),
        ([0, 1, 0], ["compare", "seeds=[0, 1, 0]", "repeats 0", "unique"]),
        ([2, -1], ["compare", "seeds=[2, -1]", ">= 0"]),
        ([0, "one"], ["compare.seeds.1", "'one'"]),
        ([0, 1.5], ["compare.seeds.1", "1.5"]),
        (3, ["compare.seeds", "list"]),
    ],
)
def test_bad_seeds_name_the_key(seeds, words):
    with pytest.raises(ConfigError) as err:
        parse_params({"task": "calc", "compare": {"seeds": seeds}})
    for w in words:
        assert w in str(err.value), (w, str(err.value))


def test_seeds_override_from_the_command_line_form():
    p = load_params(PARAMS, overrides={"compare.seeds": [3, 7, 11]})
    assert [name for a, s, name in p.compare.runs() if a == "grpo"] == ["grpo-s3", "grpo-s7", "grpo-s11"]
