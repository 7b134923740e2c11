"""ZeRO-3 (sharded parameters) in the train stage's session, on 1 and 2 CPU ranks (gloo, spawned).

One world per case runs the train stage's calls on an RLSession with a critic, as flows.train makes
them through components.train.rank_mirror: annotate (the actor's old log-probs and the critic's values:
forwards every rank joins under ZeRO-3), update (critic and GRPO actor), save, sync into the hf rollout
engine on rank 0, final_model. Then every rank gathers the actor's full weights
(tests/train/train_helpers.full_weights) to compare with.

Checked: ZeRO-3 on 2 ranks gives the weights of ZeRO-3 on 1 and of ZeRO-0 on 1 (train_helpers.
assert_weights_match, the rule of tests/train/test_data_parallel.py), the same annotations and
metrics; the weights synced into the rollout engine, the final model and the checkpoint's HF weights
equal the gathered trainer weights exactly. Negative control: rank 1's gradients dropped fails the
weight check.
"""

from __future__ import annotations

import random

import pytest
import torch
from train_helpers import (
    ACTOR_KW,
    RL_ENGINE_KW,
    assert_weights_match,
    full_weights,
    session_config,
    tiny_model,
    tiny_tokenizer,
    trajectories,
    with_old_logprobs,
)

from components.train.launch import run_local
from components.train.rl_update import ActorSettings, CriticSettings

LR = RL_ENGINE_KW["lr"]


def _rows() -> list[dict]:
    rows = trajectories(12, seed=7)
    rng = random.Random(1)
    for r in rows:  # 4 groups of 3 trajectories (GRPO's prompt groups)
        r["group_id"] = f"g{int(r['traj_id'][1:]) // 3}"
    adv = {f"t{t}": rng.uniform(-1.5, 1.5) for t in range(12)}
    rows = with_old_logprobs(rows, lambda r: adv[r["traj_id"]])
    return [{**r, "returns": [float(a) for a in r["advantages"]]} for r in rows]


def _cfg(zero_stage: int, rank: int):
    from components.rollout import EngineSettings

    rollout = EngineSettings("hf", dtype="float32", max_model_len=64, kv_cache_gib=0.1, seed=0)
    return session_config(
        critic="token",
        actor_lr=LR,
        critic_lr=LR,
        grad_clip=1e9,
        micro_batch_size=3,
        zero_stage=zero_stage,
        rollout=rollout if rank == 0 else None,  # the stage's followers have no rollout engine
    )


def _session(rank: int, init_dir: str, out: str, zero_stage: int, drop_rank: int) -> None:
    import torch.distributed as dist

    from components.model.tiny import load_hf
    from components.train.rank_mirror import Leader, follow
    from components.train.rl_session import RLSession

    session = RLSession(init_dir, _cfg(zero_stage, rank), tools=None)
    if rank == drop_rank:
        for engine in (session.actor, session.critic):
            backward = engine.backward
            engine.backward = lambda loss, _b=backward, **kw: _b(loss * 0.0, **kw)
    if rank > 0:
        calls = follow(session)
        weights = full_weights(session.actor)  # every rank joins the gather
        assert calls == (5 if zero_stage == 3 else 2), calls  # annotate, update, save, sync, final_model
        return
    lead = Leader(session) if dist.get_world_size() > 1 else session
    rows = lead.annotate(_rows())
    mb = dict(mini_batch_size=10_000, micro_batch_size=3)
    actor_kw = {"temperature": 1.0} | {k: v for k, v in ACTOR_KW.items() if k not in ("pad_id", "seed")} | mb
    metrics = lead.update(
        rows,
        actor=ActorSettings(**actor_kw),
        critic=CriticSettings(value_clip=0.5, epochs=1, **mb),
        seed=ACTOR_KW["seed"],
    )
    lead.save(f"{out}.ckpt", metadata={"iteration": 0})
    lead.sync()
    synced = {k: v.detach().clone() for k, v in session.rollout_engine.model.state_dict().items()}
    final = {k: v.detach().clone() for k, v in lead.final_model().state_dict().items()}
    lead.close()
    weights = full_weights(session.actor)
    saved = {k: v.detach().clone() for k, v in load_hf(f"{out}.ckpt/actor")[0].state_dict().items()}
    torch.save(
        {
            "weights": weights,
            "metrics": metrics,
            "synced": synced,
            "final": final,
            "saved": saved,
            "old_logprobs": [r["old_logprobs"] for r in rows],
            "values": [r["values"] for r in rows],
        },
        out,
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict]:
    init = tmp_path_factory.mktemp("init")
    tiny_model().save_pretrained(init)
    tiny_tokenizer().save_pretrained(init)
    out = {}
    for name, world, stage, drop in (
        ("z0w1", 1, 0, -1),
        ("z3w1", 1, 3, -1),
        ("z3w2", 2, 3, -1),
        ("drop", 2, 3, 1),
    ):
        path = tmp_path_factory.mktemp(name) / "out.pt"
        run_local(world, _session, (str(init), str(path), stage, drop))
        out[name] = torch.load(path)
    return out


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() <= b.keys(), sorted(set(a) - set(b))
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def test_zero3_on_two_ranks_gives_the_weights_of_one(runs):
    one, two, plain = runs["z3w1"], runs["z3w2"], runs["z0w1"]
    start = {k: p.detach().float() for k, p in tiny_model().named_parameters()}
    assert _max_diff(one["weights"], start) > 1e-3  # the update moved the weights: the check is not empty
    print(f"max |w(ZeRO-3, 2 ranks) - w(ZeRO-3, 1 rank)| = {_max_diff(two['weights'], one['weights']):.3g}")
    print(f"max |w(ZeRO-3, 1 rank) - w(ZeRO-0, 1 rank)| = {_max_diff(one['weights'], plain['weights']):.3g}")
    assert_weights_match(two["weights"], one["weights"], lr=LR, steps=1)
    assert_weights_match(one["weights"], plain["weights"], lr=LR, steps=1)
    for key in ("actor/entropy", "critic/vf_loss"):
        assert two["metrics"][key] == pytest.approx(one["metrics"][key], rel=1e-6), key
        assert one["metrics"][key] == pytest.approx(plain["metrics"][key], rel=1e-6), key
    for field in ("old_logprobs", "values"):  # forwards that every rank joined
        a, b = (torch.tensor([x for row in r[field] for x in row]) for r in (two, plain))
        assert torch.allclose(a, b, atol=1e-5), (field, float((a - b).abs().max()))
    with pytest.raises(AssertionError, match="weight"):  # rank 1's gradients dropped
        assert_weights_match(runs["drop"]["weights"], one["weights"], lr=LR, steps=1)


@pytest.mark.parametrize("name", ["z3w1", "z3w2", "z0w1"])
def test_synced_final_and_saved_weights_are_the_trainers(runs, name):
    run = runs[name]
    weights = run["weights"]
    for what in ("synced", "final", "saved"):
        state = run[what]
        assert weights.keys() <= state.keys(), (what, sorted(set(weights) - set(state)))
        for k, w in weights.items():
            assert torch.equal(state[k].float(), w), (what, k)
    # the tied output head is in the state dict (vLLM would keep a stale one without it)
    assert torch.equal(run["synced"]["lm_head.weight"], run["synced"]["model.embed_tokens.weight"])
