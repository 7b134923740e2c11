"""The compare stage's report and chart on fabricated metrics (no training): intervals, per-seed rows,
pairwise differences and the sentences that call a difference significant only when its interval
excludes 0. Fast: no Prefect server, no MLflow (the tasks' functions are called directly)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest

import flows.compare as compare
from components.config import parse_params

N = 200


def write_run(root, name: str, correct, sampled, eval_extra=None, train=None, t04=None, loops=None):
    """A run's metrics files as the evaluation writes them: greedy ``correct``, the T=1 protocol's
    ``sampled`` (also the legacy ``sampled_correct``), the T=0.4 protocol's ``t04`` (default: ``sampled``)
    and, with ``loops`` (greedy, t0.4, t1 per-problem loop rates), the loop columns of a task with state
    keys."""
    (root / "metrics").mkdir(exist_ok=True)
    (root / "plots").mkdir(exist_ok=True)
    t04 = sampled if t04 is None else t04
    table = {
        "id": [f"p{i}" for i in range(N)],
        "correct": list(map(int, correct)),
        "sampled_correct": list(map(float, sampled)),
        "n_sampled": [2] * N,
        "return": [10.0 * float(x) for x in correct],
        "turns": [2 if x else 4 for x in correct],
        "t0.4_correct": list(map(float, t04)),
        "t0.4_n": [2] * N,
        "t1_correct": list(map(float, sampled)),
        "t1_n": [2] * N,
    }
    blocks = {
        "greedy": {"accuracy": float(np.mean(correct))},
        "t0.4": {"accuracy": float(np.mean(t04)), "pass_at_k": 0.8},
        "t1": {"accuracy": float(np.mean(sampled)), "pass_at_k": 0.9},
    }
    if loops is not None:
        for (column, block), values in zip(
            (("loop_rate", "greedy"), ("t0.4_loop_rate", "t0.4"), ("t1_loop_rate", "t1")), loops
        ):
            table[column] = list(map(float, values))
            blocks[block]["loop_rate"] = float(np.mean(values))
    pl.DataFrame(table).write_parquet(root / "metrics" / f"problems_{name}.parquet")
    ev = {
        "model": name,
        "accuracy": float(np.mean(correct)),
        "sampled_accuracy": float(np.mean(sampled)),
        "pass_at_k": 0.9,
        "mean_turns": 2.0,
        "valid_tool_call_rate": 1.0,
        "format_error_rate": 0.0,
        **blocks,
        **(eval_extra or {}),
    }
    (root / "metrics" / f"eval_{name}.json").write_text(json.dumps(ev))
    if train is not None:
        (root / "metrics" / f"train_{name}.json").write_text(json.dumps(train))


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    """SFT solves every other problem; grpo (both seeds) solves them all; ppo is SFT problem for problem."""
    monkeypatch.setattr(compare, "REPO", tmp_path)
    sft = np.arange(N) % 2 == 0
    half = np.where(sft, 0.5, 0.0)
    write_run(tmp_path, "sft", sft, half)
    for seed, turns in ((0, 1.0), (1, 2.0)):
        train = {"train_wall_time_s": 100.0 * (seed + 1), "generated_tokens": 1000 * (seed + 1)}
        write_run(tmp_path, f"grpo-s{seed}", np.ones(N), np.ones(N), {"mean_turns": turns}, train)
        write_run(tmp_path, f"ppo-s{seed}", sft, half, {"tool_calls_per_step": 0.5}, train)
        for algo, score in (("grpo", 0.5 + 0.1 * seed), ("ppo", 0.3)):
            (tmp_path / "plots" / f"train_{algo}-s{seed}.csv").write_text(
                f"iteration,val_accuracy,score_mean\n-1,0.5,\n0,{0.6 + 0.1 * seed},{score}\n1,,{score + 0.1}\n"
            )
    params = parse_params(
        {
            "task": "calc",
            "compare": {"algorithms": ["grpo", "ppo"], "seeds": [0, 1]},
            "evaluate": {"samples": 2},
        }
    )
    return tmp_path, params


def cells(report: str, first: str, which: int = 0) -> list[str]:
    """The cells of the ``which``-th table row whose first cell is ``first``."""
    lines = [x for x in report.splitlines() if x.startswith(f"| {first} |")]
    return [c.strip() for c in lines[which].strip("|").split("|")]


def test_report_intervals_per_seed_rows_and_words(workspace):
    root, params = workspace
    report = Path(compare.table.fn(params)).read_text()
    assert report == (root / "reports" / "compare.md").read_text()
    header = cells(report, "algorithm")
    assert header[:8] == [  # the headline protocol (compare.headline: t0.4 by default) first
        "algorithm",
        "seeds",
        "accuracy (sampled at T=0.4, 2 per problem) [95% CI]",
        "t0.4 vs SFT [95% CI]",
        "accuracy (greedy) [95% CI]",
        "greedy vs SFT [95% CI]",
        "accuracy (sampled at T=1, 2 per problem) [95% CI]",
        "t1 vs SFT [95% CI]",
    ]
    assert "**Headline protocol: sampled at T=0.4, 2 per problem.**" in report
    assert "tool calls per step" in header and "answer without tool" not in header  # only keys some file has
    assert "pass@k (sampled at T=0.4, 2 per problem)" in header and "## Loops" not in report
    grpo, ppo, sft = cells(report, "grpo"), cells(report, "ppo"), cells(report, "sft")
    interval = re.compile(r"^[+-]?\d\.\d{3} \[-?\d\.\d{3}, -?\d\.\d{3}\]$")
    for row in (grpo, ppo):
        assert all(interval.match(c) for c in row[2:8]), row
    assert grpo[1] == "0, 1" and grpo[4] == "1.000 [1.000, 1.000]" and grpo[5].startswith("+0.500 [")
    assert ppo[5] == "+0.000 [0.000, 0.000]"
    lo, hi = map(float, re.findall(r"-?\d\.\d{3}", sft[4])[1:])
    assert lo < 0.5 < hi and hi - lo < 0.2  # 200 problems, half solved
    # the other columns are per-algorithm means over the seeds
    assert grpo[header.index("mean turns")] == "1.50" and grpo[header.index("train wall time (s)")] == "150"
    assert (
        grpo[header.index("tool calls per step")] == "-"
        and ppo[header.index("tool calls per step")] == "0.500"
    )
    for name in ("grpo-s0", "grpo-s1", "ppo-s0", "ppo-s1"):
        run = cells(report, name)
        assert run[1] == name.split("-")[0] and run[2] == name[-1], run
    assert cells(report, "grpo-s1")[cells(report, "run").index("mean turns")] == "2.00"
    assert cells(report, "grpo - ppo")[2].startswith("+0.500 [")
    words = {line.split("**")[1]: line for line in report.splitlines() if line.startswith("- **")}
    assert "greedy: accuracy 1.000, against SFT significantly higher (+0.500" in words["grpo"]
    assert "against ppo: sampled at T=0.4, 2 per problem significantly higher" in words["grpo"]
    assert "greedy significantly higher" in words["grpo"]
    assert (
        "greedy: accuracy 0.500, against SFT no significant difference (+0.000 [0.000, 0.000]" in words["ppo"]
    )
    assert "greedy significantly lower (-0.500" in words["ppo"]
    assert "sampled at T=1, 2 per problem: accuracy" in words["ppo"]
    assert "greedy: return 10.000, against SFT significantly higher (+5.000" in words["grpo"]
    assert "resample" in report and "RL seeds and test problems, crossed" in report
    # the greedy episode's return and turns: grpo solves all (return 10, 2 turns), SFT half (5, 3 turns)
    episode = cells(report, "grpo", 1)
    assert episode[1] == "10.000 [10.000, 10.000]" and episode[2].startswith("+5.000 [")
    assert episode[3] == "2.000 [2.000, 2.000]" and episode[4].startswith("-1.000 [")
    assert cells(report, "grpo - ppo")[4].startswith("+5.000 [") and cells(report, "grpo - ppo")[
        5
    ].startswith("-1.000 [")


def test_a_task_without_tools_shows_no_tool_columns(workspace):
    root, params = workspace
    for path in (root / "metrics").glob("eval_*.json"):
        ev = json.loads(path.read_text())
        path.write_text(json.dumps({**ev, "tool_calls_per_episode": 0.0, "answer_without_tool_rate": 1.0}))
    header = cells(Path(compare.table.fn(params)).read_text(), "algorithm")
    assert "valid tool calls" not in header and "answer without tool" not in header and "mean turns" in header


def test_chart_has_two_panels(workspace):
    root, params = workspace
    png = compare.chart.fn(params)
    assert (root / "reports" / "compare.png").stat().st_size > 1000 and png.endswith("compare.png")


def test_the_chart_draws_the_headline_protocol_s_validation_where_every_run_has_it(workspace):
    root, params = workspace
    assert params.compare.headline == "t0.4"
    curves = {p.stem: pl.read_csv(p) for p in (root / "plots").glob("train_*.csv")}
    assert compare.val_column(params, curves) == ("val_accuracy", "greedy")  # runs from before the column
    curves = {n: df.with_columns(pl.lit(0.7).alias("val_t0.4_accuracy")) for n, df in curves.items()}
    assert compare.val_column(params, curves) == ("val_t0.4_accuracy", "sampled at T=0.4, 1 per problem")
    curves["train_ppo-s1"] = curves["train_ppo-s1"].drop("val_t0.4_accuracy")  # one run without it
    assert compare.val_column(params, curves)[0] == "val_accuracy"
    greedy = params.model_copy(update={"compare": params.compare.model_copy(update={"headline": "greedy"})})
    assert compare.val_column(greedy, {"a": curves["train_grpo-s0"]})[0] == "val_accuracy"
    for path in (root / "plots").glob("train_*.csv"):  # the chart reads the column from the files
        pl.read_csv(path).with_columns(pl.col("val_accuracy").alias("val_t0.4_accuracy")).write_csv(path)
    assert compare.chart.fn(params).endswith("compare.png")


def test_mismatched_problems_name_the_file(workspace):
    root, params = workspace
    path = root / "metrics" / "problems_ppo-s1.parquet"
    pl.read_parquet(path).head(N - 1).write_parquet(path)
    with pytest.raises(compare.StageError, match=r"problems_ppo-s1.parquet: .*missing \['p199'\]"):
        compare.table.fn(params)


def test_missing_inputs_are_listed_before_the_flow_starts(workspace):
    root, params = workspace
    (root / "metrics" / "eval_grpo-s1.json").unlink()
    assert compare.inputs(params).count("metrics/eval_grpo-s1.json") == 1
    (root / "params.yaml").write_text("task: calc\ncompare:\n  algorithms: [grpo, ppo]\n  seeds: [0, 1]\n")
    with pytest.raises(
        compare.StageError, match=r"1 input file\(s\) missing, e.g. metrics/eval_grpo-s1.json"
    ):
        compare.main(str(root / "params.yaml"))


def test_per_tool_columns_of_a_two_tool_task(workspace):
    """search_calc's per-tool metrics ("<tool>/<metric>") get a column each, by tool, then the overall
    right-tool rate; the SFT row shows its own values, a run without them "-"."""
    root, params = workspace
    tool_metrics = {
        "search/calls_per_episode": 1.5,
        "search/valid_rate": 1.0,
        "search/right_tool_rate": 0.9,
        "calculator/calls_per_episode": 0.25,
        "calculator/valid_rate": 0.8,
        "calculator/right_tool_rate": 1.0,
        "right_tool_rate": 0.7,
    }
    path = root / "metrics" / "eval_sft.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **tool_metrics}))
    report = Path(compare.table.fn(params)).read_text()
    header = cells(report, "algorithm")
    want = [
        "calculator calls per episode",
        "calculator valid",
        "calculator right tool",
        "search calls per episode",
        "search valid",
        "search right tool",
        "right tool rate",
    ]
    assert [h for h in header if h in want] == want
    sft = dict(zip(header, cells(report, "sft")))
    assert sft["calculator calls per episode"] == "0.250" and sft["right tool rate"] == "0.700"
    assert dict(zip(header, cells(report, "grpo")))["search valid"] == "-"


def test_collapse_signs_and_critic_per_run(workspace):
    """The diagnostics table reads each run's csv: first vs last quarter of its iterations (8 here: 2 each)."""
    root, params = workspace
    cols = "iteration,val_accuracy,score_mean,train_accuracy,group_reward_std,reward_std,entropy,distinct_actions,vf_explained_var,vf_explained_var_low,vf_explained_var_high"
    # grpo-s0 collapses: spread and entropy halve while success falls; grpo-s1 converges (success rises);
    # ppo-s0 holds steady and has a critic whose explained variance dips after its first update; ppo-s1's csv predates the columns
    runs = {
        "grpo-s0": (
            [0.6, 0.6, 0.5, 0.5, 0.4, 0.4, 0.3, 0.3],
            [4, 4, 3, 3, 2, 2, 1, 1],
            [0.2, 0.2, 0.2, 0.1, 0.1, 0.1, 0.05, 0.05],
            "",
        ),
        "grpo-s1": (
            [0.6, 0.6, 0.7, 0.7, 0.8, 0.8, 0.9, 0.9],
            [4, 4, 3, 3, 2, 2, 1, 1],
            [0.2, 0.2, 0.2, 0.1, 0.1, 0.1, 0.05, 0.05],
            "",
        ),
        "ppo-s0": ([0.5] * 8, [3.0] * 8, [0.2] * 8, "ev"),
    }
    for name, (success, spread, entropy, ev) in runs.items():
        lines = [cols, "-1,0.5,,,,,,,,,"]
        for k in range(8):
            v = [0.1, -0.2, 0.0, 0.15, 0.2, 0.3, 0.4, 0.45][k]
            critic = f"{v:.2f},{v - 0.05:.2f},{v + 0.04:.2f}" if ev else ",,"
            group = spread[k] if name.startswith("grpo") else ""
            lines.append(f"{k},,1.0,{success[k]},{group},{spread[k]},{entropy[k]},2.0,{critic}")
        (root / "plots" / f"train_{name}.csv").write_text("\n".join(lines) + "\n")
    report = Path(compare.table.fn(params)).read_text()
    assert "## Collapse signs and the critic" in report
    s0 = cells(report, "grpo-s0", 1)  # row 0 is the every-run table
    assert s0[1:5] == ["4 -> 1", "0.2 -> 0.05", "2 -> 2", "0.6 -> 0.3"]
    assert s0[5] == "-" and s0[6].startswith(
        "collapsing: group reward std fell 4 -> 1, entropy fell 0.2 -> 0.05"
    )
    assert cells(report, "grpo-s1", 1)[6].endswith("converging rather than collapsing")
    p0 = cells(report, "ppo-s0", 1)
    assert p0[5] == "0.100 [0.050, 0.140] / -0.200 / 0.450" and p0[6].startswith(
        "no sign of collapse (reward std 3 -> 3"
    )
    assert cells(report, "ppo-s1", 1)[1:] == ["-"] * 6  # an old csv: nothing to read


def sft_and_two_grpo_runs(root) -> None:
    """SFT and GRPO seeds 0, 1 with the same greedy results, all wrong at T=0.4 for SFT, all right for GRPO."""
    sft = np.arange(N) % 2 == 0
    write_run(root, "sft", sft, np.where(sft, 0.5, 0.0), t04=np.zeros(N))
    for seed in (0, 1):
        train = {"train_wall_time_s": 1.0, "generated_tokens": 1}
        write_run(root, f"grpo-s{seed}", sft, np.where(sft, 0.5, 0.0), t04=np.ones(N), train=train)


def test_each_protocol_its_own_values_headline_greedy(workspace):
    """Distinct values per protocol land in their own columns and sentences; compare.headline=greedy
    leads the table and the intro names it."""
    root, params = workspace
    sft_and_two_grpo_runs(root)
    params = params.model_copy(update={"compare": params.compare.model_copy(update={"headline": "greedy"})})
    report = Path(compare.table.fn(params)).read_text()
    assert "**Headline protocol: greedy.**" in report
    header = cells(report, "algorithm")
    assert header[2] == "accuracy (greedy) [95% CI]" and header[4].startswith("accuracy (sampled at T=0.4")
    grpo = dict(zip(header, cells(report, "grpo")))
    assert grpo["greedy vs SFT [95% CI]"] == "+0.000 [0.000, 0.000]"
    assert grpo["t0.4 vs SFT [95% CI]"] == "+1.000 [1.000, 1.000]"
    assert grpo["t1 vs SFT [95% CI]"] == "+0.000 [0.000, 0.000]"
    run = dict(zip(cells(report, "run"), cells(report, "grpo-s0")))
    assert run["accuracy (sampled at T=0.4, 2 per problem)"] == "1.000"
    words = next(line for line in report.splitlines() if line.startswith("- **grpo**"))
    assert "sampled at T=0.4, 2 per problem: accuracy 1.000, against SFT significantly higher" in words


def test_loop_rates_per_protocol_with_intervals(workspace):
    """A task with state keys: the Loops table shows each protocol's loop rate and its difference to SFT."""
    root, params = workspace
    sft = np.arange(N) % 2 == 0
    loops = (np.full(N, 0.4), np.full(N, 0.2), np.full(N, 0.1))
    write_run(root, "sft", sft, np.where(sft, 0.5, 0.0), loops=loops)
    fewer = (np.full(N, 0.1), np.full(N, 0.1), np.full(N, 0.1))
    for seed in (0, 1):
        train = {"train_wall_time_s": 1.0, "generated_tokens": 1}
        write_run(root, f"grpo-s{seed}", np.ones(N), np.ones(N), loops=fewer, train=train)
        write_run(root, f"ppo-s{seed}", sft, np.where(sft, 0.5, 0.0), loops=loops, train=train)
    report = Path(compare.table.fn(params)).read_text()
    assert "## Loops" in report
    header = cells(report, "model")
    assert header[1:3] == ["loop rate (sampled at T=0.4, 2 per problem) [95% CI]", "t0.4 vs SFT [95% CI]"]
    grpo = dict(zip(header, cells(report, "grpo", 1)))  # row 0 is the accuracy table
    assert grpo["loop rate (greedy) [95% CI]"] == "0.100 [0.100, 0.100]"
    assert grpo["greedy vs SFT [95% CI]"] == "-0.300 [-0.300, -0.300]"
    assert dict(zip(header, cells(report, "sft", 1)))["loop rate (greedy) [95% CI]"] == "0.400 [0.400, 0.400]"
    run = dict(zip(cells(report, "run"), cells(report, "ppo-s1")))
    assert run["loop rate (greedy)"] == "0.400"
    words = next(line for line in report.splitlines() if line.startswith("- **grpo**"))
    assert "greedy: loop rate 0.100, against SFT significantly lower (-0.300" in words


def test_a_protocol_missing_from_a_problems_file_is_named(workspace):
    root, params = workspace
    path = root / "metrics" / "problems_ppo-s0.parquet"
    pl.read_parquet(path).drop("t0.4_correct").write_parquet(path)
    with pytest.raises(compare.StageError, match=r"problems_ppo-s0.parquet: no column 't0.4_correct'"):
        compare.table.fn(params)


def test_interval_metrics_name_model_protocol_and_interval():
    from components.stats import Estimate

    params = parse_params({"task": "calc", "compare": {"algorithms": ["grpo"], "seeds": [0]}})
    est = {
        "kinds": ["t0.4", "greedy"],
        "loops": False,
        "mean": {(p, m): Estimate(0.5, 0.4, 0.6) for p in ("t0.4", "greedy") for m in ("sft", "grpo")},
        "vs_sft": {(p, "grpo"): Estimate(0.1, -0.1, 0.3) for p in ("t0.4", "greedy")},
    }
    m = compare.interval_metrics(params, est)
    assert m["compare/sft/t0.4/accuracy"] == 0.5 and m["compare/sft/t0.4/accuracy_low"] == 0.4
    assert (
        m["compare/grpo/greedy/accuracy_vs_sft_high"] == 0.3 and "compare/sft/greedy/accuracy_vs_sft" not in m
    )
    assert len(m) == 2 * 3 + 2 * 6  # sft: value and interval per protocol; grpo: and its difference


def add_greedy_escape(root, name: str, correct) -> None:
    """The greedy_escape protocol's per-problem column and eval block added to a run's files."""
    path = root / "metrics" / f"problems_{name}.parquet"
    table = pl.read_parquet(path).with_columns(
        pl.Series("greedy_escape_correct", list(map(float, correct))), pl.lit(1).alias("greedy_escape_n")
    )
    table.write_parquet(path)
    ev = json.loads((root / "metrics" / f"eval_{name}.json").read_text())
    ev["greedy_escape"] = {"accuracy": float(np.mean(correct)), "noop_escapes_per_step": 0.1}
    (root / "metrics" / f"eval_{name}.json").write_text(json.dumps(ev))


def test_escape_protocols_are_protocols_of_their_own(workspace):
    """evaluate.noop_escape_protocols: [greedy] adds greedy_escape beside greedy, its own accuracy and
    difference to SFT, no pass@k; as headline it is named in words, and the intro says what the escape is."""
    root, params = workspace
    sft_and_two_grpo_runs(root)
    report = Path(compare.table.fn(params)).read_text()
    assert "no-op escape" not in report
    sft = np.arange(N) % 2 == 0
    add_greedy_escape(root, "sft", sft | (np.arange(N) % 4 == 1))  # the escape solves a quarter more
    for seed in (0, 1):
        add_greedy_escape(root, f"grpo-s{seed}", np.ones(N))
        add_greedy_escape(root, f"ppo-s{seed}", sft)
    ev = params.evaluate.model_copy(update={"noop_escape_protocols": ["greedy"]})
    head = params.compare.model_copy(update={"headline": "greedy_escape"})
    report = Path(compare.table.fn(params.model_copy(update={"evaluate": ev, "compare": head}))).read_text()
    assert "**Headline protocol: greedy with the no-op escape.**" in report
    assert (
        "resampling a reply that already changed nothing from the same state (up to 4 tries at T=1" in report
    )
    header = cells(report, "algorithm")
    assert header[2] == "accuracy (greedy with the no-op escape) [95% CI]"
    assert header[4] == "accuracy (greedy) [95% CI]"
    assert not any(h.startswith("pass@k (greedy") for h in header)
    grpo = dict(zip(header, cells(report, "grpo")))
    assert grpo["greedy_escape vs SFT [95% CI]"].startswith("+0.250 [")
    assert grpo["greedy vs SFT [95% CI]"] == "+0.000 [0.000, 0.000]"


def test_how_much_the_problem_decides_per_model_and_sampled_protocol(workspace):
    """The share of an episode's success variance between problems: SFT's T=0.4 episodes succeed on
    every even problem and never on an odd one (the problem decides all of it: var over problems with
    ddof 1 over 0.25), PPO's two seeds the same, GRPO's always (no variance: '-'); with one episode per
    problem the noise cannot be told apart and the section is left out."""
    root, params = workspace
    even = (np.arange(N) % 2 == 0).astype(float)
    write_run(root, "sft", even, even / 2, t04=even)
    for seed in (0, 1):
        write_run(
            root,
            f"ppo-s{seed}",
            even,
            even / 2,
            {},
            {"train_wall_time_s": 1.0, "generated_tokens": 1},
            t04=even,
        )
    report = Path(compare.table.fn(params)).read_text()
    assert "## How much the problem decides" in report
    header = cells(report, "model", which=-1)
    assert header == ["model", "sampled at T=0.4, 2 per problem", "sampled at T=1, 2 per problem"]
    share = f"{even.var(ddof=1) / 0.25:.3f}"
    assert cells(report, "sft", which=-1)[1] == share
    assert cells(report, "ppo", which=-1)[1] == f"{share} ({share} to {share})"
    assert cells(report, "grpo", which=-1)[1:] == ["-", "-"]
    one = params.model_copy(update={"evaluate": params.evaluate.model_copy(update={"samples": 1})})
    assert "## How much the problem decides" not in Path(compare.table.fn(one)).read_text()
