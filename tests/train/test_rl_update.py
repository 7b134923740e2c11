"""The RL update's token tensors and optimizer steps: packing, trajectory-whole mini-batches,
micro-batch invariance and the direction of a policy-gradient step."""

from __future__ import annotations

import pytest
import torch
from train_helpers import (
    ACTOR_KW,
    RL_ENGINE_KW,
    GradCapture,
    run_actor_update,
    tiny_model,
    trajectories,
    with_old_logprobs,
)

from components.train.critic import build_critic
from components.train.engine import build_engine
from components.train.policy import critic_values, make_token_batch, pack_sequences, response_logprobs
from components.train.rl_update import _mini_batches, trajectory_chunks


def test_pack_sequences_reads_prefixes_from_the_longest_chain():
    seqs = [[1, 2], [1, 2, 3, 4], [5, 6], [1, 2, 3], [1, 9]]
    hosts, where = pack_sequences(seqs)
    assert sorted(map(tuple, hosts)) == [(1, 2, 3, 4), (1, 9), (5, 6)]
    for s, h in zip(seqs, where):
        assert hosts[h][: len(s)] == s


def test_packed_batch_gives_the_same_logprobs_values_and_entropy():
    rows = trajectories(6)
    prompts, responses = [r["prompt_ids"] for r in rows], [r["response_ids"] for r in rows]
    packed = make_token_batch(prompts, responses, pad_id=0)
    plain = make_token_batch(prompts, responses, pad_id=0, pack=False)
    assert packed.input_ids.size(0) == 6 < plain.input_ids.size(0) == len(rows)
    model = tiny_model().eval()
    with torch.no_grad():
        lp_a, ent_a = response_logprobs(model, packed, temperature=0.7, with_entropy=True)
        lp_b, ent_b = response_logprobs(model, plain, temperature=0.7, with_entropy=True)
    assert torch.allclose(lp_a, lp_b, atol=1e-5) and torch.allclose(ent_a, ent_b, atol=1e-5)
    assert (lp_a != 0).sum() == sum(len(r) for r in responses)  # every response token scored

    critic = build_critic_from(model)
    with torch.no_grad():
        for per_step in (True, False):
            va = critic_values(critic, packed, per_step=per_step)
            vb = critic_values(critic, plain, per_step=per_step)
            assert torch.allclose(va, vb, atol=1e-5)


def build_critic_from(model: torch.nn.Module) -> torch.nn.Module:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        critic = build_critic(d).eval()
    with torch.no_grad():  # a non-zero head, so values differ between positions
        for p in critic.score.parameters():
            p.normal_(0, 0.1, generator=torch.Generator().manual_seed(0))
    return critic


@pytest.mark.parametrize("size,micro", [(4, 2), (7, 3), (100, 100), (1, 1)])
def test_mini_batches_keep_groups_and_trajectories_whole_and_use_every_row_once_per_epoch(size, micro):
    rows = [
        {**r, "group_id": f"g{int(r['traj_id'][1:]) // 2}"} for r in trajectories(10, seed=1)
    ]  # 2 per prompt
    traj = [r["traj_id"] for r in rows]
    group = [r["group_id"] for r in rows]
    plan = _mini_batches(rows, size, micro, epochs=2, seed=0)
    seen = [i for step in plan for m in step for i in m]
    assert sorted(seen) == sorted(list(range(len(rows))) * 2)
    for step in plan:
        in_step = [i for m in step for i in m]
        for g in {group[i] for i in in_step}:  # all of a group's rows are in this optimizer step
            assert sum(group[i] == g for i in in_step) == group.count(g)
        assert len(in_step) <= max(size, 6)  # a group (2 trajectories of <= 3 steps) alone may exceed size
        for m in step:
            assert len(m) <= max(micro, 3)
            for t in {traj[i] for i in m}:  # all of a trajectory's rows are in this micro-batch
                assert sum(traj[i] == t for i in m) == traj.count(t)


def test_trajectory_chunks_cover_rows_once():
    rows = trajectories(9, seed=2)
    chunks = trajectory_chunks(rows, 5)
    assert sorted(i for c in chunks for i in c) == list(range(len(rows)))
    assert all(len(c) <= 5 for c in chunks)


def _actor_step(
    rows: list[dict], micro: int, dtype: str = "fp32", **kw
) -> tuple[torch.nn.Module, dict[str, torch.Tensor], dict[str, float]]:
    """The actor after one actor_update over ``rows`` (one optimizer step), the gradient it took and
    the update's metrics."""
    engine = build_engine(tiny_model(), dtype=dtype, micro_batch_size=micro, **RL_ENGINE_KW)
    base = dict(ACTOR_KW, mini_batch_size=len(rows), micro_batch_size=micro)
    capture = GradCapture(engine)
    metrics = run_actor_update(engine, rows, **{**base, **kw})
    capture.close()
    return engine.module, capture.grads, metrics


def _update(rows: list[dict], micro: int, **kw) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """:func:`_actor_step` without the metrics."""
    model, grads, _ = _actor_step(rows, micro, **kw)
    return model, grads


def test_actor_update_raises_logprob_of_positive_advantage_and_lowers_negative():
    rows = with_old_logprobs(
        trajectories(8, seed=3), lambda r: 1.0 if int(r["traj_id"][1:]) % 2 == 0 else -1.0
    )
    after = _update(rows, micro=4)[0].eval()
    batch = make_token_batch([r["prompt_ids"] for r in rows], [r["response_ids"] for r in rows], pad_id=0)
    with torch.no_grad():
        new, _ = response_logprobs(after, batch)
    for i, r in enumerate(rows):
        n = len(r["response_ids"])
        delta = (new[i, :n] - torch.tensor(r["old_logprobs"])).sum().item()
        assert delta > 0 if r["advantages"][0] > 0 else delta < 0, (r["traj_id"], delta)


def test_actor_update_does_not_depend_on_micro_batch_size():
    rows = with_old_logprobs(trajectories(8, seed=4), lambda r: (int(r["traj_id"][1:]) % 5 - 2) / 2)
    for agg in ("token-mean", "seq-mean-token-mean", "traj-mean-token-mean"):
        _, ga = _update(rows, micro=1, loss_agg=agg)
        _, gb = _update(rows, micro=64, loss_agg=agg)
        assert ga.keys() == gb.keys() and ga
        for name in ga:
            assert torch.allclose(ga[name], gb[name], atol=1e-7, rtol=1e-4), (agg, name)


def test_traj_mean_weighs_each_trajectory_the_same_through_the_update():
    # At ratio 1 the PPO gradient is linear in the advantages, so traj-mean-token-mean on advantages A
    # is token-mean on A * tokens / (trajectories * the row's trajectory's tokens); trajectories of
    # 1-3 steps split over micro-batches of 1 row (the ids must reach every micro-batch's loss).
    rows = with_old_logprobs(trajectories(8, seed=6), lambda r: (int(r["traj_id"][1:]) % 3 - 1) * 1.0)
    tokens = {}
    for r in rows:
        tokens[r["traj_id"]] = tokens.get(r["traj_id"], 0) + len(r["response_ids"])
    total, n = sum(tokens.values()), len(tokens)
    assert len(set(tokens.values())) > 1  # trajectories of different lengths: the modes differ
    scaled = [
        {**r, "advantages": [a * total / (n * tokens[r["traj_id"]]) for a in r["advantages"]]} for r in rows
    ]
    _, g_traj = _update(rows, micro=1, loss_agg="traj-mean-token-mean")
    _, g_tok = _update(scaled, micro=3, loss_agg="token-mean")
    _, g_plain = _update(rows, micro=3, loss_agg="token-mean")
    assert g_traj.keys() == g_tok.keys() and g_traj
    for name in g_traj:
        assert torch.allclose(g_traj[name], g_tok[name], atol=1e-7, rtol=1e-4), name
    assert any(not torch.allclose(g_traj[k], g_plain[k], atol=1e-6, rtol=1e-3) for k in g_traj)


def test_detached_old_logprobs_are_the_exact_ones_whatever_the_rows_say():
    """On-policy, old = this forward's own log-probs: the same step as exact old log-probs, even when
    the rows' (rollout) log-probs are off, e.g. by a bf16 sampler; with those stale ones it differs."""
    rows = with_old_logprobs(trajectories(8, seed=5), lambda r: (int(r["traj_id"][1:]) % 3 - 1) * 1.0)
    _, exact = _update(rows, micro=4)
    off = [{**r, "old_logprobs": [x + 0.3 for x in r["old_logprobs"]]} for r in rows]
    _, detached = _update(off, micro=4, detach_old=True)
    _, stale = _update(off, micro=4)
    assert exact.keys() == detached.keys() and exact
    for name in exact:
        assert torch.allclose(detached[name], exact[name], atol=1e-7, rtol=1e-5), name
    assert any(not torch.allclose(stale[n], exact[n], atol=1e-7, rtol=1e-5) for n in exact)


def test_detached_update_reports_the_rollout_logprob_gap():
    rows = with_old_logprobs(trajectories(6, seed=6), lambda r: 1.0)
    off = [{**r, "old_logprobs": [x - 0.25 for x in r["old_logprobs"]]} for r in rows]
    _, _, metrics = _actor_step(off, micro=4, detach_old=True)
    assert metrics["logprob_gap"] == pytest.approx(0.25, abs=1e-5)


def test_critic_has_no_dropout_so_its_training_forward_is_deterministic():
    critic = build_critic_from(tiny_model()).train()  # train mode: dropout would be active
    assert critic.dropout.p == 0.0
    batch = make_token_batch([[1, 5, 6, 7]], [[8, 9]], pad_id=0)
    with torch.no_grad():
        a = critic_values(critic, batch, per_step=False)
        b = critic_values(critic, batch, per_step=False)
    assert torch.equal(a, b)


def test_actor_update_reports_the_clipped_share_of_each_optimizer_step():
    """Exact old log-probs: the first optimizer step's ratio is 1 (nothing clipped); after it, GSPO's
    tight clip range (3e-4 / 4e-4) clips the next mini-batch's rows. The mean over steps is kept."""
    rows = with_old_logprobs(trajectories(8, seed=7), lambda r: 1.0 if int(r["traj_id"][1:]) % 2 else -1.0)
    size = 6
    steps = len(_mini_batches(rows, size, 64, epochs=1, seed=0))
    assert steps >= 2
    engine = build_engine(tiny_model(), dtype="fp32", micro_batch_size=64, **RL_ENGINE_KW)
    kw = dict(ACTOR_KW, policy_loss="gspo", loss_agg="seq-mean-token-mean", clip_low=3e-4, clip_high=4e-4)
    metrics = run_actor_update(engine, rows, **kw, mini_batch_size=size, micro_batch_size=64)
    per_step = [metrics[f"pg_clipfrac/step_{j}"] for j in range(steps)]
    assert f"pg_clipfrac/step_{steps}" not in metrics
    assert per_step[0] == 0.0
    assert min(per_step[1:]) > 0.0
    assert metrics["pg_clipfrac"] == pytest.approx(sum(per_step) / steps)
