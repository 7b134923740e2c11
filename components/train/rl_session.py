"""The long-lived objects of one RL run: actor and critic DeepSpeed engines, frozen reference, vLLM.

One ``RLSession`` lives in the train flow's process for the whole run; the flow's tasks call its
methods. It knows how to roll out (agent loop on the rollout engine), annotate rows with what the
advantage estimator and the losses need (old/ref log-probs, critic values), update, save and restore
a resumable checkpoint (HF weights + DeepSpeed state of actor and critic), and push the actor's
weights into the running rollout engine. It never reads params.yaml: the flow passes flat settings.

With ``SessionConfig.lora`` the actor and the critic carry LoRA adapters (components.train.lora):
only the adapters (and the critic's value head) train, the KL reference is the actor with its
adapters off (no second copy of the weights), the rollout engine and the final model get the merged
weights, and checkpoints hold the adapters (HF part) and the trained parameters' DeepSpeed state.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from components.agent.loop import Episode, run_episodes
from components.agent.render import ChatRenderer
from components.device import model_device
from components.rollout.base import EngineSettings
from components.rollout.factory import make_engine
from components.train.checkpoint import load_engine_state, save_checkpoint
from components.train.critic import build_critic, load_critic
from components.train.engine import autocast_for, build_engine
from components.train.lora import LoraSettings, add_lora, merged_model, merged_state_dict
from components.train.model_state import model_with_state
from components.train.optimizer_state import ADAM_MOMENTS, carry_adam_moments
from components.train.policy import critic_values, make_token_batch, response_logprobs
from components.train.rl_update import (
    ActorSettings,
    CriticSettings,
    actor_update,
    critic_update,
    trajectory_chunks,
)
from components.train.zero3 import full_state_dict

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SessionConfig:
    critic: str | None  # None, "token" (gae) or "step" (step_gae)
    use_ref: bool  # a frozen reference policy is needed (KL)
    actor_lr: float
    critic_lr: float
    zero_stage: int
    dtype: str
    grad_clip: float
    warmup_steps: int
    adam_eps: float
    micro_batch_size: int
    # The rollout engine's settings (its seed is the run's), or None: no rollout engine here (a
    # follower rank, rank_mirror). With several data-parallel ranks vLLM needs own_process=True.
    rollout: EngineSettings | None
    seed: int
    # Where old log-probs come from: "detached" (the update's own forward, detached: exact and free,
    # on-policy only), "rollout" (the sampler's own, free; exact when rollout and trainer agree
    # numerically, as in fp32) or "recompute" (one actor forward per iteration).
    old_logprobs: str = "recompute"
    # A fitted critic to start from (the critic_warmup stage's models/critic); None = the SFT backbone
    # with a zero value head (components.train.critic.build_critic).
    critic_init: str | None = None
    # Optimizer steps of linear lr warm-up of the critic alone (train.critic_lr_warmup_steps).
    critic_lr_warmup_steps: int = 0
    # LoRA adapters on the actor and the critic (model.lora); None: every weight trains.
    lora: LoraSettings | None = None
    # The old-log-prob and value forwards packed end to end (train.packed_forward).
    packed_forward: bool = False


def _value_head_name(critic: torch.nn.Module) -> str:
    return "score" if getattr(critic, "score", None) is not None else "classifier"


class RLSession:
    # The peft wrappers of the actor and critic with LoRA (their ``get_base_model()`` is the engine's
    # module); None without LoRA.
    actor_lora: Any = None
    critic_lora: Any = None

    def __init__(self, init_dir: str | Path, cfg: SessionConfig, tools: list[dict] | None) -> None:
        """Engines start from the HF checkpoint ``init_dir`` (the SFT model): actor, critic backbone,
        reference and rollout engine."""
        # imported here, when the models are built, not when a stage imports this module
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if cfg.old_logprobs not in ("detached", "rollout", "recompute"):
            raise ValueError(
                f"old_logprobs={cfg.old_logprobs!r}: expected 'detached', 'rollout' or 'recompute'"
            )
        self.cfg = cfg
        self.init_dir = Path(init_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(self.init_dir)
        self.pad_id = (
            self.tokenizer.pad_token_id
            if self.tokenizer.pad_token_id is not None
            else self.tokenizer.eos_token_id
        )
        self.renderer = ChatRenderer(self.tokenizer, tools, stop_token=self.tokenizer.eos_token)
        torch.manual_seed(cfg.seed)
        engine_kw = dict(
            weight_decay=0.0,
            zero_stage=cfg.zero_stage,
            dtype=cfg.dtype,
            grad_clip=cfg.grad_clip,
            micro_batch_size=cfg.micro_batch_size,
            grad_accum_steps=1,
            warmup_steps=cfg.warmup_steps,
            total_steps=max(cfg.warmup_steps, 1),
            lr_schedule="constant",
            eps=cfg.adam_eps,
        )
        actor = AutoModelForCausalLM.from_pretrained(self.init_dir)
        if cfg.lora is not None:
            self.actor_lora = add_lora(actor, cfg.lora)
            actor = self.actor_lora.get_base_model()  # the same model, its target layers adapted
        self.actor = build_engine(actor, lr=cfg.actor_lr, **engine_kw)
        self.critic = None
        if cfg.critic is not None:
            critic = load_critic(cfg.critic_init) if cfg.critic_init else build_critic(self.init_dir)
            if cfg.lora is not None:  # a model of its own: adapters on its backbone, its head in full
                self.critic_lora = add_lora(critic, cfg.lora, train_modules=[_value_head_name(critic)])
                critic = self.critic_lora.get_base_model()
            warm = cfg.critic_lr_warmup_steps
            critic_kw = {**engine_kw, "warmup_steps": warm, "total_steps": max(warm, 1)}
            self.critic = build_engine(critic, lr=cfg.critic_lr, **critic_kw)
            if cfg.critic_init:  # the warm-up's Adam moments, so its first in-run step is not a cold one
                log.info(carry_adam_moments(self.critic, Path(cfg.critic_init) / ADAM_MOMENTS))
        self.ref = None
        if cfg.use_ref and cfg.lora is None:  # frozen, outside DeepSpeed, on the actor's device
            ref = AutoModelForCausalLM.from_pretrained(self.init_dir).eval()
            self.ref = ref.to(model_device(self.actor.module))
        self.rollout_engine = (
            None
            if cfg.rollout is None
            else make_engine(cfg.rollout, str(self.init_dir), stop_token_ids=[self.tokenizer.eos_token_id])
        )
        self.version: str = str(self.init_dir)  # the checkpoint the engines hold now

    # --- rollout -------------------------------------------------------------------------------
    def play(
        self,
        episodes: list[Episode],
        *,
        max_steps: int,
        max_prompt_len: int,
        max_response_len: int,
        temperature: float,
        seed: int,
        desc: str,
        context_window: int | None = None,
        until: Callable[[], bool] | None = None,
    ) -> list[dict]:
        return run_episodes(
            self.rollout_engine,
            self.renderer,
            episodes,
            max_steps=max_steps,
            max_prompt_len=max_prompt_len,
            max_response_len=max_response_len,
            temperature=temperature,
            seed=seed,
            desc=desc,
            context_window=context_window,
            until=until,
        )

    # --- what the estimator and losses read ---------------------------------------------------------
    @torch.no_grad()
    def annotate(self, rows: Sequence[dict], *, temperature: float = 1.0, batch_size: int = 32) -> list[dict]:
        """Rows + ``old_logprobs`` (actor now), ``ref_logprobs`` (reference) and critic ``values``.

        Log-probs are of the sampling distribution, softmax(logits / temperature), as in the rollout.
        With ``old_logprobs="rollout"`` (or ``"detached"``, where the update detaches its own) the rows'
        ``response_logprobs`` are the old log-probs and the actor is not run; a forward pass happens
        only for a reference or a critic. Forwards run in the training precision, each model on its
        own device (``response_logprobs``/``critic_values`` move the CPU-built batch there)."""
        out: list[dict] = [dict(r) for r in rows]
        from_rollout = self.cfg.old_logprobs in ("rollout", "detached")
        if from_rollout:
            for r in out:
                r["old_logprobs"] = list(r["response_logprobs"])
            if not self._has_reference() and self.critic is None:
                for r in out:
                    r["ref_logprobs"], r["values"] = None, None
                return out
        self.actor.eval()
        with autocast_for(self.actor):
            self._annotate_chunks(out, rows, from_rollout, temperature, batch_size)
        return out

    def _annotate_chunks(
        self, out: list[dict], rows: Sequence[dict], from_rollout: bool, temperature: float, batch_size: int
    ) -> None:
        for idx in trajectory_chunks(rows, batch_size):
            chunk = [out[i] for i in idx]
            batch = make_token_batch(
                [r["prompt_ids"] for r in chunk],
                [r["response_ids"] for r in chunk],
                self.pad_id,
                share_prefix=True,
                packed=self.cfg.packed_forward,
            )
            old = (
                None
                if from_rollout
                else response_logprobs(self.actor.module, batch, temperature=temperature)[0]
            )
            ref = self._ref_logprobs(batch, temperature)
            values = None
            if self.critic is not None:
                self.critic.eval()
                values = critic_values(self.critic.module, batch, per_step=self.cfg.critic == "step")
            for i, r in enumerate(chunk):
                n = len(r["response_ids"])
                if old is not None:
                    r["old_logprobs"] = old[i, :n].tolist()
                r["ref_logprobs"] = ref[i, :n].tolist() if ref is not None else None
                if values is None:
                    r["values"] = None
                elif self.cfg.critic == "step":
                    r["values"] = [float(values[i])]
                else:
                    r["values"] = values[i, :n].tolist()

    def _has_reference(self) -> bool:
        return self.ref is not None or (self.actor_lora is not None and self.cfg.use_ref)

    def _ref_logprobs(self, batch: Any, temperature: float) -> torch.Tensor | None:
        """The frozen reference's log-probs (B, L): its own copy, or with LoRA the actor with its
        adapters off; None without a reference."""
        if self.ref is not None:
            return response_logprobs(self.ref, batch, temperature=temperature)[0]
        if not self._has_reference():
            return None
        with self.actor_lora.disable_adapter():
            return response_logprobs(self.actor.module, batch, temperature=temperature)[0]

    # --- update --------------------------------------------------------------------------------
    def update(
        self,
        rows: Sequence[dict],
        *,
        actor: ActorSettings | None,
        critic: CriticSettings | None,
        seed: int,
    ) -> dict[str, float]:
        """The critic's update (when this session has a critic and ``critic`` is given), then the
        actor's (``actor`` None: the actor stays frozen, e.g. while the critic warms up); ``seed``
        shuffles the mini-batches."""
        # vLLM on CUDA with rollout.sleep_mode gives the GPU memory of its weights and KV cache to the
        # update (elsewhere sleep() is a no-op that returns False).
        engine = self.rollout_engine
        asleep = engine is not None and engine.sleep()
        try:
            return self._update(rows, actor=actor, critic=critic, seed=seed)
        finally:
            if asleep:
                engine.wake_up()

    def _update(
        self, rows: Sequence[dict], *, actor: ActorSettings | None, critic: CriticSettings | None, seed: int
    ) -> dict[str, float]:
        metrics: dict[str, float] = {}
        if self.critic is not None and critic is not None:
            per_step = self.cfg.critic == "step"
            m = critic_update(self.critic, rows, critic, pad_id=self.pad_id, per_step=per_step, seed=seed)
            metrics.update({f"critic/{k}": v for k, v in m.items()})
        if actor is not None:
            m = actor_update(
                self.actor,
                rows,
                actor,
                pad_id=self.pad_id,
                seed=seed,
                detach_old=self.cfg.old_logprobs == "detached",
                old_from_rollout=self.cfg.old_logprobs == "rollout",
            )
            metrics.update({f"actor/{k}": v for k, v in m.items()})
        return metrics

    @property
    def zero3(self) -> bool:
        """ZeRO-3: the engines' parameters are sharded across the ranks, so reading whole weights
        (:meth:`actor_weights`, :meth:`sync`, :meth:`final_model`) and every forward
        (:meth:`annotate`) is a collective that each rank makes (components.train.rank_mirror)."""
        return self.cfg.zero_stage == 3

    def actor_weights(self) -> dict[str, torch.Tensor] | None:
        """The actor's full state dict under the base model's names (merged with LoRA): what the
        rollout engine loads (all of it: ``named_parameters`` would omit a tied ``lm_head``). Under
        ZeRO-3 every rank must call it (a gather): rank 0 gets CPU copies, the others None."""
        if self.zero3:
            return full_state_dict(self.actor, self.actor_lora)
        if self.actor_lora is not None:
            return merged_state_dict(self.actor_lora)
        return self.actor.module.state_dict()

    def final_model(self) -> torch.nn.Module | None:
        """The actor as a plain transformers model (LoRA merged into its weights: no peft to load it).
        With LoRA it shares the tensors of unadapted layers with the trained model: save it before
        the next update. Under ZeRO-3 every rank must call it: rank 0 gets a gathered CPU copy, the
        others None."""
        if self.zero3:
            state = self.actor_weights()
            return None if state is None else model_with_state(self.actor.module, state)
        return self.actor.module if self.actor_lora is None else merged_model(self.actor_lora)

    def sync(self) -> None:
        """Push the actor's weights into the rollout engine (under ZeRO-3 each rank joins the gather,
        with a rollout engine or not)."""
        if self.rollout_engine is None and not self.zero3:
            return
        weights = self.actor_weights()
        if self.rollout_engine is not None:
            self.rollout_engine.sync_weights(weights)

    # --- checkpoints ---------------------------------------------------------------------------
    def save(self, out_dir: str | Path, metadata: dict[str, Any]) -> str:
        """Actor (HF + tokenizer + DeepSpeed state) at out_dir/actor, critic at out_dir/critic; with
        LoRA the HF part is each model's adapters."""
        out = Path(out_dir)
        save_checkpoint(
            self.actor,
            out / "actor",
            tokenizer=self.tokenizer,
            save_engine_state=True,
            metadata=metadata,
            hf_model=self.actor_lora,
        )
        if self.critic is not None:
            save_checkpoint(
                self.critic,
                out / "critic",
                save_engine_state=True,
                metadata=metadata,
                hf_model=self.critic_lora,
            )
        self.version = str(out)
        return str(out)

    def restore(self, ckpt_dir: str | Path, *, sync: bool = True) -> None:
        """Load actor/critic weights, optimizer and schedule from ``ckpt_dir``, and sync the rollout
        engine (``sync=False``: leave the engine as it is, e.g. while it generates in another thread
        with older weights, rollout.staleness >= 1)."""
        ckpt = Path(ckpt_dir)
        load_engine_state(self.actor, ckpt / "actor")
        if self.critic is not None:
            load_engine_state(self.critic, ckpt / "critic")
        if sync:
            self.sync()
        self.version = str(ckpt)

    def close(self) -> None:
        if self.rollout_engine is not None:
            self.rollout_engine.close()


def prune(dirs: Sequence[Path], keep: int, what: Callable[[Path], Path]) -> None:
    """Delete ``what(d)`` for all but the last ``keep`` of ``dirs`` (old checkpoints)."""
    for d in list(dirs)[: max(len(dirs) - keep, 0)]:
        shutil.rmtree(what(d), ignore_errors=True)
