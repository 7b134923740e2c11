"""The data-parallel cases of tests/train, each world size run once (tests/train/conftest.py's
``rank_worlds``): starting a world (every rank a spawned interpreter importing torch, transformers and
DeepSpeed) costs more than all its steps, so one world runs every case, each on engines of its own.

Cases (components.train.launch.run_local: a FileStore world, gloo on loopback, the real DeepSpeed
engine), all from the same tiny model and the same batch:

- ``sft``, ``grpo``, ``critic`` (:func:`step`): one optimizer step of one engine: an SFT step
  (run_sft), a GRPO actor update, a critic update. Every rank passes the whole batch and trains its
  share of the micro-batches (components.train.engine.train_step). tests/train/torchrun_world.py runs
  ``step(rank, "sft", ...)`` under torchrun.
- ``session-z0``, ``session-z3`` (:func:`session`): the train stage's calls on an RLSession with a
  token critic at ZeRO stage 0 and 3, as flows.train makes them through components.train.rank_mirror:
  annotate, update (critic and GRPO actor), save, sync into the hf rollout engine on rank 0,
  final_model; then every rank gathers the actor's full weights.

A world of 2 runs every case twice: as is, then with rank 1's gradients dropped (its engines'
backward fed ``loss * 0``: the negative control of every weight check). Each case seeds torch and
``random`` first, so a case's result does not depend on the cases before it in its world. The ZeRO-3
sessions run after every ZeRO-0 case.
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

import torch
from train_helpers import (
    ACTOR_KW,
    RL_ENGINE_KW,
    full_weights,
    random_batch,
    run_actor_update,
    run_critic_update,
    session_config,
    tiny_model,
    tiny_tokenizer,
    trajectories,
    with_old_logprobs,
)

LR = RL_ENGINE_KW["lr"]
# the one-engine cases, each with the metric that the two world sizes must agree on
METRIC = {"sft": "loss", "grpo": "entropy", "critic": "vf_loss"}
STEPS = tuple(METRIC)
SESSIONS = {"session-z0": 0, "session-z3": 3}  # case -> ZeRO stage


def grpo_rows() -> list[dict]:
    """12 multi-turn trajectories in 4 GRPO groups of 3, random advantages, the tiny model's log-probs."""
    rows = trajectories(12, seed=7)
    rng = random.Random(1)
    for r in rows:
        r["group_id"] = f"g{int(r['traj_id'][1:]) // 3}"
    adv = {f"t{t}": rng.uniform(-1.5, 1.5) for t in range(12)}
    return with_old_logprobs(rows, lambda r: adv[r["traj_id"]])


def critic_rows() -> list[dict]:
    return [{**r, "returns": [float(a) for a in r["advantages"]]} for r in grpo_rows()]


def model(what: str) -> torch.nn.Module:
    """The tiny policy, or a critic on its backbone (value head at zero, as build_critic makes it)."""
    if what != "critic":
        return tiny_model()
    from components.train.critic import build_critic

    with tempfile.TemporaryDirectory() as d:
        tiny_model().save_pretrained(d)
        return build_critic(d)


def _seed() -> None:
    torch.manual_seed(0)
    random.seed(0)


def _drop_gradients(engine) -> None:
    """The negative control: this engine's gradients never reach the all-reduce."""
    backward = engine.backward
    engine.backward = lambda loss, _b=backward, **kw: _b(loss * 0.0, **kw)


def step(rank: int, what: str, out: str, drop_rank: int, model_: torch.nn.Module | None = None) -> None:
    """One optimizer step of ``what`` on this rank (of ``model_``, or a fresh ``model(what)``); rank 0
    saves the weights and metrics to ``out``."""
    from components.train.engine import build_engine
    from components.train.sft import run_sft, split_micro_batches

    _seed()
    model_ = model_ if model_ is not None else model(what)
    engine = build_engine(model_, dtype="fp32", micro_batch_size=2, **RL_ENGINE_KW)
    if rank == drop_rank:
        _drop_gradients(engine)
    if what == "sft":
        micro = split_micro_batches(random_batch(8, seed=3), 2)  # 4 micro-batches: 2 per rank
        metrics = run_sft(engine, iter([micro]), steps=1, progress=False)[0]
    else:
        kw = dict(mini_batch_size=10_000, micro_batch_size=3)
        if what == "grpo":
            metrics = run_actor_update(engine, grpo_rows(), **ACTOR_KW, **kw)
        else:
            metrics = run_critic_update(
                engine, critic_rows(), pad_id=0, per_step=False, value_clip=0.5, epochs=1, seed=0, **kw
            )
    if rank == 0:
        torch.save({"weights": full_weights(engine), "metrics": metrics}, out)


def _session_cfg(zero_stage: int, rank: int):
    from components.rollout import EngineSettings

    rollout = EngineSettings("hf", dtype="float32", max_model_len=64, kv_cache_gib=0.1, seed=0)
    return session_config(  # one plain Adam step as RL_ENGINE_KW
        critic="token",
        actor_lr=LR,
        critic_lr=LR,
        grad_clip=1e9,
        micro_batch_size=3,
        zero_stage=zero_stage,
        rollout=rollout if rank == 0 else None,  # the stage's followers have no rollout engine
    )


def session(rank: int, init_dir: str, out: str, zero_stage: int, drop_rank: int) -> None:
    """The train stage's calls: rank 0 builds the rows and leads; other ranks only follow (they receive
    the rows through the mirrored calls). Rank 0 saves to ``out`` the gathered weights, the metrics,
    the weights synced into the rollout engine, the final model's and the checkpoint's (``out``.ckpt),
    the old log-probs and the values."""
    import torch.distributed as dist

    from components.model.tiny import load_hf
    from components.train.rank_mirror import Leader, follow
    from components.train.rl_session import RLSession
    from components.train.rl_update import ActorSettings, CriticSettings

    _seed()
    s = RLSession(init_dir, _session_cfg(zero_stage, rank), tools=None)
    if rank == drop_rank:
        _drop_gradients(s.actor)
        _drop_gradients(s.critic)
    if rank > 0:
        calls = follow(s)
        full_weights(s.actor)  # every rank joins the gather
        assert calls == (5 if zero_stage == 3 else 2), calls  # annotate, update, save, sync, final_model
        return
    lead = Leader(s) if dist.get_world_size() > 1 else s
    rows = lead.annotate(critic_rows())  # the old log-probs recomputed, the values added
    mb = dict(mini_batch_size=10_000, micro_batch_size=3)
    actor_kw = {"temperature": 1.0} | {k: v for k, v in ACTOR_KW.items() if k not in ("pad_id", "seed")} | mb
    metrics = lead.update(
        rows,
        actor=ActorSettings(**actor_kw),
        critic=CriticSettings(value_clip=0.5, epochs=1, **mb),
        seed=ACTOR_KW["seed"],
    )
    lead.save(f"{out}.ckpt", metadata={"iteration": 0})  # every rank joins DeepSpeed's save
    lead.sync()
    synced = {k: v.detach().clone() for k, v in s.rollout_engine.model.state_dict().items()}
    final = {k: v.detach().clone() for k, v in lead.final_model().state_dict().items()}
    lead.close()
    weights = full_weights(s.actor)
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


def world_cases(rank: int, init_dir: str, out_dir: str, drop_ranks: tuple[int, ...]) -> None:
    """Every case on this rank, once per drop rank of ``drop_ranks`` (-1: none), to
    ``out_dir/drop<d>/<case>.pt``. Every model is built before the first engine: once the world is up,
    transformers' save_pretrained (which build_critic's temporary copy goes through) writes its
    config on rank 0 only."""
    models = {(d, what): model(what) for d in drop_ranks for what in STEPS}
    for d in drop_ranks:
        Path(out_dir, f"drop{d}").mkdir(parents=True, exist_ok=True)
        for what in STEPS:
            step(rank, what, f"{out_dir}/drop{d}/{what}.pt", d, model_=models[d, what])
    for name, zero_stage in SESSIONS.items():  # ZeRO-3 after ZeRO-0
        for d in drop_ranks:
            session(rank, init_dir, f"{out_dir}/drop{d}/{name}.pt", zero_stage, d)


class RankWorlds:
    """The cases' results by world size, each world run on first use: ``get(1)``, ``get(2)`` (rank
    1's gradients dropped: ``get(2, dropped=True)``); each a dict case -> what rank 0 saved. A
    case's checkpoint is at ``path(world, case)``.ckpt."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._runs: dict[int, dict[int, dict[str, dict]]] = {}

    def path(self, world: int, case: str, dropped: bool = False) -> Path:
        return self.root / f"w{world}" / f"drop{1 if dropped else -1}" / f"{case}.pt"

    def get(self, world: int, dropped: bool = False) -> dict[str, dict]:
        if world not in self._runs:
            from components.train.launch import run_local

            init = self.root / "init"
            if not init.exists():
                tiny_model().save_pretrained(init)
                tiny_tokenizer().save_pretrained(init)
            drops = (-1, 1) if world > 1 else (-1,)
            run_local(world, world_cases, (str(init), str(self.root / f"w{world}"), drops))
            self._runs[world] = {
                d: {
                    case: torch.load(self.root / f"w{world}" / f"drop{d}" / f"{case}.pt")
                    for case in (*STEPS, *SESSIONS)
                }
                for d in drops
            }
        return self._runs[world][1 if dropped else -1]
