"""LoRA on the RL session (components.train.lora, model.lora): what trains, what the rollout engine and
the final model get, checkpoints and resume, and the errors of bad settings.

A tiny Qwen3 model (train_helpers) with rank-4 adapters on every Linear layer of its decoder, a PPO
session (actor + token critic + KL reference) on the ``hf`` rollout engine, one real DeepSpeed update.
"""

from __future__ import annotations

import random

import pytest
import torch
from train_helpers import session_config, tiny_model, tiny_tokenizer, trajectories

from components.config import ConfigError, load_params
from components.model.tiny import save_hf
from components.train.lora import (
    LoraSettings,
    add_lora,
    check_model_dir,
    linear_module_names,
    merged_state_dict,
)
from components.train.policy import make_token_batch, response_logprobs
from components.train.rl_update import ActorSettings, CriticSettings
from flows import REPO

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA = LoraSettings(rank=4, alpha=8.0, target_modules=TARGETS)
ACTOR = ActorSettings(
    policy_loss="ppo", loss_agg="token-mean", clip_low=0.2, clip_high=0.2, clip_ratio_c=3.0,
    kl_coef=0.1, kl_kind="low_var_kl", entropy_coef=0.0, norm_const=8.0, temperature=1.0,
    epochs=1, mini_batch_size=10_000, micro_batch_size=4,
)  # fmt: skip
CRITIC = CriticSettings(value_clip=0.2, epochs=1, mini_batch_size=10_000, micro_batch_size=4)


@pytest.fixture(scope="module")
def init_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("lora") / "init"
    tiny_model().save_pretrained(d)
    tiny_tokenizer().save_pretrained(d)
    return d


def _session(init_dir, **kw):
    from components.train.rl_session import RLSession

    cfg = session_config(critic="token", use_ref=True, actor_lr=1e-2, critic_lr=1e-2, lora=LORA, **kw)
    return RLSession(init_dir, cfg, tools=None)


def _rows(session, seed: int) -> list[dict]:
    """Annotated step rows with random advantages and returns (what the advantage stage writes)."""
    rows = session.annotate(trajectories(8, seed=seed))
    rng = random.Random(seed)
    for r in rows:
        n = len(r["response_ids"])
        r["advantages"] = [rng.uniform(-1, 1)] * n
        r["returns"] = [rng.uniform(-1, 1)] * n
    return rows


def _logprobs(model, rows) -> torch.Tensor:
    batch = make_token_batch([r["prompt_ids"] for r in rows], [r["response_ids"] for r in rows], pad_id=0)
    with torch.no_grad():
        return response_logprobs(model.eval(), batch)[0]


def _split(module: torch.nn.Module) -> tuple[dict, dict]:
    """(frozen, trained) copies of a module's parameters by name."""
    frozen = {k: p.detach().clone() for k, p in module.named_parameters() if not p.requires_grad}
    trained = {k: p.detach().clone() for k, p in module.named_parameters() if p.requires_grad}
    return frozen, trained


@pytest.fixture(scope="module")
def updated(init_dir):
    """A LoRA session before and after one update (rows of seed 0), and what the update changed;
    the session is then the module's: test_the_rollout_engine_... goes on from it."""
    session = _session(init_dir)
    actor, critic = session.actor.module, session.critic.module
    out = {"session": session, "ref": session.ref}
    out["frozen"], out["trained"] = _split(actor)
    out["c_frozen"], out["c_trained"] = _split(critic)
    out["in_opt"] = sum(p.numel() for g in session.actor.optimizer.param_groups for p in g["params"])
    out["rows"] = rows = _rows(session, seed=0)
    out["base_logp"] = _logprobs(tiny_model(), rows)
    out["metrics"] = session.update(rows, actor=ACTOR, critic=CRITIC, seed=0)
    out["actor_after"] = {k: p.detach().clone() for k, p in actor.named_parameters()}
    out["critic_after"] = {k: p.detach().clone() for k, p in critic.named_parameters()}
    out["critic_score"] = critic.score.weight.detach().clone()
    out["again"] = session.annotate(rows)
    out["trainer_logp"] = _logprobs(actor, rows)
    yield out
    session.close()


def test_only_the_adapters_and_the_value_head_train_and_the_reference_is_the_base(updated):
    frozen, trained, c_frozen, c_trained = (
        updated[k] for k in ("frozen", "trained", "c_frozen", "c_trained")
    )
    rows = updated["rows"]
    assert updated["ref"] is None  # no second copy of the weights
    assert set(trained) and all(".lora_A." in k or ".lora_B." in k for k in trained)
    assert set(c_trained) == {k for k in c_trained if ".lora_" in k or "score.modules_to_save" in k}
    assert any("score.modules_to_save" in k for k in c_trained)
    # the optimizer holds the adapters alone: 4 (in + out) per adapted layer, 2 layers x 7 targets
    assert (
        updated["in_opt"]
        == sum(v.numel() for v in trained.values())
        == 2 * 4 * ((64 + 64) + 2 * (64 + 32) + (64 + 64) + 3 * (64 + 128))
    )
    for r, ref in zip(rows, updated["base_logp"]):  # the reference is the base model: the actor, adapters off
        assert r["ref_logprobs"] == pytest.approx(ref[: len(r["response_ids"])].tolist(), abs=1e-6)
    metrics = updated["metrics"]
    assert metrics["actor/skipped"] == 0.0 and metrics["critic/skipped"] == 0.0
    for k, v in frozen.items():  # the base's checksum: every frozen weight bit-identical
        assert torch.equal(updated["actor_after"][k], v), k
    for k, v in c_frozen.items():
        assert torch.equal(updated["critic_after"][k], v), k
    moved = [k for k, v in trained.items() if not torch.equal(updated["actor_after"][k], v)]
    assert any(".lora_B." in k for k in moved)  # B starts at 0; one Adam step moves it by about lr
    assert not torch.equal(updated["critic_score"], c_trained["score.modules_to_save.default.weight"])
    again = updated["again"]
    assert [r["ref_logprobs"] for r in again] == [r["ref_logprobs"] for r in rows]  # still the base
    assert (
        max(abs(a - b) for r, s in zip(again, rows) for a, b in zip(r["old_logprobs"], s["old_logprobs"]))
        > 1e-4
    )  # the actor moved


def test_the_rollout_engine_and_final_get_the_merged_weights_and_resume_repeats_the_run(
    init_dir, updated, tmp_path
):
    """From the module's session after its one update (a session of its own cost a DeepSpeed start)."""
    session, rows, trainer = updated["session"], updated["rows"], updated["trainer_logp"]
    assert (trainer - _logprobs(tiny_model(), rows)).abs().max() > 1e-4  # the adapters changed something

    weights = session.actor_weights()
    assert sorted(weights) == sorted(tiny_model().state_dict())  # the base model's names, lm_head too
    session.sync()  # the hf engine loads it with strict=True
    assert (_logprobs(session.rollout_engine.model, rows) - trainer).abs().max() < 1e-5
    assert sorted(k for k, p in session.actor.module.named_parameters() if p.requires_grad)  # not merged

    final = save_hf(session.final_model(), session.tokenizer, tmp_path / "final")
    assert not (final / "adapter_config.json").exists()
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(final)  # a plain HF model: no peft to load it
    assert type(loaded).__name__ == "Qwen3ForCausalLM"
    assert (_logprobs(loaded, rows) - trainer).abs().max() < 1e-5

    ckpt = session.save(tmp_path / "ckpt", metadata={"iteration": 0})
    actor_dir = tmp_path / "ckpt" / "actor"
    assert (actor_dir / "adapter_model.safetensors").is_file() and not (
        actor_dir / "model.safetensors"
    ).exists()
    saved = torch.load(next((actor_dir / "ds").rglob("*model_states.pt")), weights_only=False)["module"]
    base_keys = set(dict(tiny_model().named_parameters()))
    assert not base_keys & set(saved), "the frozen base was written to the DeepSpeed state"

    rows2 = _rows(session, seed=2)
    session.update(rows2, actor=ACTOR, critic=CRITIC, seed=1)
    resumed = _session(init_dir)
    resumed.restore(ckpt)
    assert (_logprobs(resumed.rollout_engine.model, rows) - trainer).abs().max() < 1e-5  # synced on restore
    resumed.update(rows2, actor=ACTOR, critic=CRITIC, seed=1)
    for name in ("actor", "critic"):
        a = dict(getattr(session, name).module.named_parameters())
        b = dict(getattr(resumed, name).module.named_parameters())
        for k in a:
            torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-6, msg=f"{name} {k}")
    resumed.close()


def test_the_merged_weights_are_w_plus_scale_b_a():
    model = tiny_model()
    peft_model = add_lora(model, LoraSettings(rank=2, alpha=6.0, target_modules=("q_proj",)))
    layer = model.model.layers[0].self_attn.q_proj
    with torch.no_grad():
        layer.lora_B["default"].weight.normal_()
    merged = merged_state_dict(peft_model)
    w = layer.base_layer.weight
    expected = w + 3.0 * layer.lora_B["default"].weight @ layer.lora_A["default"].weight  # alpha / r = 3
    torch.testing.assert_close(merged["model.layers.0.self_attn.q_proj.weight"], expected)
    assert torch.equal(layer.base_layer.weight, w)  # the trained model unchanged
    assert torch.equal(
        merged["model.layers.0.self_attn.k_proj.weight"], model.model.layers[0].self_attn.k_proj.weight
    )


def test_a_target_the_model_does_not_have_lists_its_linear_layers(init_dir):
    names = ["down_proj", "gate_proj", "k_proj", "lm_head", "o_proj", "q_proj", "up_proj", "v_proj"]
    assert linear_module_names(tiny_model()) == names
    with pytest.raises(ValueError) as err:
        add_lora(tiny_model(), LoraSettings(rank=4, alpha=8.0, target_modules=("q_proj", "qkv_proj")))
    assert str(err.value) == (
        f"model.lora.target_modules ['qkv_proj']: the model has no Linear layer of that name (its Linear "
        f"layers: {names})"
    )
    with pytest.raises(ValueError, match=r"\['c_attn'\]: the model in .*init has no Linear layer"):
        check_model_dir(init_dir, ["c_attn"])  # on the checkpoint's config alone, before any work
    with pytest.raises(ValueError, match="'lm_head', the output head, which the model ties"):
        add_lora(tiny_model(), LoraSettings(rank=4, alpha=8.0, target_modules=("lm_head",)))


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"rank": 0}, "rank=0 must be an int > 0"),
        ({"rank": -2}, "rank=-2"),
        ({"alpha": 0.0}, "alpha=0.0"),
        ({"dropout": 1.0}, r"dropout=1.0 must be in \[0, 1\)"),
        ({"target_modules": ()}, "target_modules=()"),
        ({"target_modules": "q_proj"}, "expected a list"),
    ],
)
def test_lora_settings_refuse_bad_values(kw, match):
    with pytest.raises(ValueError, match=match):
        LoraSettings(**({"rank": 4, "alpha": 8.0, "target_modules": TARGETS} | kw))


@pytest.mark.parametrize(
    "lora,match",
    [
        ({"rank": -1}, "model.lora.rank"),
        ({"target_modules": []}, "model.lora.target_modules"),
        ({"target_modules": ["q_proj", "q_proj"]}, "listed twice"),
        ({"ranks": 16}, "model.lora.ranks"),
    ],
)
def test_params_refuse_bad_lora_sections(lora, match):
    import yaml

    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["model"]["lora"] |= lora
    from components.config import parse_params

    with pytest.raises(ConfigError, match=match):
        parse_params(raw)


def test_lora_is_off_in_params_yaml_and_on_with_a_rank():
    from flows.train_settings import lora_settings

    p = load_params(REPO / "params.yaml")
    assert p.model.lora.rank == 0 and lora_settings(p) is None
    on = p.model_copy(
        update={"model": p.model.model_copy(update={"lora": p.model.lora.model_copy(update={"rank": 16})})}
    )
    assert lora_settings(on) == LoraSettings(rank=16, alpha=32.0, target_modules=TARGETS, dropout=0.0)
