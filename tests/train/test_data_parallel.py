"""Data parallel on 2 CPU processes: the same global batch gives the same weights with 1 or 2 ranks.

The cases run in spawned processes (components.train.launch.run_local: a FileStore world, gloo on
loopback, the real DeepSpeed engine): one SFT step (run_sft) and one GRPO actor update (actor_update)
and one critic update, from the same tiny model and the same batch, at world size 1 and 2 (one world
of each size for the three cases, each with its own engine: starting a world costs more than a step). Every rank
passes the whole batch and trains its share of the micro-batches (components.train.engine.train_step).
Tolerance: train_helpers.assert_weights_match, the project's rule for Adam steps from gradients equal
up to float reassociation (here the two ranks' sums are added in another order): every weight within
2% of lr, at most 0.1% of them off by more than 1e-6 (measured: max 1.1e-5 at lr 1e-2 after the SFT
step, where a gradient is ~0 and Adam divides by it); the metrics summed over ranks (loss, entropy,
value loss) to 1e-6 relative. Negative control: rank 1 drops its gradients (its backward is fed
loss * 0) and the same check fails.
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
    random_batch,
    run_actor_update,
    run_critic_update,
    session_config,
    tiny_model,
    trajectories,
    with_old_logprobs,
)

from components.train.launch import run_local
from components.train.rl_update import ActorSettings

LR = RL_ENGINE_KW["lr"]


def _grpo_rows() -> list[dict]:
    rows = trajectories(12, seed=7)
    rng = random.Random(1)
    for r in rows:  # 4 groups of 3 trajectories (GRPO's prompt groups)
        r["group_id"] = f"g{int(r['traj_id'][1:]) // 3}"
    adv = {f"t{t}": rng.uniform(-1.5, 1.5) for t in range(12)}
    return with_old_logprobs(rows, lambda r: adv[r["traj_id"]])


def _model(what: str) -> torch.nn.Module:
    """The tiny policy, or a critic on its backbone (value head at zero, as build_critic makes it)."""
    if what != "critic":
        return tiny_model()
    import tempfile

    from components.train.critic import build_critic

    with tempfile.TemporaryDirectory() as d:
        tiny_model().save_pretrained(d)
        return build_critic(d)


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


# the cases, each with the metric that the two world sizes must agree on
METRIC = {"sft": "loss", "grpo": "entropy", "critic": "vf_loss"}
WHATS = tuple(METRIC)


def _step(rank: int, what: str, out: str, drop_rank: int, model: torch.nn.Module | None = None) -> None:
    """One optimizer step of ``what`` on this rank (of ``model``, or a fresh ``_model(what)``); rank 0
    saves the weights and metrics to ``out``. tests/train/torchrun_world.py runs it under torchrun."""
    from components.train.engine import build_engine
    from components.train.sft import run_sft, split_micro_batches

    model = model if model is not None else _model(what)
    engine = build_engine(model, dtype="fp32", micro_batch_size=2, **RL_ENGINE_KW)
    if rank == drop_rank:  # the negative control: this rank's gradients never reach the all-reduce
        backward = engine.backward
        engine.backward = lambda loss, **kw: backward(loss * 0.0, **kw)
    if what == "sft":
        micro = split_micro_batches(random_batch(8, seed=3), 2)  # 4 micro-batches: 2 per rank
        metrics = run_sft(engine, iter([micro]), steps=1, progress=False)[0]
    else:
        kw = dict(mini_batch_size=10_000, micro_batch_size=3)
        if what == "grpo":
            metrics = run_actor_update(engine, _grpo_rows(), **ACTOR_KW, **kw)
        else:
            rows = [{**r, "returns": [float(a) for a in r["advantages"]]} for r in _grpo_rows()]
            metrics = run_critic_update(
                engine, rows, pad_id=0, per_step=False, value_clip=0.5, epochs=1, seed=0, **kw
            )
    if rank == 0:
        torch.save({"weights": full_weights(engine), "metrics": metrics}, out)


def _steps(rank: int, out_dir: str, drop_rank: int) -> None:
    """``_step`` of each of WHATS in one world (a world's start costs more than its steps), each with
    its own engine, to ``out_dir/<what>.pt``. Every model is built before the first engine: once the
    world is up, transformers' save_pretrained (which build_critic's temporary copy goes through)
    writes its config on rank 0 only."""
    models = {what: _model(what) for what in WHATS}
    for what in WHATS:
        _step(rank, what, f"{out_dir}/{what}.pt", drop_rank, model=models[what])


@pytest.fixture(scope="module")
def worlds(tmp_path_factory) -> dict[str, dict]:
    """Each of WHATS stepped at world size 1, 2, and 2 with rank 1's gradients dropped: three worlds."""
    out = {}
    for name, world, drop_rank in (("one", 1, -1), ("two", 2, -1), ("dropped", 2, 1)):
        d = tmp_path_factory.mktemp(name)
        run_local(world, _steps, (str(d), drop_rank))
        out[name] = {what: torch.load(d / f"{what}.pt") for what in WHATS}
    return out


@pytest.mark.parametrize("what, metric", METRIC.items())
def test_two_ranks_give_the_weights_of_one(worlds, what, metric):
    one, two, dropped = (worlds[name][what] for name in ("one", "two", "dropped"))
    start = {k: p.detach().float().clone() for k, p in _model(what).named_parameters()}
    moved = _max_diff(one["weights"], start)
    assert moved > 1e-3, f"{what}: the step barely moved the weights ({moved}); the check would be empty"
    assert_weights_match(two["weights"], one["weights"], lr=LR, steps=1)
    assert one["metrics"]["n_micro_batches"] == two["metrics"]["n_micro_batches"] > 2
    assert two["metrics"][metric] == pytest.approx(one["metrics"][metric], rel=1e-6)
    with pytest.raises(AssertionError, match="weight"):
        assert_weights_match(dropped["weights"], one["weights"], lr=LR, steps=1)


# --- the train stage's session on 2 ranks (components.train.rank_mirror) -------------------------


def _session_cfg():
    return session_config(  # one plain Adam step as RL_ENGINE_KW; the stage's rollout engine is not checked
        actor_lr=LR,
        critic_lr=LR,
        grad_clip=1e9,
        micro_batch_size=3,
        rollout=None,
    )


def _session_update(rank: int, init_dir: str, out: str, drop_rank: int) -> None:
    """The train stage's calls: rank 0 builds the rows and leads; other ranks only follow (they receive
    the rows through the mirrored call). Rank 0 saves the weights after update + save."""
    import torch.distributed as dist

    from components.train.rank_mirror import Leader, follow
    from components.train.rl_session import RLSession

    session = RLSession(init_dir, _session_cfg(), tools=None)
    if rank == drop_rank:
        backward = session.actor.backward
        session.actor.backward = lambda loss, **kw: backward(loss * 0.0, **kw)
    if rank > 0:
        assert follow(session) == 2  # update and save
        return
    lead = Leader(session) if dist.get_world_size() > 1 else session
    kw = dict(mini_batch_size=10_000, micro_batch_size=3)
    actor_kw = {"temperature": 1.0} | {k: v for k, v in ACTOR_KW.items() if k not in ("pad_id", "seed")} | kw
    metrics = lead.update(_grpo_rows(), actor=ActorSettings(**actor_kw), critic=None, seed=ACTOR_KW["seed"])
    lead.save(f"{out}.ckpt", metadata={"iteration": 0})  # every rank joins DeepSpeed's save
    torch.save({"weights": full_weights(session.actor), "metrics": metrics}, out)
    lead.close()


def _session_run(tmp_path, world: int, drop_rank: int = -1) -> dict:
    from train_helpers import tiny_tokenizer

    init = tmp_path / "init"
    if not init.exists():
        tiny_model().save_pretrained(init)
        tiny_tokenizer().save_pretrained(init)
    out = tmp_path / f"session-w{world}-drop{drop_rank}.pt"
    run_local(world, _session_update, (str(init), str(out), drop_rank))
    return torch.load(out)


def test_train_stage_session_on_two_ranks_gives_the_weights_of_one(tmp_path):
    one, two = _session_run(tmp_path, 1), _session_run(tmp_path, 2)
    assert (
        _max_diff(one["weights"], {k: p.detach().float() for k, p in tiny_model().named_parameters()}) > 1e-3
    )
    assert_weights_match(two["weights"], one["weights"], lr=LR, steps=1)
    assert two["metrics"]["actor/entropy"] == pytest.approx(one["metrics"]["actor/entropy"], rel=1e-6)
    assert (tmp_path / "session-w2-drop-1.pt.ckpt" / "actor" / "steprl_complete.json").is_file()
    dropped = _session_run(tmp_path, 2, drop_rank=1)  # the follower's share never reaches the update
    with pytest.raises(AssertionError, match="weight"):
        assert_weights_match(dropped["weights"], one["weights"], lr=LR, steps=1)
