"""What a value can read on babyai: explained variance of read-outs of the SFT backbone's features
and of a table of two numbers of the state, on the critic warm-up's kind of episodes and splits.

    python benchmarks/critic_readout.py [--episodes 512] [--temperature T] [--models sft,base]
        [--steps episodes.pkl] [--out readout.json]

Run after `make repro PROFILE=babyai` has built models/sft (and models/base). It plays ``--episodes``
episodes of the SFT policy as the critic_warmup stage does (the babyai profile's params, one episode
per RL prompt, at ``--temperature`` or train.temperature; at most one per RL prompt), takes the
per-step returns StepPO's critic fits, splits whole trajectories as the warm-up does (train /
selection / report), and prints for each read-out the explained variance on the three splits: the
backbone's final hidden state at the value position (the last prompt token, what the value head
reads), every layer there, the mean over the prompt and over its last 64 tokens (ridge, the penalty
chosen on the selection split), for the SFT model and the untrained base
model; and a table of the mean return per turn and per distance of the goal object in the last
observation's text. ``--steps`` caches the episodes (pickle) for a second run. docs/tasks/babyai.md,
"What a value can read", has the figures of 2026-11-28.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import time

import numpy as np
import torch
from transformers import AutoTokenizer

from components.config import load_params
from components.train.critic import build_critic
from components.train.critic_fit import explained_variance, value_targets
from components.train.policy import make_token_batch
from flows import REPO
from flows.critic_warmup import rollout, split_trajectories
from flows.train import SFT

ap = argparse.ArgumentParser()
ap.add_argument("--episodes", type=int, default=512)
ap.add_argument("--temperature", type=float, default=None)
ap.add_argument("--steps", default=None)
ap.add_argument("--models", default="sft,base")
ap.add_argument("--out", default=None)
args = ap.parse_args()

over = dict(load_params(REPO / "params.yaml").profiles["babyai"])
over["critic_warmup.episodes"] = args.episodes
if args.temperature is not None:
    over["train.temperature"] = args.temperature
params = load_params(REPO / "params.yaml", overrides=over)
t0 = time.time()
if args.steps and os.path.exists(args.steps):
    with open(args.steps, "rb") as f:
        steps = pickle.load(f)
else:
    steps = rollout.fn(params)
    if args.steps:
        with open(args.steps, "wb") as f:
            pickle.dump(steps, f)
print(f"rollout: {len(steps)} step rows in {time.time() - t0:.0f} s", flush=True)
rows = value_targets(steps, gamma=params.train.gamma)
splits = dict(
    zip(["train", "select", "report"], split_trajectories(rows, params.critic_warmup.held_out, params.seed))
)
y = {k: np.array([r["step_return"] for r in v]) for k, v in splits.items()}

tok = AutoTokenizer.from_pretrained(SFT)


def features(model_dir, rows, bs=32):
    critic = build_critic(model_dir).eval()
    backbone = getattr(critic, critic.base_model_prefix)
    out = {"last": [], "last_all_layers": [], "mean_prompt": [], "mean_last64": []}
    with torch.no_grad():
        for i in range(0, len(rows), bs):
            chunk = [r["prompt_ids"] for r in rows[i : i + bs]]
            # the rows as the critic reads them: value_pos is each prompt's last token
            batch = make_token_batch(chunk, [[] for _ in chunk], pad_id=0, pack=False)
            mask, last, T = batch.attention_mask, batch.value_pos, batch.input_ids.size(1)
            o = backbone(input_ids=batch.input_ids, attention_mask=mask, output_hidden_states=True)
            hs = o.hidden_states  # (layers+1) x (B, T, H)
            b = torch.arange(len(chunk))
            out["last"].append(hs[-1][b, last])
            out["last_all_layers"].append(torch.cat([h[b, last] for h in hs[1:]], dim=-1))
            m = mask.unsqueeze(-1).float()
            out["mean_prompt"].append((hs[-1] * m).sum(1) / m.sum(1))
            pos = torch.arange(T).unsqueeze(0)
            m64 = ((pos > (last - 64).unsqueeze(1)) & (pos <= last.unsqueeze(1))).unsqueeze(-1).float()
            out["mean_last64"].append((hs[-1] * m64).sum(1) / m64.sum(1))
    return {k: torch.cat(v).double().numpy() for k, v in out.items()}


def ev(y, v):
    return explained_variance(
        torch.as_tensor(y, dtype=torch.float64), torch.as_tensor(v, dtype=torch.float64)
    )


def ridge(Xtr, ytr, Xs, ys, Xr, yr):
    mu, sd = Xtr.mean(0), Xtr.std(0) + 1e-8
    Z = lambda X: np.hstack([(X - mu) / sd, np.ones((len(X), 1))])  # noqa: E731
    A, B, C = Z(Xtr), Z(Xs), Z(Xr)
    best = None
    for lam in [1e-3, 1e-2, 0.1, 1, 10, 100, 1e3, 1e4]:
        w = np.linalg.solve(A.T @ A + lam * np.eye(A.shape[1]), A.T @ ytr)
        s = ev(ys, B @ w)
        if best is None or s > best[0]:
            best = (s, lam, ev(yr, C @ w), ev(ytr, A @ w))
    return {"select": best[0], "lambda": best[1], "report": best[2], "train": best[3]}


results = {
    "episodes": args.episodes,
    "temperature": params.train.temperature,
    "rows": {k: len(v) for k, v in splits.items()},
    "success_rate": len({r["traj_id"] for r in steps if r.get("correct")})
    / len({r["traj_id"] for r in steps}),
}
for name, model_dir in [(n, SFT if n == "sft" else REPO / "models" / "base") for n in args.models.split(",")]:
    t0 = time.time()
    F = {k: features(model_dir, v) for k, v in splits.items()}
    print(f"{name} features: {time.time() - t0:.0f} s", flush=True)
    for readout in F["train"]:
        args_ = [
            F["train"][readout],
            y["train"],
            F["select"][readout],
            y["select"],
            F["report"][readout],
            y["report"],
        ]
        results[f"{name}/{readout}/ridge"] = ridge(*args_)
        print(
            name, readout, {k: v for k, v in results.items() if k.startswith(f"{name}/{readout}")}, flush=True
        )

# hand features from the last observation's text: turn, whether the goal object is in view, its distance
GOAL = re.compile(r"goal: go to (?:the |a )?(\w+) (\w+)")


def hand(r):
    text = tok.decode(r["prompt_ids"])
    goals = GOAL.findall(text)
    last_obs = text.rsplit("goal:", 1)[-1]
    dist = -1
    if goals:
        colour, obj = goals[-1]
        m = re.search(
            rf"a {colour} {obj} (\d+) steps? forward(?: and (\d+) steps? (?:left|right))?", last_obs
        )
        m2 = re.search(rf"a {colour} {obj} (\d+) steps? (?:left|right)", last_obs)
        if m:
            dist = int(m.group(1)) + int(m.group(2) or 0)
        elif m2:
            dist = int(m2.group(1))
    return int(r["step"]), min(dist, 8)


H = {k: [hand(r) for r in v] for k, v in splits.items()}
for key, fn in [
    ("turn", lambda h: (h[0],)),
    ("distance", lambda h: (h[1],)),
    ("turn_x_distance", lambda h: h),
]:
    table = {}
    for h, t in zip(H["train"], y["train"]):
        table.setdefault(fn(h), []).append(t)
    mean = {k: np.mean(v) for k, v in table.items()}
    glob = float(np.mean(y["train"]))
    for split in ("train", "select", "report"):
        pred = np.array([mean.get(fn(h), glob) for h in H[split]])
        results[f"hand/{key}/{split}"] = ev(y[split], pred)
    pred = np.array([mean.get(fn(h), glob) for h in H["select"] + H["report"]])
    results[f"hand/{key}/held_out"] = ev(np.concatenate([y["select"], y["report"]]), pred)
    print("hand", key, results[f"hand/{key}/report"], flush=True)
results["goal_in_view_share"] = float(np.mean([h[1] >= 0 for h in H["train"]]))
if args.out:
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
print(json.dumps(results, indent=1))
