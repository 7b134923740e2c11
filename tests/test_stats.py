"""components/stats.py: per-problem results, bootstrap intervals (calibrated, paired), curve bands."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from components.stats import (
    Estimate,
    between_problem_share,
    curve_band,
    difference_interval,
    explained_variance_interval,
    mean_interval,
    problem_results,
    score_matrix,
)

# --- bootstrap intervals ----------------------------------------------------------------------------


def test_interval_covers_the_true_mean_at_least_95_percent_of_the_time_and_is_not_vacuous():
    """Calibration: RL seeds whose accuracies scatter around 0.3 (a seed effect), each evaluated on
    its own draw of 200 Bernoulli problems. The crossed seed x problem bootstrap is conservative
    (it counts the per-episode noise in both directions), so the 95% interval covers the population
    mean 0.3 at least about 95% of the time -- but it is not vacuous: at most 1.6x the width of the
    normal interval from the true standard error."""
    rng = np.random.default_rng(123)
    hits, widths = 0, []
    trials, n_seeds, n_problems, seed_sd = 200, 3, 200, 0.03
    for t in range(trials):
        p = 0.3 + rng.normal(0, seed_sd, n_seeds)
        scores = (rng.random((n_seeds, n_problems)) < p[:, None]).astype(float)
        e = mean_interval(scores, n_resamples=1000, seed=t)
        hits += e.low <= 0.3 <= e.high
        widths.append(e.high - e.low)
    assert hits / trials >= 0.93, hits / trials
    se = np.sqrt(0.3 * 0.7 / n_seeds / n_problems + seed_sd**2 / n_seeds)
    assert np.mean(widths) < 1.6 * 2 * 1.96 * se, (np.mean(widths), se)


def test_seed_spread_widens_the_interval():
    """Two seeds that disagree (0.2 vs 0.8 accuracy) leave the mean uncertain whatever the number of
    problems: the interval spans most of the gap, where a problems-only interval would be narrow."""
    rng = np.random.default_rng(4)
    scores = np.stack([rng.random(2000) < 0.2, rng.random(2000) < 0.8]).astype(float)
    e = mean_interval(scores)
    assert e.low < 0.3 and e.high > 0.7, e
    agree = mean_interval(np.stack([scores[0], scores[0]]))  # same results twice: no seed spread
    assert agree.high - agree.low < 0.1, agree


def test_interval_contains_its_estimate_and_shrinks_with_more_problems():
    rng = np.random.default_rng(0)
    small = mean_interval((rng.random((2, 100)) < 0.6).astype(float))
    large = mean_interval((rng.random((2, 4000)) < 0.6).astype(float))
    for e in (small, large):
        assert e.low < e.value < e.high
    assert (large.high - large.low) < 0.4 * (small.high - small.low)


def test_clear_difference_excludes_zero_identical_inputs_include_it():
    rng = np.random.default_rng(1)
    sft = (rng.random(500) < 0.5).astype(float)
    better = np.maximum(sft, (rng.random((2, 500)) < 0.3))  # fixes about 30% of SFT's failures per seed
    d = difference_interval(better, sft)
    assert d.excludes_zero and d.low > 0, d
    assert np.isclose(d.value, better.mean() - sft.mean())
    same = difference_interval(np.stack([sft, sft]), sft)
    assert (same.value, same.low, same.high) == (0.0, 0.0, 0.0) and not same.excludes_zero
    noise = difference_interval((rng.random((2, 500)) < 0.5).astype(float), (rng.random((2, 500)) < 0.5))
    assert noise.low < noise.value < noise.high


def test_difference_is_paired_on_problems():
    """Problems vary wildly in difficulty, but one model is exactly 0.05 better on every problem: paired on
    problems the difference is certain; an unpaired comparison of the two means could not tell."""
    rng = np.random.default_rng(2)
    base = rng.random(300) * 0.9
    d = difference_interval(base + 0.05, base)
    assert np.isclose(d.value, 0.05) and np.isclose(d.low, 0.05) and np.isclose(d.high, 0.05)
    a, b = mean_interval(base + 0.05), mean_interval(base)
    assert a.low < b.high  # the separate intervals overlap


def test_difference_averages_each_side_over_its_own_seeds():
    a = np.array([[1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 1.0]])  # 2 seeds: per-problem means .5 0 1 1
    b = np.array([0.0, 0.0, 1.0, 0.0])
    assert np.isclose(difference_interval(a, b).value, (0.5 + 0 + 0 + 1) / 4)


def test_same_seed_same_interval_and_sign_symmetry():
    rng = np.random.default_rng(3)
    a, b = rng.random((2, 100)), rng.random((2, 100))
    assert difference_interval(a, b, seed=5) == difference_interval(a, b, seed=5)
    ab, ba = difference_interval(a, b, seed=5), difference_interval(b, a, seed=5)
    assert np.isclose(ab.value, -ba.value)
    # the draws differ (each model's seeds are drawn in argument order), the intervals agree to
    # Monte Carlo error
    assert abs(ab.low + ba.high) < 0.01 and abs(ab.high + ba.low) < 0.01, (ab, ba)


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda: mean_interval(np.zeros((2, 3, 4)), what="grpo"), ["grpo", "(seeds, problems)", "(2, 3, 4)"]),
        (lambda: mean_interval(np.zeros((2, 1)), what="grpo"), ["grpo", "2 problems", "1 problem"]),
        (lambda: mean_interval(np.zeros((0, 5)), what="grpo"), ["grpo", "0 seed"]),
        (lambda: mean_interval([[0.0, np.nan, 1.0]], what="ppo"), ["ppo", "finite", "problem 1", "nan"]),
        (lambda: mean_interval([["a", "b"]], what="ppo"), ["ppo", "numbers"]),
        (
            lambda: difference_interval(np.zeros((2, 5)), np.zeros(4), what=("grpo", "sft")),
            ["grpo has 5 problems", "sft has 4"],
        ),
        (lambda: mean_interval(np.zeros(5), confidence=95), ["confidence", "95"]),
    ],
)
def test_bad_input_names_what_is_wrong(call, words):
    with pytest.raises(ValueError) as err:
        call()
    for w in words:
        assert w in str(err.value), (w, str(err.value))


def test_estimate_format_and_significance():
    assert Estimate(0.0123, -0.004, 0.03).format(signed=True) == "+0.012 [-0.004, 0.030]"
    assert Estimate(0.5, 0.45, 0.55).format() == "0.500 [0.450, 0.550]"
    assert Estimate(-0.0, -0.0, -0.0001).format(signed=True) == "+0.000 [0.000, 0.000]"  # never "-0.000"
    assert Estimate(-0.02, -0.03, -0.01).excludes_zero and not Estimate(0.02, 0.0, 0.04).excludes_zero


# --- per-problem results -------------------------------------------------------------------------


def step(traj, group, correct, reward=0.0):
    return {"traj_id": traj, "group_id": group, "correct": correct, "reward": reward}


def test_problem_results_greedy_and_sampled():
    greedy = [
        step("a", "a", False, -0.1),
        step("a", "a", True, 10.9),
        step("b", "b", False, -0.1),
    ]  # a: correct at its 2nd step
    sampled = [
        step("a#0", "a", True),
        step("a#1", "a", False),
        step("a#1", "a", False),
        step("b#0", "b", False),
        step("b#1", "b", False),
    ]
    df = problem_results(["b", "a"], greedy, sampled)
    assert df.to_dicts() == [
        {"id": "b", "correct": 0, "sampled_correct": 0.0, "n_sampled": 2, "return": -0.1, "turns": 1},
        {"id": "a", "correct": 1, "sampled_correct": 0.5, "n_sampled": 2, "return": 10.8, "turns": 2},
    ]
    only = problem_results(["a", "b"], greedy)
    assert only["sampled_correct"].to_list() == [None, None] and only["n_sampled"].to_list() == [0, 0]


def test_problem_results_errors():
    greedy = [step("a", "a", True)]
    with pytest.raises(ValueError, match=r"1 problem\(s\) have no greedy episode: \['b'\]"):
        problem_results(["a", "b"], greedy)
    with pytest.raises(ValueError, match=r"sampled episodes of problems not evaluated: \['z'\]"):
        problem_results(["a"], greedy, [step("z#0", "z", True)])
    with pytest.raises(ValueError, match="problem 'a' has 2 greedy episodes"):
        problem_results(["a"], greedy + [step("a2", "a", False)])
    with pytest.raises(ValueError, match="step record 0 has no 'correct'"):
        problem_results(["a"], [{"traj_id": "a", "group_id": "a"}])


def test_score_matrix_aligns_rows_to_the_reference_order():
    t0 = pl.DataFrame({"id": ["x", "y", "z"], "correct": [1, 0, 1]})
    t1 = pl.DataFrame({"id": ["z", "x", "y"], "correct": [0, 1, 1]})
    m = score_matrix({"s0": t0, "s1": t1}, "correct", ["y", "z", "x"])
    assert m.tolist() == [[0.0, 1.0, 1.0], [1.0, 0.0, 1.0]]


def test_score_matrix_errors_name_the_table():
    ok = pl.DataFrame({"id": ["x", "y"], "correct": [1, 0], "sampled_correct": [0.5, None]})
    with pytest.raises(ValueError, match=r"problems_grpo-s1.parquet: .*missing \['y'\], extra \['w'\]"):
        score_matrix(
            {"ok": ok, "problems_grpo-s1.parquet": ok.with_columns(id=pl.Series(["x", "w"]))},
            "correct",
            ["x", "y"],
        )
    with pytest.raises(
        ValueError, match=r"t: column 'sampled_correct' is null for 1 problem\(s\), e.g. \['y'\]"
    ):
        score_matrix({"t": ok}, "sampled_correct", ["x", "y"])
    with pytest.raises(ValueError, match=r"t: no column 'nope'"):
        score_matrix({"t": ok}, "nope", ["x", "y"])


# --- curve bands ----------------------------------------------------------------------------------


def test_curve_band_mean_min_max_where_every_run_has_a_value():
    s0 = pl.DataFrame({"iteration": [-1, 0, 1, 2], "val_accuracy": [0.5, None, 0.6, 0.7]})
    s1 = pl.DataFrame(
        {
            "iteration": [-1, 0, 1],
            "val_accuracy": [
                0.5,
                0.4,
                0.8,
            ],
        }
    )
    band = curve_band({"s0": s0, "s1": s1}, "iteration", "val_accuracy")
    assert band["iteration"].to_list() == [-1, 1]
    assert np.allclose(band["mean"].to_list(), [0.5, 0.7])
    assert band["low"].to_list() == [0.5, 0.6] and band["high"].to_list() == [0.5, 0.8]
    with pytest.raises(ValueError, match=r"s1: no column 'score_mean'"):
        curve_band({"s0": s0.with_columns(score_mean=pl.lit(1.0)), "s1": s1}, "iteration", "score_mean")
    with pytest.raises(ValueError, match="iteration 1 appears twice"):
        curve_band({"s0": pl.concat([s0, s0.tail(2)])}, "iteration", "val_accuracy")


def _fractions(p: np.ndarray, k: int, seed: int = 0) -> np.ndarray:
    """Each problem's fraction of k Bernoulli(p_i) episodes that succeed."""
    return np.random.default_rng(seed).binomial(k, p) / k


@pytest.mark.parametrize("k", [2, 4, 8])
def test_between_problem_share_recovers_the_variance_of_the_success_rates(k):
    # half the problems at 0.2, half at 0.8: Var(p) = 0.09 of a total 0.25, a share of 0.36
    p = np.repeat([0.2, 0.8], 20_000)
    assert between_problem_share(_fractions(p, k), k) == pytest.approx(0.36, abs=0.015)


def test_between_problem_share_is_about_0_when_every_problem_is_the_same_coin():
    # the raw variance of the fractions is all binomial noise (0.25 / k): it must not be read as share
    share = between_problem_share(_fractions(np.full(40_000, 0.5), 4), 4)
    assert abs(share) < 0.01


def test_between_problem_share_subtracts_no_noise_when_each_problem_is_all_or_nothing():
    f = np.array([0.0, 1.0, 1.0, 0.0, 1.0])
    assert between_problem_share(f, 4) == pytest.approx(f.var(ddof=1) / 0.24)


def test_between_problem_share_needs_two_episodes_and_some_variation():
    assert between_problem_share([0.0, 1.0, 1.0], 1) is None
    assert between_problem_share([1.0, 1.0, 1.0], 4) is None
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        between_problem_share([0.5, 1.5], 4)
    with pytest.raises(ValueError, match=">= 2 problems"):
        between_problem_share([0.5], 4)


# --- a critic's explained variance on one batch ----------------------------------------------------


def _ev(r, v) -> float:
    r, v = np.concatenate(r), np.concatenate(v)
    return 1 - np.var(r - v, ddof=1) / np.var(r, ddof=1)


def test_explained_variance_interval_value_is_the_plain_figure_and_the_interval_holds_it():
    rng = np.random.default_rng(3)
    # 60 trajectories of 3-8 entries: a return per trajectory, a value that knows half of it
    outcome = rng.normal(size=60)
    returns = [np.full(rng.integers(3, 9), o) for o in outcome]
    values = [0.5 * r + rng.normal(scale=0.3, size=len(r)) for r in returns]
    est = explained_variance_interval(returns, values, n_resamples=2_000)
    assert est.value == pytest.approx(_ev(returns, values), abs=1e-9)
    assert est.low < est.value < est.high
    # the interval resamples whole trajectories: about as wide as the spread of the figure over
    # independent batches of 60 trajectories, not the much narrower one of entries drawn one by one
    batches = []
    for _ in range(200):
        o = rng.normal(size=60)
        r = [np.full(rng.integers(3, 9), x) for x in o]
        batches.append(_ev(r, [0.5 * x + rng.normal(scale=0.3, size=len(x)) for x in r]))
    assert 0.5 < (est.high - est.low) / (2 * 1.96 * np.std(batches)) < 2.0


def test_explained_variance_interval_of_a_perfect_and_of_a_useless_critic():
    returns = [[1.0, 1.0], [0.0, 0.0, 0.0], [2.0], [0.5, 0.5]]
    perfect = explained_variance_interval(returns, returns)
    assert (perfect.value, perfect.low, perfect.high) == (1.0, 1.0, 1.0)
    mean = float(np.concatenate(returns).mean())
    constant = explained_variance_interval(returns, [[mean] * len(r) for r in returns])
    assert constant.value == pytest.approx(0.0, abs=1e-12)
    assert constant.high <= 1e-12  # a constant value never explains anything; resamples go below 0


@pytest.mark.parametrize("level", [0.0, 0.971875, 10.0, 100.0])
def test_explained_variance_interval_of_returns_that_do_not_vary_is_zero(level):
    # float sums of equal returns are not exactly 0 in variance; the figure must still be 0, not noise
    returns = [[level] * 9 for _ in range(20)]
    values = [[level + 0.1 * (i % 3)] * 9 for i in range(20)]
    est = explained_variance_interval(returns, values)
    assert (est.value, est.low, est.high) == (0.0, 0.0, 0.0)


def test_explained_variance_interval_rejects_mismatched_groups():
    with pytest.raises(ValueError, match="2 return groups, 1 value groups"):
        explained_variance_interval([[1.0], [2.0]], [[1.0]])
    with pytest.raises(ValueError, match="group 1 has 2 returns and 1 values"):
        explained_variance_interval([[1.0], [2.0, 3.0]], [[1.0], [2.0]])
