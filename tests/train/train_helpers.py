"""Shared helpers for tests/train, imported as ``train_helpers`` (a unique module name; not a conftest).

A tiny Qwen3 model, a 128-token tokenizer, the tests' RLSession settings, random SFT batches, snapshots of an engine's full weights
(ZeRO-3 gathered) and optimizer state, a gradient recorder, and a weight comparison for Adam updates.
"""

from __future__ import annotations

import copy
import dataclasses
import random
from typing import Any

import torch
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

VOCAB = 128

ENGINE_KW: dict[str, Any] = dict(
    lr=1e-2,
    weight_decay=0.0,
    zero_stage=0,
    dtype="fp32",
    grad_clip=1.0,
    micro_batch_size=2,
    grad_accum_steps=4,
    warmup_steps=0,
    total_steps=100,
)


# build_engine settings of the RL-update tests: one plain Adam step at a constant lr, no clipping
# (add dtype and micro_batch_size).
RL_ENGINE_KW: dict[str, Any] = dict(
    lr=1e-2,
    weight_decay=0.0,
    zero_stage=0,
    grad_clip=1e9,
    grad_accum_steps=1,
    warmup_steps=0,
    total_steps=10,
    lr_schedule="constant",
)

# actor_update settings of the RL-update tests: PPO-clip, token-mean, no KL or entropy, one epoch
# (ActorSettings fields, plus actor_update's own pad_id and seed)
ACTOR_KW: dict[str, Any] = dict(
    pad_id=0,
    policy_loss="ppo",
    loss_agg="token-mean",
    clip_low=0.2,
    clip_high=0.2,
    clip_ratio_c=3.0,
    kl_coef=0.0,
    kl_kind="low_var_kl",
    entropy_coef=0.0,
    epochs=1,
    norm_const=8.0,
    seed=0,
)


def _split(cls: type, kw: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """``kw`` as a ``cls`` (its fields; temperature 1 unless given) and the remaining call arguments."""
    fields = {f.name for f in dataclasses.fields(cls)}
    settings = {"temperature": 1.0, **{k: v for k, v in kw.items() if k in fields}}
    return cls(**{k: v for k, v in settings.items() if k in fields}), {
        k: v for k, v in kw.items() if k not in fields
    }


def run_actor_update(engine: Any, rows: list[dict], **kw: Any) -> dict[str, float]:
    """``actor_update`` with ACTOR_KW-style flat keyword arguments (settings and call arguments mixed)."""
    from components.train.rl_update import ActorSettings, actor_update

    settings, rest = _split(ActorSettings, kw)
    return actor_update(engine, rows, settings, **rest)


def run_critic_update(engine: Any, rows: list[dict], **kw: Any) -> dict[str, float]:
    """``critic_update`` with flat keyword arguments (value_clip, epochs, batch sizes, pad_id, per_step, seed)."""
    from components.train.rl_update import CriticSettings, critic_update

    settings, rest = _split(CriticSettings, kw)
    return critic_update(engine, rows, settings, **rest)


def session_config(**overrides: Any):
    """RLSession settings of the tests: no critic or reference, ZeRO-0 fp32, lr 1e-4, the hf rollout
    engine on 64 tokens; ``overrides`` replace any field of SessionConfig."""
    from components.rollout import EngineSettings
    from components.train.rl_session import SessionConfig

    base: dict[str, Any] = dict(
        critic=None,
        use_ref=False,
        actor_lr=1e-4,
        critic_lr=1e-4,
        zero_stage=0,
        dtype="fp32",
        grad_clip=1.0,
        warmup_steps=0,
        adam_eps=1e-8,
        micro_batch_size=4,
        rollout=EngineSettings("hf", dtype="float32", max_model_len=64, kv_cache_gib=0.1, seed=0),
        seed=0,
    )
    return SessionConfig(**(base | overrides))


def tiny_model(seed: int = 0) -> Qwen3ForCausalLM:
    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen3ForCausalLM(config)


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer with exactly VOCAB tokens: <pad> <bos> <eos> <unk> w4 ... w127."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<pad>": 0, "<bos>": 1, "<eos>": 2, "<unk>": 3}
    vocab.update({f"w{i}": i for i in range(4, VOCAB)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )


def random_batch(n: int, *, seed: int, max_len: int = 16) -> dict[str, torch.Tensor]:
    """n right-padded rows of different lengths; labels -100 on a random prompt prefix and on padding,
    so micro-batches hold very different numbers of labelled tokens."""
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.zeros(n, max_len, dtype=torch.long)
    labels = torch.full((n, max_len), -100, dtype=torch.long)
    attention_mask = torch.zeros(n, max_len, dtype=torch.long)
    for i in range(n):
        length = int(torch.randint(4, max_len + 1, (1,), generator=g))
        prompt = int(torch.randint(1, length - 1, (1,), generator=g))
        ids = torch.randint(4, VOCAB, (length,), generator=g)
        input_ids[i, :length] = ids
        attention_mask[i, :length] = 1
        labels[i, prompt:length] = ids[prompt:]
    return {"input_ids": input_ids, "labels": labels, "attention_mask": attention_mask}


def full_weights(engine: Any) -> dict[str, torch.Tensor]:
    """Copies of the engine module's full parameters (gathered under ZeRO-3)."""
    params = dict(engine.module.named_parameters())
    if engine.zero_optimization_stage() == 3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(params.values()), modifier_rank=None):
            return {k: p.detach().float().clone() for k, p in params.items()}
    return {k: p.detach().float().clone() for k, p in params.items()}


def optimizer_tensors(engine: Any) -> list[tuple[str, Any]]:
    """Every tensor / number in the engine optimizer's state_dict, flattened with its path (deep copies),
    except DeepSpeed's ``overflow`` flag and loss-scaler iteration count."""
    out: list[tuple[str, Any]] = []

    def walk(path: str, obj: Any) -> None:
        if isinstance(obj, torch.Tensor):
            out.append((path, obj.detach().clone()))
        elif isinstance(obj, dict):
            for k in sorted(obj, key=str):
                walk(f"{path}.{k}", obj[k])
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                walk(f"{path}[{i}]", v)
        elif isinstance(obj, (int, float, bool)) or obj is None:
            out.append((path, copy.copy(obj)))

    walk("opt", engine.optimizer.state_dict())
    # DeepSpeed wrappers record whether the LAST step overflowed and count loss-scaler iterations
    # (skipped ones included); those are reports, not state that shapes the next update.
    return [(k, v) for k, v in out if k not in ("opt.overflow", "opt.cur_iter")]


def assert_same_tensors(a: list[tuple[str, Any]], b: list[tuple[str, Any]]) -> None:
    assert [k for k, _ in a] == [k for k, _ in b]
    for (k, x), (_, y) in zip(a, b):
        if isinstance(x, torch.Tensor):
            assert torch.equal(x, y), f"optimizer state {k} changed"
        else:
            assert x == y or (x != x and y != y), f"optimizer state {k} changed: {x} -> {y}"


class GradCapture:
    """Records each parameter's ``.grad`` after every accumulation into it; after a step on a plain
    fp32 ZeRO-0 engine, ``grads`` holds the full accumulated gradient the optimizer saw."""

    def __init__(self, engine: Any) -> None:
        self.grads: dict[str, torch.Tensor] = {}
        self._handles = [
            p.register_post_accumulate_grad_hook(lambda p, name=name: self._store(name, p))
            for name, p in engine.module.named_parameters()
        ]

    def _store(self, name: str, p: torch.Tensor) -> None:
        self.grads[name] = p.grad.detach().clone()

    def close(self) -> None:
        for h in self._handles:
            h.remove()


def assert_weights_match(
    w: dict[str, torch.Tensor], ref: dict[str, torch.Tensor], *, lr: float, steps: int
) -> None:
    """Weights after Adam updates from equal (up to float reassociation) gradients.

    Adam divides by |g|: where a gradient is ~0, reassociation noise can move that element's update by
    a fair share of lr. So: every element within 2% of the total step budget (lr * steps), and at
    most 0.1% of elements differ by more than 1e-6 (observed: ~0.01%).
    """
    diff = torch.cat([(w[k] - ref[k]).abs().flatten() for k in ref])
    assert diff.max().item() <= 2e-2 * lr * steps, f"max weight difference {diff.max().item():.3g}"
    frac = (diff > 1e-6).float().mean().item()
    assert frac <= 1e-3, f"{frac:.2%} of weights differ by more than 1e-6"


def trajectories(n_traj: int, seed: int = 0) -> list[dict]:
    """Step rows of multi-turn trajectories with exact continuity: the next prompt is the previous
    prompt + response + an observation."""
    rng = random.Random(seed)
    rows = []
    for t in range(n_traj):
        prompt = [1] + [rng.randrange(4, VOCAB) for _ in range(rng.randint(3, 8))]
        for step in range(rng.randint(1, 3)):
            response = [rng.randrange(4, VOCAB) for _ in range(rng.randint(1, 5))]
            rows.append(
                {"traj_id": f"t{t}", "step": step, "prompt_ids": list(prompt), "response_ids": response}
            )
            prompt = prompt + response + [rng.randrange(4, VOCAB) for _ in range(rng.randint(1, 3))]
    rng.shuffle(rows)
    return rows


def with_old_logprobs(rows: list[dict], advantage_of) -> list[dict]:
    """``rows`` with the tiny model's log-probs as old log-probs and ``advantage_of(row)`` per token."""
    from components.train.policy import make_token_batch, response_logprobs

    model = tiny_model().eval()
    batch = make_token_batch([r["prompt_ids"] for r in rows], [r["response_ids"] for r in rows], pad_id=0)
    with torch.no_grad():
        old, _ = response_logprobs(model, batch)
    return [
        {
            **r,
            "old_logprobs": old[i, : len(r["response_ids"])].tolist(),
            "advantages": [advantage_of(r)] * len(r["response_ids"]),
            "returns": [0.0] * len(r["response_ids"]),
        }
        for i, r in enumerate(rows)
    ]
