"""Stage command lines on bad input: one `error:` line per problem on stderr, exit code 2, no traceback,
no output written, Prefect never started. Each runs as a subprocess in a throwaway copy of the repo.

About a minute in all: base_model and sft import torch/transformers/DeepSpeed before they read params.
"""

from __future__ import annotations

import json
import sys

import pytest
import yaml

from tests.flows.workspace import make_workspace, run

# Everything a stage may write; none of it may exist after a stage that refused its input.
OUTPUTS = (
    "data/processed",
    "models",
    "metrics",
    "plots",
    "runs",
    "reports",
    "mlflow/mlflow.db",
    "mlflow/artifacts",
)


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    root = make_workspace(tmp_path_factory.mktemp("stage_errors"))
    rows = [json.loads(line) for line in (root / "tests/data/gsm8k_sample.jsonl").read_text().splitlines()]
    rows[2]["answer"] = rows[2]["answer"].split("####")[0] + "the answer is 210"  # row 3 loses its '#### N'
    (root / "inputs").mkdir()
    (root / "inputs/gsm8k_bad.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def params_file(ws, name: str, edit) -> str:
    """A copy of the workspace's params.yaml changed by ``edit(dict)``; returns its path relative to ws."""
    data = yaml.safe_load((ws / "params.yaml").read_text())
    edit(data)
    path = ws / "bad_params" / f"{name}.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path.relative_to(ws))


def stage(ws, name: str, params: str):
    proc = run([sys.executable, "-m", f"flows.{name}", "--params", params], ws, timeout=300, check=False)
    written = [p for p in OUTPUTS if (ws / p).exists()]
    assert written == [], f"{name} left {written} behind"
    assert not any((ws / ".prefect").glob("*")), "Prefect was started"
    return proc


def error_lines(proc, n: int = 1) -> list[str]:
    """Check the failure shape; return the ``n`` error lines (a bad params file reports every bad key)."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr[-3000:]
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == n and lines[-n:] == errors, lines
    return errors


def set_key(dotted: str, value):
    def edit(data: dict) -> None:
        *parents, leaf = dotted.split(".")
        node = data
        for p in parents:
            node = node[p]
        node[leaf] = value

    return edit


@pytest.mark.parametrize(
    "name, key, value, words",
    [
        ("prepare", "sft.lrr", 0.1, ["sft.lrr", "unknown key"]),
        ("base_model", "model.num_heads", "four", ["model.num_heads", "'four'"]),
        ("sft", "sft.lrr", 0.1, ["sft.lrr", "unknown key"]),
        ("prepare", "compare.seeds", [0, 0], ["compare", "seeds=[0, 0]", "unique"]),
    ],
)
def test_bad_params_one_line_naming_the_key(ws, name, key, value, words):
    path = params_file(ws, f"{name}-{key}", set_key(key, value))
    (err,) = error_lines(stage(ws, name, path))
    assert path in err
    for w in words:
        assert w in err, (w, err)


def test_every_bad_key_gets_its_own_error_line(ws):
    """Also prepare's bad-value case (a wrong type and an out-of-range value)."""

    def edit(data: dict) -> None:
        data["sft"]["lr"] = "x"
        data["tasks"]["calc"]["min_calls"] = 0

    errors = error_lines(stage(ws, "prepare", params_file(ws, "two", edit)), n=2)
    assert any("tasks.calc.min_calls" in e and "0" in e for e in errors)
    assert any("sft.lr" in e and "'x'" in e for e in errors)


def test_bad_source_row_names_file_row_and_column(ws):
    path = params_file(ws, "bad_source", set_key("tasks.calc.source_path", "inputs/gsm8k_bad.jsonl"))
    (err,) = error_lines(stage(ws, "prepare", path))
    assert "gsm8k_bad.jsonl" in err and "row 3" in err and "'answer'" in err, err
    assert not (ws / "data/processed/calc").exists()


def test_missing_source_file(ws):
    path = params_file(ws, "no_source", set_key("tasks.calc.source_path", "inputs/absent.jsonl"))
    (err,) = error_lines(stage(ws, "prepare", path))
    assert "tasks.calc.source_path" in err and "absent.jsonl" in err


def test_missing_model_path(ws):
    path = params_file(ws, "no_model", set_key("model.path", "/nonexistent"))
    (err,) = error_lines(stage(ws, "base_model", path))
    assert "model.path" in err and "/nonexistent" in err
    assert not (ws / "models/base").exists()


def test_train_refuses_bad_names_before_any_work(ws):
    """A bad algorithm part once failed inside the update task after the first rollout (or as a bare
    KeyError traceback); now the train stage stops at load, every bad name on its own line with the
    known names, nothing written and no Prefect. (One process: a train start costs tens of seconds.)"""

    def edit(data: dict) -> None:
        data["algorithms"]["grpo"]["policy_loss"] = "ppo2"
        data["algorithms"]["grpo"]["loss_agg"] = "mean"
        data["algorithms"]["ppo"]["estimator"] = "grpoo"
        data["algorithms"]["steppo"]["estimator"] = "rloo"  # a group baseline with samples_per_prompt 1

    path = params_file(ws, "train-names", edit)
    cmd = [sys.executable, "-m", "flows.train", "--params", path, "--algo", "grpo", "--rl-seed", "0"]
    proc = run(cmd, ws, timeout=300, check=False)
    assert [p for p in OUTPUTS if (ws / p).exists()] == []
    errors = "\n".join(error_lines(proc, n=4))
    for w in [
        "algorithms.grpo.policy_loss: unknown policy loss 'ppo2'; valid: ['gspo', 'ppo', 'reinforce']",
        "algorithms.grpo.loss_agg: unknown loss aggregation mode 'mean'; valid: [",
        "algorithms.ppo.estimator: unknown advantage estimator 'grpoo'; valid: [",
        "algorithms.steppo: estimator 'rloo' (preset 'steppo')",
        "needs samples_per_prompt >= 2 (got 1)",
    ]:
        assert w in errors, (w, errors)
