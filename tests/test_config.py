"""components/config.py on the real params.yaml and on bad files: every error names the key path and value."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pydantic
import pytest
import yaml

from components.config import AlgoParams, ConfigError, Params, load_params, parse_params

PARAMS = Path(__file__).resolve().parents[1] / "params.yaml"
RAW = yaml.safe_load(PARAMS.read_text())

# AlgoParams fields params.yaml leaves out on purpose: null/default overrides of a preset, described in
# the comment above `algorithms:` ("estimator, policy_loss, loss_agg ... dual-clip constant").
OPTIONAL_ALGO_KEYS = {
    "estimator",
    "policy_loss",
    "loss_agg",
    "clip_ratio_c",
    "step_weight",
    "step_norm",
    "dynamic_sampling",
}


def raw(**changes) -> dict:
    """A deep copy of params.yaml with dotted keys set (``raw(**{"sft.lr": 1})``)."""
    out = copy.deepcopy(RAW)
    for dotted, value in changes.items():
        node = out
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def error_of(data: dict) -> str:
    with pytest.raises(ConfigError) as info:
        parse_params(data)
    return str(info.value)


# --- the real file ------------------------------------------------------------------------------


def test_real_params_load_and_match_the_file():
    p = load_params(PARAMS)
    assert isinstance(p, Params)
    assert p.task == RAW["task"] and p.seed == RAW["seed"]
    assert p.sft.lr == RAW["sft"]["lr"] and p.rollout.max_steps == RAW["rollout"]["max_steps"]
    assert (
        set(p.algorithms) == set(RAW["algorithms"]) and p.compare.algorithms == RAW["compare"]["algorithms"]
    )
    with pytest.raises(pydantic.ValidationError):  # frozen: a stage cannot change its params
        p.sft.lr = 1.0  # type: ignore[misc]


def _leaf_paths(node, prefix=""):
    for k, v in node.items():
        if isinstance(v, dict):
            yield from _leaf_paths(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}"


def test_every_config_field_is_in_params_yaml():
    """Config is documentation: a field added to config.py but not to params.yaml is undocumented."""
    in_file = set(_leaf_paths(RAW))
    in_model = set(_leaf_paths(load_params(PARAMS).model_dump()))
    # left out of the dump at their defaults (RolloutParams._dump, TrainParams._dump)
    in_model |= {"rollout.staleness", "rollout.partial", "rollout.partial_pool", "rollout.engine_cpus"}
    in_model |= {"rollout.inflight_updates", "rollout.own_process"}
    in_model |= {"train.threads"}
    missing = {
        k
        for k in in_model - in_file
        if not (k.startswith("algorithms.") and k.split(".")[-1] in OPTIONAL_ALGO_KEYS)
    }
    assert missing == set()
    assert in_file <= in_model
    assert set(AlgoParams.model_fields) >= OPTIONAL_ALGO_KEYS


_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][A-Za-z0-9_]*):(?P<value>.*)$")


def undocumented_keys(text: str) -> list[str]:
    """Dotted keys of ``text`` (a YAML file) that no comment covers.

    The rule params.yaml follows: a key is covered when the nearest line above it that is not a sibling
    key (same indentation, no blank line in between) is a ``#`` comment at its indentation, so a run of
    consecutive keys may share one comment; a key whose enclosing block key is covered is covered too
    (the comment above ``algorithms:`` documents its presets). A section key (``prepare:``) needs no
    comment of its own, but its first key does.
    """
    lines = text.splitlines()
    stack: list[tuple[int, str, bool]] = []  # (indent, key, covered) of the enclosing blocks
    bad = []
    for i, line in enumerate(lines):
        m = _KEY.match(line)
        if not m:
            continue
        indent, key = len(m["indent"]), m["key"]
        while stack and stack[-1][0] >= indent:
            stack.pop()
        j = i - 1
        while j >= 0 and (k := _KEY.match(lines[j])) and len(k["indent"]) == indent and k["value"].strip():
            j -= 1  # a sibling key with a value: the run shares the comment above it
        covered = (
            j >= 0 and lines[j].strip().startswith("#") and len(lines[j]) - len(lines[j].lstrip()) == indent
        )
        covered = covered or any(c for _, _, c in stack)
        is_block = not m["value"].strip()
        path = ".".join([k for _, k, _ in stack] + [key])
        if not covered and not is_block:
            bad.append(path)
        if is_block:
            stack.append((indent, key, covered))
    return bad


def test_every_key_of_params_yaml_has_a_comment():
    text = PARAMS.read_text()
    assert undocumented_keys(text) == []
    # deleting the comment above a key that opens a run leaves that key undocumented
    lines = text.splitlines()
    sft = lines.index("sft:")
    first_sft_key = next(i for i in range(sft + 1, len(lines)) if not lines[i].startswith("  #"))
    assert lines[first_sft_key].startswith("  steps:") and first_sft_key > sft + 1
    assert undocumented_keys("\n".join(lines[: sft + 1] + lines[first_sft_key:])) == ["sft.steps"]
    seed_comment = lines.index("seed: 0") - 1
    assert undocumented_keys("\n".join(lines[:seed_comment] + [""] + lines[seed_comment + 1 :])) == ["seed"]
    # the rule can fail: a key after a blank line, a key under an uncommented block, a stray comment level
    assert undocumented_keys("# a\nx: 1\n\ny: 2\n") == ["y"]
    assert undocumented_keys("s:\n  a: 1\n") == ["s.a"]
    assert undocumented_keys("s:\n  # a and b\n  a: 1\n  b: 2\nt:\n  c: 3\n") == ["t.c"]
    assert undocumented_keys("s:\n# wrong level\n  a: 1\n") == ["s.a"]
    assert undocumented_keys("# all presets\nalgos:\n  g:\n    p: 1\n  h:\n    p: 2\n") == []


# --- unknown keys, types, ranges -----------------------------------------------------------------------


def test_unknown_key_names_its_full_path():
    data = raw()
    data["sft"]["lrr"] = 0.1
    msg = error_of(data)
    assert "sft.lrr" in msg and "unknown key" in msg
    data = raw()
    data["algorithms"]["grpo"]["clip"] = 0.1
    assert "algorithms.grpo.clip: unknown key" in error_of(data)
    assert "bogus: unknown key" in error_of({**raw(), "bogus": 1})


@pytest.mark.parametrize(
    "key, value, words",
    [
        ("sft.steps", "abc", ["sft.steps", "'abc'"]),
        ("sft.lr", "x", ["sft.lr", "'x'"]),
        ("sft.steps", 1.5, ["sft.steps", "1.5"]),
        ("sft.lr", -1, ["sft.lr", "-1", "greater than 0"]),
        ("tasks.calc.max_calls", 99, ["tasks.calc.max_calls", "99", "less than or equal to 8"]),
        ("tasks.calc.max_calls", "x", ["tasks.calc.max_calls", "'x'", "valid integer"]),
        ("tasks.calc.max_callz", 2, ["tasks.calc.max_callz", "unknown key"]),
        ("prepare.max_calls", 2, ["prepare.max_calls", "unknown key"]),
        ("rollout.engine", "tgi", ["rollout.engine", "'tgi'", "vllm"]),
        ("rollout.context_window", 0, ["rollout.context_window", "0", "greater than or equal to 1"]),
        ("rollout.context_window", -3, ["rollout.context_window", "-3", "greater than or equal to 1"]),
        ("rollout.context_window", 1.5, ["rollout.context_window", "1.5"]),
        ("rollout.gpu_memory_utilization", 0, ["rollout.gpu_memory_utilization", "0", "greater than 0"]),
        ("rollout.gpu_memory_utilization", 1.0, ["rollout.gpu_memory_utilization", "1.0", "less than 1"]),
        ("rollout.gpu_memory_utilization", "x", ["rollout.gpu_memory_utilization", "'x'"]),
        ("rollout.sleep_during_update", "maybe", ["rollout.sleep_during_update", "'maybe'"]),
        ("rollout.staleness", -1, ["rollout.staleness", "-1", "greater than or equal to 0"]),
        ("rollout.staleness", 1.5, ["rollout.staleness", "1.5", "valid integer"]),
        ("rollout.staleness", True, ["rollout.staleness", "True"]),
        ("train.gamma", 1.5, ["train.gamma", "1.5"]),
        ("evaluate.max_samples", 0, ["evaluate.max_samples", "0"]),
        ("algorithms.grpo.preset", "dpo", ["algorithms.grpo.preset", "'dpo'"]),
        ("task", "chess", ["task", "'chess'", "calc"]),
        ("seed", True, ["seed", "True"]),
    ],
)
def test_bad_type_or_range_names_path_and_value(key, value, words):
    msg = error_of(raw(**{key: value}))
    for w in words:
        assert w in msg, (w, msg)
    assert msg.startswith(f"params.yaml: {key}")


def test_every_bad_key_is_reported_at_once():
    msg = error_of(raw(**{"sft.lr": "x", "prepare.n_train": 0, "rollout.max_steps": 999}))
    assert len(msg.splitlines()) == 3
    for k in ("sft.lr", "prepare.n_train", "rollout.max_steps"):
        assert k in msg


# --- cross-field checks -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"sft.batch_size": 16, "sft.micro_batch_size": 5}, ["sft", "batch_size=16", "micro_batch_size=5"]),
        ({"sft.steps": 10, "sft.warmup_steps": 11}, ["sft", "warmup_steps=11", "steps=10"]),
        ({"sft.lr_schedule": "wsd", "sft.decay_steps": 0}, ["sft", "decay_steps=0", "at least 1"]),
        ({"sft.lr_schedule": "cosine"}, ["sft.lr_schedule", "cosine"]),
        (
            {"train.mini_batch_size": 10, "train.micro_batch_size": 4},
            ["train", "mini_batch_size=10", "micro_batch_size=4"],
        ),
        (
            {"tasks.calc.min_calls": 3, "tasks.calc.max_calls": 2},
            ["tasks.calc", "min_calls=3", "max_calls=2"],
        ),
        ({"model.num_heads": 4, "model.num_kv_heads": 3}, ["model", "num_heads=4", "num_kv_heads=3"]),
        ({"compare.algorithms": ["grpo", "dapo"]}, ["compare.algorithms", "'dapo'", "grpo", "ppo", "steppo"]),
        ({"prepare.n_train": 100, "sft.rows": 100}, ["sft.rows=100", "prepare.n_train=100", "RL prompts"]),
        (
            {"algorithms.grpo.samples_per_prompt": 16, "train.trajectories_per_iteration": 8},
            ["algorithms.grpo.samples_per_prompt=16", "train.trajectories_per_iteration=8"],
        ),
        ({"train.critic_warmup": 20, "train.iterations": 20}, ["train.critic_warmup=20", "never be updated"]),
        ({"critic_warmup.episodes": 1}, ["critic_warmup.episodes=1", "two held out"]),
        ({"critic_warmup.episodes": 10, "critic_warmup.held_out": 0.95}, ["held_out=0.95", "one train"]),
        (
            {"train.critic_mini_batch_size": 100},
            ["train", "critic_mini_batch_size=100", "micro_batch_size=16"],
        ),
        # detached old log-probs are exact only for one optimizer step over the whole iteration
        (
            {"train.old_logprobs": "detached", "train.ppo_epochs": 2},
            ["train.old_logprobs='detached'", "train.ppo_epochs=2", "'rollout' or 'recompute'"],
        ),
        (
            {"train.old_logprobs": "detached", "train.mini_batch_size": 64},
            ["train.old_logprobs='detached'", "train.mini_batch_size=64", "= 512"],
        ),
        # the group filters pick prompt groups: an algorithm compare.algorithms runs must sample groups
        (
            {"train.std_filter_keep": 0.5},
            ["train.std_filter_keep", "algorithms.ppo.samples_per_prompt=1", "samples_per_prompt >= 2"],
        ),
        ({"train.dynamic_sampling": True}, ["train.dynamic_sampling", "algorithms.ppo.samples_per_prompt=1"]),
        (
            {"algorithms.ppo.dynamic_sampling": True},
            ["algorithms.ppo.dynamic_sampling picks", "algorithms.ppo.samples_per_prompt=1"],
        ),
        ({"train.std_filter_keep": 0.0}, ["train.std_filter_keep", "greater than 0"]),
        ({"critic_warmup.held_out": 1.0}, ["critic_warmup.held_out", "less than 1"]),
        # an episode needs one turn per tool call and one for the answer
        ({"tasks.calc.max_calls": 4, "rollout.max_steps": 4}, ["rollout.max_steps=4 < 5", "tasks.calc"]),
        (
            {"task": "search", "tasks.search.max_hops": 3, "rollout.max_steps": 3},
            ["rollout.max_steps=3 < 4", "tasks.search"],
        ),
    ],
)
def test_contradictory_values_name_the_keys(changes, words):
    msg = error_of(raw(**changes))
    for w in words:
        assert w in msg, (w, msg)


def test_group_filters_with_group_sampling_algorithms_only():
    """Filters on and every compared algorithm sampling groups: accepted (ppo with n=1 left out)."""
    p = parse_params(
        raw(**{"train.std_filter_keep": 0.25, "train.dynamic_sampling": True, "compare.algorithms": ["grpo"]})
    )
    assert (p.train.std_filter_keep, p.train.dynamic_sampling, p.train.dynamic_sampling_rounds) == (
        0.25,
        True,
        3,
    )


def test_boundaries_that_are_allowed():
    p = parse_params(
        raw(
            **{
                "sft.steps": 10,
                "sft.warmup_steps": 10,
                "tasks.calc.min_calls": 2,
                "tasks.calc.max_calls": 2,
                "sft.batch_size": 16,
                "sft.micro_batch_size": 4,
                "compare.algorithms": [],
                "prepare.n_train": 100,
                "sft.rows": 99,
            }
        )
    )
    assert p.sft.rows == 99  # one row left for RL prompts
    # with a source file the row count is only known when the train stage reads the split
    assert (
        parse_params(
            raw(**{"tasks.calc.source_path": "x.jsonl", "prepare.n_train": 10, "sft.rows": 50})
        ).sft.rows
        == 50
    )
    assert (p.sft.warmup_steps, p.task_params.min_calls, p.sft.batch_size // p.sft.micro_batch_size) == (
        10,
        2,
        4,
    )
    # a user-defined algorithm may be compared once it is a key of `algorithms`
    data = raw(**{"compare.algorithms": ["grpo", "grpo_kl"]})
    data["algorithms"]["grpo_kl"] = {"preset": "grpo", "lr": 0.0002}
    assert parse_params(data).algorithms["grpo_kl"].lr == 0.0002


# --- load_params ------------------------------------------------------------------------------------


def test_load_params_applies_dotted_overrides(tmp_path):
    p = load_params(PARAMS, overrides={"sft.lr": 0.001, "seed": 3, "algorithms.grpo.samples_per_prompt": 8})
    assert (p.sft.lr, p.seed, p.algorithms["grpo"].samples_per_prompt) == (0.001, 3, 8)
    assert p.sft.steps == RAW["sft"]["steps"]  # the rest of the file is kept
    assert load_params(PARAMS).sft.lr == RAW["sft"]["lr"]  # the file itself is not changed
    with pytest.raises(ConfigError, match=r"sft\.lrr: unknown key"):
        load_params(PARAMS, overrides={"sft.lrr": 0.1})
    with pytest.raises(ConfigError, match=r"sft\.lr: .*'x'"):
        load_params(PARAMS, overrides={"sft.lr": "x"})
    # an override may create a section the file leaves out (defaults fill the rest)
    f = tmp_path / "p.yaml"
    f.write_text("task: calc\nseed: 1\n")
    assert load_params(f, overrides={"evaluate.max_samples": 5}).evaluate.max_samples == 5
    # ... or fill a section whose keys are all commented out (YAML null)
    (tmp_path / "e.yaml").write_text("task: calc\nsft:\n  # lr: 0.1\n")
    assert load_params(tmp_path / "e.yaml", overrides={"sft.lr": 0.25}).sft.lr == 0.25
    with pytest.raises(ConfigError, match=r"sft: Input should be a valid dictionary.*\(got None\)"):
        load_params(tmp_path / "e.yaml")
    # an override through a key that is not a section is a ConfigError naming both, not a TypeError
    with pytest.raises(ConfigError, match=r"override seed\.x: seed is 1, not a section"):
        load_params(f, overrides={"seed.x": 1})
    lr = re.escape(repr(RAW["algorithms"]["grpo"]["lr"]))
    with pytest.raises(ConfigError, match=rf"override algorithms\.grpo\.lr\.x: algorithms\.grpo\.lr is {lr}"):
        load_params(PARAMS, overrides={"algorithms.grpo.lr.x": 1})


def test_load_params_errors_name_the_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=r"nope\.yaml: params file not found"):
        load_params(missing)
    with pytest.raises(ConfigError, match="not found"):
        load_params(tmp_path)  # a directory is not a params file


@pytest.mark.parametrize(
    "name,text,message",
    [
        ("list.yaml", "- a\n- b\n", r"list\.yaml: top level must be a mapping, got list"),
        ("scalar.yaml", "42\n", "got int"),
        ("broken.yaml", "sft: [1, 2\n", r"broken\.yaml: not valid YAML"),
        ("bad.yaml", "task: calc\nsft:\n  lrr: 0.1\n", r"^.*bad\.yaml: sft\.lrr: unknown key \(got 0\.1\)$"),
        ("notask.yaml", "seed: 1\n", r"^.*notask\.yaml: task: Field required"),
    ],
)
def test_load_params_errors_name_the_file_and_the_problem(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_params(path)


def test_file_with_only_a_task_gives_the_defaults(tmp_path):
    """`task` is the one required key (no task is built in as a default); the selected task's section
    may be left out: it is filled with the defaults of the task's params model."""
    only = tmp_path / "only.yaml"
    only.write_text("task: calc\n")
    p = load_params(only)
    assert p == Params(task="calc")
    assert set(p.tasks) == {"calc"} and p.task_params == type(p.task_params)()
    with pytest.raises(ConfigError, match=r"task: Field required"):
        load_params(_write(tmp_path / "empty.yaml", "# nothing\n"))


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# --- names checked against their registries at load ------------------------------------------------


@pytest.mark.parametrize(
    "key, value, kind, known",
    [
        ("algorithms.grpo.estimator", "grpoo", "advantage estimator", ["grpo", "gae", "step_gae", "rloo"]),
        ("algorithms.ppo.policy_loss", "ppo2", "policy loss", ["gspo", "ppo", "reinforce"]),
        (
            "algorithms.steppo.loss_agg",
            "mean",
            "loss aggregation mode",
            ["token-mean", "seq-mean-token-mean"],
        ),
        ("algorithms.grpo.preset", "dapo", "algorithm preset", ["grpo", "ppo", "steppo"]),
        ("train.kl_kind", "k3", "KL estimator", ["kl", "mse", "low_var_kl"]),
        ("task", "chess", "task", ["calc"]),
        ("rollout.tool_parser", "openai", "tool parser", ["hermes", "llama3_json", "mistral", "qwen3_xml"]),
    ],
)
def test_unknown_names_are_errors_listing_the_known_ones(key, value, kind, known):
    msg = error_of(raw(**{key: value}))
    assert msg.startswith(f"params.yaml: {key}: unknown {kind} {value!r}; valid: ["), msg
    assert f"(got {value!r})" in msg
    for name in known:
        assert repr(name) in msg, (name, msg)
    assert len(msg.splitlines()) == 1


def test_every_registered_name_is_accepted():
    from components.algos import ADVANTAGE_ESTIMATORS, AGG_MODES, KL_ESTIMATORS, POLICY_LOSSES

    for est in ADVANTAGE_ESTIMATORS.names():
        p = parse_params(raw(**{"algorithms.grpo.estimator": est}))
        assert p.algorithms["grpo"].parts()["estimator"] == est
    for loss in POLICY_LOSSES.names():
        assert (
            parse_params(raw(**{"algorithms.ppo.policy_loss": loss})).algorithms["ppo"].parts()["policy_loss"]
            == loss
        )
    for agg in AGG_MODES.names():
        assert parse_params(raw(**{"algorithms.ppo.loss_agg": agg})).algorithms["ppo"].loss_agg == agg
    for kl in KL_ESTIMATORS.names():
        assert parse_params(raw(**{"train.kl_kind": kl})).train.kl_kind == kl


@pytest.mark.parametrize(
    "algo, changes",
    [
        ("grpo", {"algorithms.grpo.samples_per_prompt": 1}),  # the preset's own estimator
        ("ppo", {"algorithms.ppo.estimator": "rloo"}),  # an override on a 1-sample algorithm
        ("steppo", {"algorithms.steppo.estimator": "gigpo"}),
    ],
)
def test_group_estimator_needs_two_samples_per_prompt(algo, changes):
    msg = error_of(raw(**changes))
    assert msg.startswith(f"params.yaml: algorithms.{algo}: estimator "), msg
    assert "needs samples_per_prompt >= 2 (got 1)" in msg


def test_resolved_parts_follow_preset_and_overrides():
    p = parse_params(raw(**{"algorithms.ppo.policy_loss": "gspo"}))
    assert p.algorithms["ppo"].parts() == {
        "estimator": "gae",
        "policy_loss": "gspo",
        "loss_agg": "token-mean",
        "critic": "token",
    }
    assert p.algorithms["grpo"].parts()["critic"] is None  # the critic follows the estimator
    assert (
        parse_params(raw(**{"algorithms.grpo.estimator": "step_gae"})).algorithms["grpo"].parts()["critic"]
        == "step"
    )


def test_task_sections_are_the_tasks_own():
    msg = error_of(raw(**{"tasks.chess": {}}))
    assert msg.startswith("params.yaml: tasks.chess: unknown task 'chess'; valid: [") and "'calc'" in msg
    assert "tasks.calc: must be a mapping" in error_of(raw(**{"tasks.calc": 3}))
    # the selected task's section may be left out: its defaults
    data = raw()
    del data["tasks"]
    p = parse_params(data)
    assert p.task_params == type(p.task_params)()


@pytest.mark.parametrize(
    "plugins, words",
    [
        (["no_such_module_xyz"], ["plugins.0", "'no_such_module_xyz'", "No module named"]),
        ("tests.tasks", ["plugins", "list of module names"]),
        ([""], ["plugins.0", "module name"]),
    ],
)
def test_bad_plugins_are_named(plugins, words):
    msg = error_of(raw(plugins=plugins))
    for w in words:
        assert w in msg, (w, msg)


def test_a_plugin_task_registers_itself_and_owns_its_section():
    """tests/tasks/toy_task.py lives outside components/: `plugins` imports it before validation."""
    p = parse_params(raw(task="toy", plugins=["tests.tasks.toy_task"], **{"tasks.toy": {"word_len": 5}}))
    assert p.task == "toy" and p.task_params.word_len == 5 and type(p.task_params).__name__ == "ToyParams"
    msg = error_of(raw(task="toy", plugins=["tests.tasks.toy_task"], **{"tasks.toy": {"word_len": 0}}))
    assert msg == "params.yaml: tasks.toy.word_len: Input should be greater than or equal to 1 (got 0)"
    from components.envs import TOOLS

    assert "shout" in TOOLS  # its tool, registered by name


def test_context_window_defaults_to_the_whole_history_and_takes_a_turn_count():
    assert load_params(PARAMS).rollout.context_window is None
    assert parse_params(raw(**{"rollout.context_window": 3})).rollout.context_window == 3
    assert parse_params(raw(**{"rollout.context_window": 1})).rollout.context_window == 1


def test_process_reward_weight_only_for_tasks_that_score_tool_calls():
    assert load_params(PARAMS).train.process_reward_weight == 0.0  # default: outcome only
    p = load_params(PARAMS, overrides={"task": "search_calc", "train.process_reward_weight": 0.5})
    assert p.train.process_reward_weight == 0.5 and p.task_params.turns_needed() == 4
    with pytest.raises(ConfigError, match="task 'calc' gives no process rewards"):
        load_params(PARAMS, overrides={"train.process_reward_weight": 0.5})
    with pytest.raises(ConfigError, match="process_reward_weight"):
        load_params(PARAMS, overrides={"task": "search_calc", "train.process_reward_weight": -1.0})
    with pytest.raises(ConfigError, match="rollout.max_steps=3 < 4"):
        load_params(PARAMS, overrides={"task": "search_calc", "rollout.max_steps": 3})


def test_tool_parser_defaults_to_hermes_and_needs_a_task_with_tools():
    assert load_params(PARAMS).rollout.tool_parser == "hermes"
    assert load_params(PARAMS, overrides={"rollout.tool_parser": "mistral"}).rollout.tool_parser == "mistral"
    with pytest.raises(ConfigError, match="rollout.tool_parser='qwen3_xml' but task 'sokoban' has no tools"):
        load_params(
            PARAMS, overrides={"task": "sokoban", "rollout.max_steps": 10, "rollout.tool_parser": "qwen3_xml"}
        )


# --- evaluation protocols ------------------------------------------------------------------------


def test_protocols_are_greedy_then_one_per_temperature():
    from components.config import protocol_label, protocol_name

    p = parse_params({"task": "calc"})
    assert p.evaluate.protocols == ["greedy", "t0.4", "t1"] and p.compare.headline == "t0.4"
    assert p.train.val_temperatures == [0.4]
    assert protocol_name(None) == "greedy" and protocol_name(0.5) == "t0.5" and protocol_name(1.0) == "t1"
    assert (
        protocol_label("t0.4", 2) == "sampled at T=0.4, 2 per problem"
        and protocol_label("greedy") == "greedy"
    )
    greedy_only = parse_params(
        {"task": "calc", "evaluate": {"samples": 0}, "compare": {"headline": "greedy"}}
    )
    assert greedy_only.evaluate.protocols == ["greedy"]


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ({"evaluate": {"temperature": 1.0}}, "evaluate.temperature is now evaluate.temperatures"),
        (
            {"evaluate": {"temperatures": [0.4, 0.4]}},
            r"evaluate.temperatures: \[0.4, 0.4\] repeats temperature 0.4",
        ),
        ({"evaluate": {"temperatures": [0.0]}}, r"evaluate.temperatures: .*must be in \(0, 2\]"),
        ({"train": {"val_temperatures": [2.5]}}, r"train.val_temperatures: .*must be in \(0, 2\]"),
        (
            {"compare": {"headline": "t0.5"}},
            r"compare.headline='t0.5' is not an evaluated protocol.*'t0.4', 't1'",
        ),
        ({"evaluate": {"samples": 0}}, r"compare.headline='t0.4' is not an evaluated protocol.*\['greedy'\]"),
    ],
)
def test_bad_protocol_settings_name_the_key(raw, words):
    with pytest.raises(ConfigError, match=words):
        parse_params({"task": "calc", **raw})


def test_episode_limits_are_run_episodes_keywords_with_the_rollout_values():
    import inspect

    from components.agent.loop import run_episodes
    from components.config import RolloutParams

    r = RolloutParams(max_steps=7, max_prompt_len=300, max_response_len=20, context_window=2)
    limits = r.episode_limits()
    assert limits == {"max_steps": 7, "max_prompt_len": 300, "max_response_len": 20, "context_window": 2}
    assert set(limits) <= set(inspect.signature(run_episodes).parameters)


def test_dynamic_sampling_per_algorithm():
    """algorithms.<name>.dynamic_sampling overrides train.dynamic_sampling for that algorithm alone:
    on for grpo beside a ppo of one sample per prompt (accepted, ppo stays off); train's setting on
    with ppo's own off (accepted); unset, an algorithm follows train's."""
    p = parse_params(raw(**{"algorithms.grpo.dynamic_sampling": True, "compare.algorithms": ["grpo", "ppo"]}))
    assert (p.dynamic_sampling("grpo"), p.dynamic_sampling("ppo")) == (True, False)
    assert (p.group_filter_key("grpo"), p.group_filter_key("ppo")) == (
        "algorithms.grpo.dynamic_sampling",
        None,
    )
    p = parse_params(
        raw(
            **{
                "train.dynamic_sampling": True,
                "algorithms.ppo.dynamic_sampling": False,
                "compare.algorithms": ["grpo", "ppo"],
            }
        )
    )
    assert (p.dynamic_sampling("grpo"), p.dynamic_sampling("ppo")) == (True, False)
    assert p.group_filter_key("grpo") == "train.dynamic_sampling"


# --- rollout.staleness ---------------------------------------------------------------------------------

# every algorithm of compare.algorithms with a correction that weighs by pi_old / pi_behav
_TIS = {f"algorithms.{a}.correction": "tis" for a in ("grpo", "ppo", "steppo")}


@pytest.mark.parametrize(
    "changes, words",
    [
        # the default old_logprobs (detached) with no correction never weighs by the rollout's log-probs
        (
            {"rollout.staleness": 1},
            ["rollout.staleness=1", "algorithms.grpo.correction='none'", "train.old_logprobs='detached'"],
        ),
        (
            {
                "rollout.staleness": 2,
                "train.old_logprobs": "recompute",
                **_TIS,
                "algorithms.ppo.correction": "none",
            },
            [
                "rollout.staleness=2",
                "algorithms.ppo.correction='none'",
                "train.old_logprobs='recompute'",
                "tis",
            ],
        ),
        (
            {"rollout.staleness": 1, **_TIS, "rollout.engine": "hf"},
            ["rollout.staleness=1", "rollout.engine='hf'", "not be reproducible"],
        ),
        (
            {"rollout.staleness": 1, **_TIS, "deepspeed.world_size": 2},
            ["rollout.staleness=1", "deepspeed.world_size=2"],
        ),
    ],
)
def test_staleness_refuses_what_it_cannot_correct_or_run(changes, words):
    msg = error_of(raw(**changes))
    for w in words:
        assert w in msg, (w, msg)


def test_staleness_with_a_correction_or_rollout_logprobs_loads():
    assert parse_params(raw(**{"rollout.staleness": 1, **_TIS})).rollout.staleness == 1
    decoupled = {k: "decoupled" for k in _TIS}
    assert parse_params(raw(**{"rollout.staleness": 3, "train.old_logprobs": "recompute", **decoupled}))
    # the ratio pi / pi_behav: PPO's own importance ratio against the policy that sampled
    p = parse_params(raw(**{"rollout.staleness": 1, "train.old_logprobs": "rollout"}))
    assert p.staleness_problem("grpo") is None
    # an algorithm outside compare.algorithms is checked when the train stage runs it
    data = raw(**{"rollout.staleness": 1, **_TIS})
    data["algorithms"]["grpo_plain"] = {"preset": "grpo"}
    p = parse_params(data)
    assert "algorithms.grpo_plain.correction='none'" in p.staleness_problem("grpo_plain")
    assert p.staleness_problem("grpo") is None and p.staleness_problem() is None


def test_staleness_zero_is_left_out_of_the_dump_and_never_sleeps_the_engine_above_zero():
    """At 0 the rollout section dumps as before the key existed (fingerprints, Prefect keys, MLflow)."""
    base = parse_params(RAW)
    assert "staleness" not in base.rollout.model_dump() and base.rollout.staleness == 0
    stale = parse_params(raw(**{"rollout.staleness": 2, **_TIS}))
    assert stale.rollout.model_dump()["staleness"] == 2
    assert stale.model_dump()["rollout"]["staleness"] == 2
    assert base.rollout.engine_settings(0, updates=True).sleep_mode is True
    assert stale.rollout.engine_settings(0, updates=True).sleep_mode is False  # it generates meanwhile


# --- rollout.partial, rollout.engine_cpus, train.threads -------------------------------------------------


@pytest.mark.parametrize(
    "changes, words",
    [
        # carried episodes are off-policy: the default (detached, no correction) would count them on-policy
        ({"rollout.partial": True}, ["rollout.partial", "algorithms.grpo.correction='none'", "off-policy"]),
        (
            {"rollout.partial": True, **_TIS, "train.dynamic_sampling": True},
            ["rollout.partial", "train.dynamic_sampling", "first complete groups"],
        ),
        (
            {"rollout.partial": True, **_TIS, "train.std_filter_keep": 0.5},
            ["rollout.partial", "train.std_filter_keep"],
        ),
        ({"rollout.partial": True, **_TIS, "deepspeed.world_size": 2}, ["rollout.partial", "world_size=2"]),
        # the in-process engine has no threads of its own to bind
        (
            {"rollout.engine_cpus": "1"},
            ["rollout.engine_cpus='1'", "own_process true", "staleness >= 1", "train.threads"],
        ),
        # only vLLM has a process of its own to run in
        (
            {"rollout.own_process": True, "rollout.engine": "hf"},
            ["rollout.own_process", "rollout.engine='hf'"],
        ),
        ({"rollout.engine_cpus": "one"}, ["engine_cpus='one'", "CPU list"]),
        ({"rollout.engine_cpus": "3-1", "rollout.staleness": 1, **_TIS}, ["engine_cpus='3-1'"]),
        ({"train.threads": 0}, ["train.threads", "greater than or equal to 1"]),
        # in-flight pushes go to the engine in its own process, which runs at staleness >= 1
        ({"rollout.inflight_updates": True}, ["rollout.inflight_updates", "rollout.staleness 1 or more"]),
        (
            {"rollout.inflight_updates": True, "rollout.staleness": 1, "rollout.partial": True, **_TIS},
            ["rollout.inflight_updates with rollout.partial is not built"],
        ),
        ({"rollout.inflight_updates": True, "rollout.staleness": 1}, ["algorithms.grpo.correction='none'"]),
    ],
)
def test_partial_and_thread_settings_refuse_what_cannot_run(changes, words):
    msg = error_of(raw(**changes))
    for w in words:
        assert w in msg, (w, msg)


def test_partial_and_thread_settings_load_and_dump_only_when_set():
    base = parse_params(RAW)
    for key in ("partial", "partial_pool", "engine_cpus", "own_process", "inflight_updates"):
        assert key not in base.rollout.model_dump()
    assert base.engine_in_own_process() is False
    # vLLM in its own process at staleness 0: the key is dumped (a new fingerprint) and binds its threads
    own = parse_params(raw(**{"rollout.own_process": True, "rollout.engine_cpus": "1"}))
    assert own.engine_in_own_process() is True and own.rollout.staleness == 0
    assert own.rollout.model_dump()["own_process"] is True
    assert own.staleness_problem("grpo") is None
    # staleness >= 1 and several ranks put it there whatever own_process says
    assert parse_params(raw(**{"rollout.staleness": 1, **_TIS})).engine_in_own_process() is True
    assert parse_params(raw(**{"deepspeed.world_size": 2})).engine_in_own_process() is True
    inflight = parse_params(raw(**{"rollout.staleness": 1, "rollout.inflight_updates": True, **_TIS})).rollout
    assert inflight.model_dump()["inflight_updates"] is True
    assert inflight.engine_settings(0, own_process=True).inflight_updates is True
    assert base.rollout.engine_settings(0, own_process=True).inflight_updates is False
    assert "threads" not in base.train.model_dump()
    p = parse_params(
        raw(
            **{
                "rollout.partial": True,
                "rollout.staleness": 1,
                "rollout.engine_cpus": "1",
                "train.threads": 1,
                **_TIS,
            }
        )
    )
    assert p.rollout.model_dump()["partial"] is True and p.rollout.model_dump()["engine_cpus"] == "1"
    assert p.rollout.model_dump()["partial_pool"] == 1.5
    assert p.train.model_dump()["threads"] == 1
    assert p.rollout.engine_settings(0, own_process=True).cpu_bind == "1"
    # `-S rollout.engine_cpus=1` reaches the params as YAML's int 1
    assert (
        parse_params(raw(**{"rollout.staleness": 1, "rollout.engine_cpus": 1, **_TIS})).rollout.engine_cpus
        == "1"
    )
    assert p.staleness_problem("grpo") is None
    # rollout log-probs are the behaviour policy's own: no correction is needed
    assert parse_params(raw(**{"rollout.partial": True, "train.old_logprobs": "rollout"})).rollout.partial
