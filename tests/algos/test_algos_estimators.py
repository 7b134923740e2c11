"""Advantage estimators: hand-derived values, Python-loop references, registry sweep, bad input."""

from __future__ import annotations

import math
import random
import statistics

import pytest
import torch

from components.algos.advantages import ADVANTAGE_ESTIMATORS, get_advantage_estimator

E6 = 1e-6  # group std eps
E8 = 1e-8  # whitening eps

# ---- the hand batch -----------------------------------------------------------------------------
# Two prompt groups (group_index 100 and 200), five trajectories, eight step rows, L = 4.
#   row  traj step group reward n_tokens obs  V_step
HAND = [
    (10, 0, 100, 0.0, 2, 0, 0.2),  # r0
    (10, 1, 100, 1.0, 3, 1, 0.6),  # r1
    (11, 0, 100, 0.5, 1, 0, 0.4),  # r2
    (11, 1, 100, 0.0, 2, 1, 0.0),  # r3
    (14, 0, 100, 0.0, 2, 0, 0.3),  # r4
    (20, 0, 200, 2.0, 4, 0, 1.0),  # r5
    (23, 0, 200, 0.0, 2, 0, 0.5),  # r6
    (23, 1, 200, 1.0, 1, 5, 0.8),  # r7
]
L = 4
LENS = [row[4] for row in HAND]
SHUFFLE = [5, 2, 7, 0, 3, 6, 1, 4]


def hand_inputs(perm: list[int]) -> dict:
    rows = [HAND[i] for i in perm]
    mask = torch.tensor([[1.0] * r[4] + [0.0] * (L - r[4]) for r in rows], dtype=torch.float64)
    return dict(
        rewards=torch.tensor([r[3] for r in rows], dtype=torch.float64),
        response_mask=mask,
        traj_index=torch.tensor([r[0] for r in rows]),
        step_index=torch.tensor([r[1] for r in rows]),
        group_index=torch.tensor([r[2] for r in rows]),
        obs_index=torch.tensor([r[5] for r in rows]),
    )


def run_hand(name: str, perm: list[int], **kw):
    """Run on the hand batch fed in row order ``perm``; return outputs back in HAND order."""
    out = get_advantage_estimator(name)(**hand_inputs(perm), **kw)
    inv = torch.argsort(torch.tensor(perm))
    step_ret = None if out.step_returns is None else out.step_returns[inv]
    return out.advantages[inv], out.returns[inv], step_ret


def per_row_tokens(vals: list[float]) -> torch.Tensor:
    """(B,) hand values on each row's valid tokens of the HAND batch -> (B, L)."""
    return torch.tensor([[v] * n + [0.0] * (L - n) for v, n in zip(vals, LENS)], dtype=torch.float64)


def ragged(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor([r + [0.0] * (L - len(r)) for r in rows], dtype=torch.float64)


def whiten_list(xs: list[float]) -> list[float]:
    m, s = statistics.mean(xs), statistics.stdev(xs)
    return [(x - m) / (s + E8) for x in xs]


PERMS = [list(range(8)), SHUFFLE]

# Trajectory returns S: 10 -> 0+1 = 1, 11 -> 0.5+0 = 0.5, 14 -> 0; 20 -> 2, 23 -> 0+1 = 1.
# group 100: S = (1, 0.5, 0): mean 0.5, deviations (0.5, 0, -0.5), var = 0.5/2, std = 0.5
# group 200: S = (2, 1): mean 1.5, deviations (0.5, -0.5), var = 0.5/1, std = sqrt(0.5)
S_ROWS = [1, 1, 0.5, 0.5, 0, 2, 1, 1]
A0, A1 = 0.5 / (0.5 + E6), 0.5 / (math.sqrt(0.5) + E6)


@pytest.mark.parametrize("perm", PERMS)
def test_grpo_by_hand(perm):
    adv, ret, step_ret = run_hand("grpo", perm, norm_adv=True)  # grpo never whitens
    torch.testing.assert_close(adv, per_row_tokens([A0, A0, 0, 0, -A0, A1, -A1, -A1]))
    torch.testing.assert_close(ret, per_row_tokens(S_ROWS))
    torch.testing.assert_close(step_ret, torch.tensor(S_ROWS, dtype=torch.float64))


@pytest.mark.parametrize("perm", PERMS)
def test_dr_grpo_and_rloo_by_hand(perm):
    adv, _, _ = run_hand("dr_grpo", perm)  # S - mean_g
    torch.testing.assert_close(adv, per_row_tokens([0.5, 0.5, 0, 0, -0.5, 0.5, -0.5, -0.5]))
    # rloo: traj 10: 1 - mean(0.5, 0) = 0.75 (= 3/2 * 0.5); traj 11: 0.5 - mean(1, 0) = 0;
    # traj 14: 0 - 0.75 = -0.75; traj 20: 2 - 1 = 1; traj 23: 1 - 2 = -1
    adv, _, _ = run_hand("rloo", perm)
    torch.testing.assert_close(adv, per_row_tokens([0.75, 0.75, 0, 0, -0.75, 1, -1, -1]))


def test_singleton_group_is_mean0_std1():
    # one trajectory with S = 3 alone in its group: grpo (3-0)/(1+1e-6), dr_grpo 3, rloo 3
    kw = dict(rewards=torch.tensor([1.0, 2.0]), response_mask=torch.ones(2, 2), traj_index=torch.tensor([4, 4]),
              step_index=torch.tensor([0, 1]), group_index=torch.tensor([9, 9]))  # fmt: skip
    assert torch.allclose(ADVANTAGE_ESTIMATORS["grpo"](**kw).advantages, torch.full((2, 2), 3 / (1 + E6)))
    assert torch.allclose(ADVANTAGE_ESTIMATORS["dr_grpo"](**kw).advantages, torch.full((2, 2), 3.0))
    assert torch.allclose(ADVANTAGE_ESTIMATORS["rloo"](**kw).advantages, torch.full((2, 2), 3.0))
    # equal scores in a group: std 0 -> advantage 0, not NaN
    kw.update(
        traj_index=torch.tensor([4, 5]), step_index=torch.tensor([0, 0]), rewards=torch.tensor([1.0, 1.0])
    )
    assert torch.equal(ADVANTAGE_ESTIMATORS["grpo"](**kw).advantages, torch.zeros(2, 2))


# reinforce, gamma = 0.5: G_t = r_t + 0.5 G_{t+1}
# traj 10: G1 = 1, G0 = 0 + 0.5*1 = 0.5;  traj 11: G1 = 0, G0 = 0.5;  traj 14: 0;  traj 20: 2;
# traj 23: G1 = 1, G0 = 0.5.  Over 8 rows: mean 5.5/8 = 0.6875, sum of squared deviations 2.96875.
G_ROWS = [0.5, 1, 0.5, 0, 0, 2, 0.5, 1]


@pytest.mark.parametrize("perm", PERMS)
def test_reinforce_by_hand(perm):
    adv, ret, step_ret = run_hand("reinforce", perm, gamma=0.5, norm_adv=False)
    torch.testing.assert_close(adv, per_row_tokens(G_ROWS))
    torch.testing.assert_close(step_ret, torch.tensor(G_ROWS, dtype=torch.float64))
    adv, ret, _ = run_hand("reinforce", perm, gamma=0.5, norm_adv=True)
    std = math.sqrt(2.96875 / 7)
    torch.testing.assert_close(adv, per_row_tokens([(g - 0.6875) / (std + E8) for g in G_ROWS]))
    torch.testing.assert_close(ret, per_row_tokens(G_ROWS))  # returns are not whitened


# reinforce_pp, gamma = 0.5: reward on the row's last token, discounted back inside the row only
# r1 (reward 1, 3 tokens): [0.25, 0.5, 1];  r2 (0.5, 1 token): [0.5];  r5 (2, 4 tokens):
# [0.25, 0.5, 1, 2];  r7 (1, 1 token): [1];  rows with reward 0: zeros.
RPP = [[0, 0], [0.25, 0.5, 1], [0.5], [0, 0], [0, 0], [0.25, 0.5, 1, 2], [0, 0], [1]]


@pytest.mark.parametrize("perm", PERMS)
def test_reinforce_pp_by_hand(perm):
    adv, _ret, step_ret = run_hand("reinforce_pp", perm, gamma=0.5, norm_adv=False)
    torch.testing.assert_close(adv, ragged(RPP))
    assert step_ret is None
    adv, _, _ = run_hand("reinforce_pp", perm, gamma=0.5, norm_adv=True)  # whiten over 17 tokens
    flat = whiten_list([x for r in RPP for x in r])
    it = iter(flat)
    torch.testing.assert_close(adv, ragged([[next(it) for _ in r] for r in RPP]))


@pytest.mark.parametrize("perm", PERMS)
def test_reinforce_pp_baseline_by_hand(perm):
    dev = [0.5, 0.5, 0, 0, -0.5, 0.5, -0.5, -0.5]  # S - mean_g per row (as dr_grpo)
    adv, _, _ = run_hand("reinforce_pp_baseline", perm, norm_adv=False)
    torch.testing.assert_close(adv, per_row_tokens(dev))
    # whitened over the 17 tokens (each token counts once): mean 2/17
    tokens = [d for d, n in zip(dev, LENS) for _ in range(n)]
    adv, _, _ = run_hand("reinforce_pp_baseline", perm, norm_adv=True)
    it = iter(whiten_list(tokens))
    torch.testing.assert_close(adv, ragged([[next(it) for _ in range(n)] for n in LENS]))


@pytest.mark.parametrize("perm", PERMS)
def test_gae_by_hand_gamma1(perm):
    # gamma = lam = 1, V = 0.1 on every response token: A_j = (reward-to-go) - 0.1, R_j = reward-to-go.
    # traj 10: both steps see the reward 1 of step 1; traj 11: step 0's single token gets 0.5, step 1 0;
    # traj 14: 0; traj 20: 2; traj 23: 1 on both steps.
    values = per_row_tokens([0.1] * 8) + 5.0 * (per_row_tokens([1.0] * 8) == 0)  # garbage outside mask
    inp = hand_inputs(perm)
    inv = torch.argsort(torch.tensor(perm))
    out = ADVANTAGE_ESTIMATORS["gae"](**inp, values=values[perm], gamma=1.0, lam=1.0, norm_adv=False)
    rtg = [1, 1, 0.5, 0, 0, 2, 1, 1]
    torch.testing.assert_close(out.advantages[inv], per_row_tokens([x - 0.1 for x in rtg]))
    torch.testing.assert_close(out.returns[inv], per_row_tokens(rtg))


def test_gae_chains_across_steps_by_hand():
    # Trajectory 23 alone: step 0 has tokens t1, t2 (V 0.5, 0.2, reward 0); step 1 has t3 (V 0.4,
    # reward 1). gamma = lam = 0.5; t2 bootstraps from t3, the first token of the next step:
    # d3 = 1 + 0.5*0 - 0.4 = 0.6            A3 = 0.6
    # d2 = 0 + 0.5*0.4 - 0.2 = 0.0          A2 = 0.0 + 0.25*0.6 = 0.15
    # d1 = 0 + 0.5*0.2 - 0.5 = -0.4         A1 = -0.4 + 0.25*0.15 = -0.3625
    # R = A + V = (0.1375, 0.35, 1.0). Rows are given step 1 first; 99 is padding garbage.
    out = ADVANTAGE_ESTIMATORS["gae"](
        rewards=torch.tensor([1.0, 0.0], dtype=torch.float64),
        response_mask=torch.tensor([[1, 0, 0], [1, 1, 0]]),
        traj_index=torch.tensor([23, 23]), step_index=torch.tensor([1, 0]), group_index=torch.tensor([0, 0]),
        values=torch.tensor([[0.4, 99, 99], [0.5, 0.2, 99]], dtype=torch.float64),
        gamma=0.5, lam=0.5, norm_adv=False,
    )  # fmt: skip
    torch.testing.assert_close(
        out.advantages, torch.tensor([[0.6, 0, 0], [-0.3625, 0.15, 0]], dtype=torch.float64)
    )
    torch.testing.assert_close(
        out.returns, torch.tensor([[1.0, 0, 0], [0.1375, 0.35, 0]], dtype=torch.float64)
    )


# step_gae, gamma = lam = 0.5, V_T = 0:
# traj 10: d1 = 1 - 0.6 = 0.4, A1 = 0.4, R1 = 1.0; d0 = 0 + 0.5*0.6 - 0.2 = 0.1, A0 = 0.1 + 0.25*0.4 = 0.2, R0 = 0.4
# traj 11: d1 = 0 - 0 = 0, A1 = 0, R1 = 0;         d0 = 0.5 + 0.5*0 - 0.4 = 0.1, A0 = 0.1, R0 = 0.5
# traj 14: d0 = 0 - 0.3 = -0.3, A0 = -0.3, R0 = 0
# traj 20: d0 = 2 - 1 = 1, A0 = 1, R0 = 2
# traj 23: d1 = 1 - 0.8 = 0.2, A1 = 0.2, R1 = 1.0; d0 = 0 + 0.5*0.8 - 0.5 = -0.1, A0 = -0.1 + 0.25*0.2 = -0.05, R0 = 0.45
SG_A = [0.2, 0.4, 0.1, 0, -0.3, 1, -0.05, 0.2]
SG_R = [0.4, 1.0, 0.5, 0, 0, 2, 0.45, 1.0]


@pytest.mark.parametrize("perm", PERMS)
def test_step_gae_by_hand(perm):
    values = torch.tensor([r[6] for r in HAND], dtype=torch.float64)[perm]
    inv = torch.argsort(torch.tensor(perm))
    est = ADVANTAGE_ESTIMATORS["step_gae"]
    out = est(**hand_inputs(perm), values=values, gamma=0.5, lam=0.5, norm_adv=False)
    torch.testing.assert_close(out.advantages[inv], per_row_tokens(SG_A))
    torch.testing.assert_close(out.returns[inv], per_row_tokens(SG_R))
    torch.testing.assert_close(out.step_returns[inv], torch.tensor(SG_R, dtype=torch.float64))
    out = est(**hand_inputs(perm), values=values, gamma=0.5, lam=0.5, norm_adv=True)  # whiten over 8 rows
    torch.testing.assert_close(out.advantages[inv], per_row_tokens(whiten_list(SG_A)))


@pytest.mark.parametrize("perm", PERMS)
def test_gigpo_by_hand(perm):
    # Episode term: the grpo advantages. Step term on G (gamma 0.5, = G_ROWS) within step groups
    # (group, obs): (100, 0) rows r0, r2, r4 with G 0.5, 0.5, 0: mean 1/3, var (1/36+1/36+1/9)/2 = 1/12;
    # (100, 1) r1, r3 with G 1, 0: +-0.5/sqrt(0.5); (200, 0) r5, r6 with G 2, 0.5: +-0.75/sqrt(1.125);
    # (200, 5) r7 alone: (1 - 0)/1. obs 0 in groups 100 and 200 are different step groups.
    s1 = math.sqrt(1 / 12) + E6
    step = [(1 / 6) / s1, 0.5 / (math.sqrt(0.5) + E6), (1 / 6) / s1, -0.5 / (math.sqrt(0.5) + E6),
            (-1 / 3) / s1, 0.75 / (math.sqrt(1.125) + E6), -0.75 / (math.sqrt(1.125) + E6), 1 / (1 + E6)]  # fmt: skip
    episode = [A0, A0, 0, 0, -A0, A1, -A1, -A1]
    adv, ret, _ = run_hand("gigpo", perm, gamma=0.5, step_weight=0.5)
    torch.testing.assert_close(adv, per_row_tokens([e + 0.5 * s for e, s in zip(episode, step)]))
    torch.testing.assert_close(ret, per_row_tokens(G_ROWS))
    # step_norm="mean" (verl-agent's mean_norm): the same step groups, G - mean without the division.
    step = [1 / 6, 0.5, 1 / 6, -0.5, -1 / 3, 0.75, -0.75, 1.0]  # r7 alone: the singleton rule, mean 0
    adv, _, _ = run_hand("gigpo", perm, gamma=0.5, step_weight=0.5, step_norm="mean")
    torch.testing.assert_close(adv, per_row_tokens([e + 0.5 * s for e, s in zip(episode, step)]))


# ---- Python-loop references on random batches ---------------------------------------------------


def random_rows(seed: int, width: int = 5) -> list[dict]:
    rng = random.Random(seed)
    rows, traj = [], rng.randint(0, 50)
    for g in range(rng.randint(1, 4)):
        for _ in range(rng.randint(1, 4)):  # 1 trajectory = a singleton group
            traj += rng.randint(1, 5)
            for t in range(rng.randint(1, 4)):
                n = rng.randint(1, width)
                rows.append(dict(traj=traj, step=t, group=3 * g + 1, n=n, obs=rng.randint(0, 1),
                                 reward=rng.choice([0.0, rng.uniform(-1, 2)]), v_step=rng.uniform(-1, 1),
                                 v_tok=[rng.uniform(-1, 1) for _ in range(n)]))  # fmt: skip
    rng.shuffle(rows)
    return rows


def to_inputs(rows: list[dict], width: int = 5) -> dict:
    f64 = torch.float64
    return dict(
        rewards=torch.tensor([r["reward"] for r in rows], dtype=f64),
        response_mask=torch.tensor([[1] * r["n"] + [0] * (width - r["n"]) for r in rows]),
        traj_index=torch.tensor([r["traj"] for r in rows]),
        step_index=torch.tensor([r["step"] for r in rows]),
        group_index=torch.tensor([r["group"] for r in rows]),
        obs_index=torch.tensor([r["obs"] for r in rows]),
        token_values=torch.tensor([r["v_tok"] + [3.0] * (width - r["n"]) for r in rows], dtype=f64),
        step_values=torch.tensor([r["v_step"] for r in rows], dtype=f64),
    )


def steps_of(rows):  # traj -> row ids in step order
    out: dict[int, list[int]] = {}
    for i in sorted(range(len(rows)), key=lambda i: (rows[i]["traj"], rows[i]["step"])):
        out.setdefault(rows[i]["traj"], []).append(i)
    return out


def scores(rows):  # per traj: S, group
    return {
        t: (sum(rows[i]["reward"] for i in ids), rows[ids[0]]["group"]) for t, ids in steps_of(rows).items()
    }


def norm_in_groups(x: dict, key: dict) -> dict:
    """(x - mean) / (stdev + 1e-6) within groups; alone: x."""
    out = {}
    for k in x:
        peers = [x[j] for j in x if key[j] == key[k]]
        mean, std = (statistics.mean(peers), statistics.stdev(peers)) if len(peers) > 1 else (0.0, 1.0)
        out[k] = (x[k] - mean) / (std + E6)
    return out


def ref_grpo(rows, **_):
    sc = scores(rows)
    a = norm_in_groups({t: s for t, (s, _) in sc.items()}, {t: g for t, (_, g) in sc.items()})
    return [[a[r["traj"]]] * r["n"] for r in rows]


def ref_rloo(rows, **_):
    sc = scores(rows)
    out = []
    for r in rows:
        s, g = sc[r["traj"]]
        others = [s2 for t2, (s2, g2) in sc.items() if g2 == g and t2 != r["traj"]]
        out.append([s - statistics.mean(others) if others else s] * r["n"])
    return out


def ref_step_returns(rows, gamma):
    G = [0.0] * len(rows)
    for ids in steps_of(rows).values():
        nxt = 0.0
        for i in reversed(ids):
            G[i] = nxt = rows[i]["reward"] + gamma * nxt
    return G


def ref_reinforce(rows, gamma, norm, **_):
    G = ref_step_returns(rows, gamma)
    A = whiten_list(G) if norm and len(G) > 1 else G
    return [[a] * r["n"] for a, r in zip(A, rows)]


def ref_gigpo(rows, gamma, w, **_):
    ep = ref_grpo(rows)
    G = dict(enumerate(ref_step_returns(rows, gamma)))
    st = norm_in_groups(G, {i: (r["group"], r["obs"]) for i, r in enumerate(rows)})
    return [[e[0] + w * st[i]] * r["n"] for i, (e, r) in enumerate(zip(ep, rows))]


def ref_gae(rows, gamma, lam, norm, **_):
    adv = [[0.0] * r["n"] for r in rows]
    for ids in steps_of(rows).values():
        toks = [(i, j) for i in ids for j in range(rows[i]["n"])]  # the trajectory's tokens in order
        last_gae, next_v = 0.0, 0.0
        for i, j in reversed(toks):
            r = rows[i]["reward"] if j == rows[i]["n"] - 1 else 0.0
            v = rows[i]["v_tok"][j]
            last_gae = r + gamma * next_v - v + gamma * lam * last_gae
            adv[i][j], next_v = last_gae, v
    if norm:
        it = iter(whiten_list([a for row in adv for a in row]))
        adv = [[next(it) for _ in row] for row in adv]
    return adv


def ref_step_gae(rows, gamma, lam, norm, **_):
    A = [0.0] * len(rows)
    for ids in steps_of(rows).values():
        last, next_v = 0.0, 0.0
        for i in reversed(ids):
            v = rows[i]["v_step"]
            A[i] = last = rows[i]["reward"] + gamma * next_v - v + gamma * lam * last
            next_v = v
    if norm and len(A) > 1:
        A = whiten_list(A)
    return [[a] * r["n"] for a, r in zip(A, rows)]


REFS = {"grpo": ref_grpo, "rloo": ref_rloo, "reinforce": ref_reinforce, "gae": ref_gae,
        "step_gae": ref_step_gae, "gigpo": ref_gigpo}  # fmt: skip


@pytest.mark.parametrize("name", sorted(REFS))
@pytest.mark.parametrize("seed", range(6))
def test_vectorised_equals_loop(name, seed):
    rows = random_rows(seed)
    inp = to_inputs(rows)
    gamma, lam, norm = [(1.0, 1.0, True), (0.9, 0.8, True), (0.7, 0.95, False)][seed % 3]
    est = get_advantage_estimator(name)
    values = {"token": inp["token_values"], "step": inp["step_values"], None: None}[est.critic]
    out = est(rewards=inp["rewards"], response_mask=inp["response_mask"], traj_index=inp["traj_index"],
              step_index=inp["step_index"], group_index=inp["group_index"], obs_index=inp["obs_index"],
              values=values, gamma=gamma, lam=lam, norm_adv=norm, step_weight=0.3)  # fmt: skip
    want = REFS[name](rows, gamma=gamma, lam=lam, norm=norm, w=0.3)
    want = torch.tensor([a + [0.0] * (5 - len(a)) for a in want], dtype=torch.float64)
    torch.testing.assert_close(out.advantages, want, atol=1e-9, rtol=1e-9)


# ---- every registry entry on one shared batch ---------------------------------------------------

SHARED = to_inputs(random_rows(123))


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
def test_every_estimator_on_shared_batch(name):
    est = ADVANTAGE_ESTIMATORS[name]
    assert est.critic in ("token", "step", None) and est.name == name
    values = {"token": SHARED["token_values"], "step": SHARED["step_values"], None: None}[est.critic]
    kw = {
        k: SHARED[k]
        for k in ("rewards", "response_mask", "traj_index", "step_index", "group_index", "obs_index")
    }
    out = est(**kw, values=values, gamma=0.9, lam=0.95)
    mask = SHARED["response_mask"].bool()
    B = mask.shape[0]
    for t in (out.advantages, out.returns):
        assert t.shape == mask.shape and t.dtype == torch.float64
        assert torch.isfinite(t).all()
        assert (t[~mask] == 0).all()
    assert out.advantages[mask].abs().sum() > 0
    assert out.step_returns is None or out.step_returns.shape == (B,)
    # rows shuffled -> outputs shuffled the same way
    perm = torch.randperm(B, generator=torch.Generator().manual_seed(0))
    kw2 = {k: v[perm] for k, v in kw.items()}
    out2 = est(**kw2, values=None if values is None else values[perm], gamma=0.9, lam=0.95)
    torch.testing.assert_close(out2.advantages, out.advantages[perm], atol=1e-12, rtol=0)
    # float32 in -> float32 out, and no gradient
    kw3 = dict(kw, rewards=kw["rewards"].float().requires_grad_())
    out3 = est(**kw3, values=None if values is None else values.float().requires_grad_())
    assert out3.advantages.dtype == torch.float32 and not out3.advantages.requires_grad


def test_token_rewards_equal_step_rewards_on_last_token():
    from components.algos.tensor_ops import place_on_last_token

    kw = {k: SHARED[k] for k in ("response_mask", "traj_index", "step_index", "group_index", "obs_index")}
    tok = place_on_last_token(SHARED["rewards"], SHARED["response_mask"])
    for name, est in ADVANTAGE_ESTIMATORS.items():
        values = {"token": SHARED["token_values"], "step": SHARED["step_values"], None: None}[est.critic]
        a = est(rewards=SHARED["rewards"], values=values, gamma=0.9, **kw).advantages
        b = est(rewards=tok, values=values, gamma=0.9, **kw).advantages
        torch.testing.assert_close(a, b, msg=name)


# ---- bad input ----------------------------------------------------------------------------------


def base_kw(**over):
    kw = hand_inputs(list(range(8)))
    kw.pop("obs_index")
    kw.update(over)
    return kw


def test_unknown_name_lists_valid_names():
    with pytest.raises(KeyError) as err:
        get_advantage_estimator("grpoo")
    for name in ("grpo", "dr_grpo", "rloo", "reinforce", "reinforce_pp", "reinforce_pp_baseline", "gae",
                 "step_gae", "gigpo"):  # fmt: skip
        assert repr(name) in str(err.value)


@pytest.mark.parametrize(
    "name, over, match",
    [
        ("gae", {}, r"gae needs values: per-token critic values of shape \(8, 4\)"),
        ("step_gae", {"values": torch.zeros(8, 4)}, r"step_gae needs values of shape \(8,\)"),
        ("gigpo", {}, "gigpo needs obs_index"),
        ("grpo", {"step_index": torch.tensor([0, 1, 0, 1, 0, 0, 0, 0])}, "rows 6 and 7 are both step_index=0 of traj_index=23"),
        ("grpo", {"step_index": torch.tensor([0, 2, 0, 1, 0, 0, 0, 1])}, r"traj_index=10 has steps \[0, 2\].*missing \[1\]"),
        ("grpo", {"group_index": torch.tensor([100, 100, 100, 200, 100, 200, 200, 200])}, r"traj_index=11 has rows in several groups: group_index \[100, 200\]"),
        ("grpo", {"rewards": torch.tensor([0, 1, float("nan"), 0, 0, 0, 0, 0])}, "rewards must be finite; row 2 is nan"),
        ("grpo", {"step_index": torch.tensor([0, 1, 0, 1, 0, 0, 0])}, "step_index has 7 rows but traj_index has 8"),
        ("grpo", {"traj_index": torch.zeros(8)}, "traj_index must be an integer tensor"),
        ("grpo", {"step_index": torch.tensor([0, 1, 0, 1, 0, -1, 0, 1])}, "step_index must be >= 0; row 5"),
        ("grpo", {"rewards": torch.zeros(8, 3)}, r"rewards must have shape \(8,\) or \(8, 4\)"),
        ("reinforce", {"gamma": 1.5}, r"gamma must be in \[0, 1\]"),
    ],
)  # fmt: skip
def test_bad_input_is_named(name, over, match):
    with pytest.raises((ValueError, TypeError), match=match):
        get_advantage_estimator(name)(**base_kw(**over))


def test_bad_mask_is_named():
    mask = hand_inputs(list(range(8)))["response_mask"].clone()
    mask[3] = 0
    with pytest.raises(ValueError, match="response_mask row 3 has no response tokens"):
        get_advantage_estimator("grpo")(**base_kw(response_mask=mask))
    mask[3, 0], mask[4, 1] = 1, 0.5
    with pytest.raises(ValueError, match="response_mask must be 0/1; row 4 column 1 is 0.5"):
        get_advantage_estimator("grpo")(**base_kw(response_mask=mask))


# ---- equal returns give exactly 0 (no float32 rounding noise through std + 1e-6) --------------------


def _equal_return_groups(base: float, steps: int) -> dict:
    """One batch of 1,400 prompt groups: sizes n = 2..8 times 200 float32 values v near ``base``. Each
    trajectory has ``steps`` steps; the last step of every trajectory of a group earns v from the same
    state (obs 1), so that step group has equal returns G = v; earlier steps earn 0.1 * (its index
    in the group) from state 0. With steps = 1 every trajectory of a group scores v."""
    rewards, traj, step, group = [], [], [], []
    t = g = 0
    for n in range(2, 9):
        for k in range(200):
            v = base * (0.9 + 0.001 * k)
            for i in range(n):
                for s in range(steps):
                    rewards.append(v if s == steps - 1 else 0.1 * i)
                    traj.append(t)
                    step.append(s)
                    group.append(g)
                t += 1
            g += 1
    step_t = torch.tensor(step)
    return dict(
        rewards=torch.tensor(rewards, dtype=torch.float32), response_mask=torch.ones(len(step), 1),
        traj_index=torch.tensor(traj), step_index=step_t, group_index=torch.tensor(group),
        obs_index=(step_t == steps - 1).long(), gamma=0.95,
    )  # fmt: skip


@pytest.mark.parametrize("base", [1.0, 10.0, 100.0])
def test_group_of_equal_returns_gives_exactly_zero(base):
    """float32 returns near 1, 10 and 100, group sizes 2-8: a prompt group of equal scores gives grpo,
    gigpo, dr_grpo and rloo advantages of exactly 0, and a gigpo step group of equal returns a step
    term of exactly 0 (A with w = 1 equals A with w = 0 on those rows)."""
    flat = _equal_return_groups(base, steps=1)
    for name in ("grpo", "gigpo", "dr_grpo", "rloo"):
        adv = get_advantage_estimator(name)(**flat).advantages
        assert torch.equal(adv, torch.zeros_like(adv)), (name, adv.abs().max().item())
    batch = _equal_return_groups(base, steps=2)
    last = batch["step_index"] == 1
    gigpo = get_advantage_estimator("gigpo")
    with_step = gigpo(**batch, step_weight=1.0).advantages[last]
    without = gigpo(**batch, step_weight=0.0).advantages[last]
    assert torch.equal(with_step, without), (with_step - without).abs().max().item()


@pytest.mark.parametrize("name", ["reinforce", "reinforce_pp", "reinforce_pp_baseline", "gae", "step_gae"])
@pytest.mark.parametrize("base", [-0.1, 0.97, 10.0, 100.0])
def test_whitening_equal_advantages_gives_exactly_zero(name, base):
    """Every row earning the same float32 reward (no discounting, one step each, a zero critic): the
    advantages before whitening are all equal (or all 0), and whitened they are exactly 0 at every
    magnitude; the float32 mean of equal values missed them by an ulp, which whitening (std + 1e-8)
    turned into advantages of about +-0.4 to +-0.9 (0.97 over 7 rows, -0.1 over 100)."""
    n = 7 if base == 0.97 else 100
    kw = dict(
        rewards=torch.full((n,), base), response_mask=torch.ones(n, 1), traj_index=torch.arange(n),
        step_index=torch.zeros(n, dtype=torch.long), group_index=torch.zeros(n, dtype=torch.long), gamma=1.0,
        norm_adv=True,
    )  # fmt: skip
    if name in ("gae", "step_gae"):
        kw.update(values=torch.zeros(n, 1) if name == "gae" else torch.zeros(n), lam=1.0)
    adv = get_advantage_estimator(name)(**kw).advantages
    assert torch.equal(adv, torch.zeros_like(adv)), adv.abs().max().item()


def test_group_center_keeps_a_real_spread():
    """A spread well above rounding (1e-3 of 100) is normalised as before, not zeroed."""
    out = get_advantage_estimator("grpo")(
        rewards=torch.tensor([100.0, 100.1]), response_mask=torch.ones(2, 1), traj_index=torch.arange(2),
        step_index=torch.zeros(2, dtype=torch.long), group_index=torch.zeros(2, dtype=torch.long),
    )  # fmt: skip
    assert out.advantages[:, 0].tolist() == pytest.approx([-1 / math.sqrt(2), 1 / math.sqrt(2)], rel=1e-3)
