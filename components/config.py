"""Typed, frozen view of ``params.yaml``.

One section per concern; each stage reads the sections it needs. Unknown keys, wrong types and
out-of-range values raise :class:`ConfigError` whose message names the full key path and the bad
value, before any work starts. Every name is checked against its registry (``task``, each algorithm's
``preset`` / ``estimator`` / ``policy_loss`` / ``loss_agg`` / ``correction``, ``train.kl_kind``; the
error lists the known names), and so are the rules between fields (e.g. a group-baseline estimator
needs ``samples_per_prompt >= 2``). The modules named in ``plugins`` are imported first, so a task living
outside this package registers itself before ``task`` is checked. Each task validates its own section
``tasks.<name>`` with its recipe's ``params_model``.

This module validates a mapping; it does not decide which file to read (the flows pass it the path).
"""

from __future__ import annotations

import copy
import importlib
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from components.registry import Registry, UnknownNameError
from components.rollout.base import EngineSettings, cpu_ids

__all__ = [
    "ConfigError",
    "Params",
    "apply_overrides",
    "flatten",
    "import_plugins",
    "load_params",
    "parse_params",
    "protocol_label",
    "protocol_name",
    "warmup_held_out",
]


class ConfigError(ValueError):
    """A params file that cannot be used; the message names the key path and the value."""


class _KeyedErrors(ValueError):
    """Errors a validator found at nested key paths (a task's section): (path, message, value) each."""

    def __init__(self, errors: list[tuple[str, str, Any]]) -> None:
        super().__init__("; ".join(f"{path}: {msg}" for path, msg, _ in errors))
        self.errors = errors


def _registry(name: str) -> Registry[Any]:
    """A registry by name, imported when first needed (components.algos imports torch)."""
    if name == "task":
        from components.envs.registry import TASKS

        return TASKS
    if name == "tool_parser":
        from components.envs.tool_formats import TOOL_PARSERS

        return TOOL_PARSERS
    import components.algos as algos

    return {
        "estimator": algos.ADVANTAGE_ESTIMATORS,
        "policy_loss": algos.POLICY_LOSSES,
        "loss_agg": algos.AGG_MODES,
        "kl_kind": algos.KL_ESTIMATORS,
        "preset": algos.PRESETS,
        "correction": algos.OFFPOLICY_CORRECTIONS,
    }[name]


def _known(kind: str) -> Callable[[Any], Any]:
    """A field validator: the value (if not None) must be a name of registry ``kind``."""

    def check(value: Any) -> Any:
        if value is None:
            return value
        try:
            _registry(kind).get(value)
        except UnknownNameError as err:
            raise ValueError(str(err)) from None
        return value

    return check


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, validate_default=True)


def _without_defaults(dump: dict[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """``dump`` without the keys of ``defaults`` whose value is their default there."""
    return {k: v for k, v in dump.items() if not (k in defaults and v == defaults[k])}


class PrepareParams(Section):
    # Problems (rows) per split; a task that loads a file may give train fewer. The task's own data
    # settings are its section tasks.<name>.
    n_train: int = Field(2000, ge=1)
    n_val: int = Field(64, ge=1)
    n_test: int = Field(200, ge=1)


class LoraParams(Section):
    # Low-rank adapters of the RL actor and critic (components.train.lora): rank 0 = off, every weight
    # trains. The adapters' output is scaled by alpha / rank; dropout acts on their input in training.
    rank: int = Field(0, ge=0)
    alpha: float = Field(32.0, gt=0)
    dropout: float = Field(0.0, ge=0, lt=1)
    # Names of the Linear layers that get adapters (the last part of a module's name, as peft matches
    # them); checked against the model before any work.
    target_modules: list[str] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

    @field_validator("target_modules")
    @classmethod
    def _names(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("needs at least one module name")
        if any(not v for v in value):
            raise ValueError(f"module names must be non-empty, got {value}")
        if len(set(value)) != len(value):
            raise ValueError(f"a module name is listed twice: {value}")
        return value

    @property
    def enabled(self) -> bool:
        return self.rank > 0


class ModelParams(Section):
    # A local HF causal-LM directory; None builds the embedded tiny default below.
    path: str | None = None
    vocab_size: int = Field(1024, ge=300, le=200_000)
    hidden_size: int = Field(128, ge=16)
    intermediate_size: int = Field(512, ge=16)
    num_layers: int = Field(4, ge=1)
    num_heads: int = Field(4, ge=1)
    num_kv_heads: int = Field(2, ge=1)
    head_dim: int = Field(32, ge=8)
    max_position_embeddings: int = Field(1024, ge=64)
    tie_embeddings: bool = True
    # LoRA of the RL train stage (LoraParams); off by default.
    lora: LoraParams = LoraParams()

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelParams:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )
        return self


class DeepSpeedParams(Section):
    # ZeRO stage of the DeepSpeed engine (0-3).
    zero_stage: int = Field(0, ge=0, le=3)
    # Training precision (components.precision): fp32, amp_bf16 (fp32 weights, bf16 autocast), bf16
    # (DeepSpeed's bf16 mode), or auto (amp_bf16 where the hardware has bf16 matmuls, else fp32).
    dtype: Literal["fp32", "amp_bf16", "bf16", "auto"] = "fp32"
    # Data-parallel processes of the SFT and RL train stages on this machine (components.train.launch,
    # rank_mirror): each trains its share of every optimizer batch; batch, schedule, result unchanged.
    world_size: int = Field(1, ge=1, le=64)


class SFTParams(Section):
    # Optimizer steps (each of batch_size sequences).
    steps: int = Field(800, ge=1)
    batch_size: int = Field(16, ge=1)
    micro_batch_size: int = Field(16, ge=1)
    lr: float = Field(5e-3, gt=0, le=1)
    warmup_steps: int = Field(20, ge=0)
    # After warmup: linear decay to 0 over the remaining steps, or warmup-stable-decay (constant lr,
    # then linear decay to 0 over the last decay_steps, or over all steps after warmup when fewer).
    lr_schedule: Literal["linear_decay", "wsd"] = "linear_decay"
    decay_steps: int = Field(0, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    # Longest tokenised expert conversation kept (longer ones are dropped, and counted).
    max_len: int = Field(512, ge=16)
    # SFT learns from the first `rows` rows of the train split; RL samples its prompts from the rows
    # after them, problems the SFT model has not seen. None = SFT and RL both use every row.
    rows: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _micro_divides(self) -> SFTParams:
        if self.warmup_steps > self.steps:
            raise ValueError(f"warmup_steps={self.warmup_steps} > steps={self.steps}")
        if self.lr_schedule == "wsd" and self.decay_steps < 1:
            raise ValueError(f"decay_steps={self.decay_steps} must be at least 1 with lr_schedule: wsd")
        if self.batch_size % self.micro_batch_size:
            raise ValueError(
                f"batch_size={self.batch_size} is not a multiple of micro_batch_size={self.micro_batch_size}"
            )
        return self


class RolloutParams(Section):
    # Generation engine: vllm (default) or hf (transformers generate, fallback).
    engine: Literal["vllm", "hf"] = "vllm"
    # Engine precision for generation: float32, bfloat16, or auto (bfloat16 where the hardware has it).
    dtype: Literal["float32", "bfloat16", "auto"] = "float32"
    # Most agent turns (steps) per episode.
    max_steps: int = Field(4, ge=1, le=64)
    # Most tokens the model may see at one step; longer contexts end the episode as truncated.
    max_prompt_len: int = Field(512, ge=16)
    # Most new tokens per step; a cut response is recorded as truncated.
    max_response_len: int = Field(64, ge=1)
    # Past turns a prompt keeps after the first observation (system + first user message): each turn is
    # its exact response and observation ids. None = the whole history.
    context_window: int | None = Field(None, ge=1)
    # KV cache size for the vLLM CPU backend, GiB.
    kv_cache_gib: float = Field(1.0, gt=0)
    # vLLM on CUDA only: the share of the GPU's memory vLLM takes (weights + KV cache), in (0, 1); the
    # rest is the trainer's. Accepted and unused on CPU.
    gpu_memory_utilization: float = Field(0.3, gt=0, lt=1)
    # vLLM on CUDA only: sleep (weights to CPU memory, KV cache freed) during the RL update, wake up
    # before the weight sync. Accepted and unused on CPU.
    sleep_during_update: bool = True
    # Tool-call format of the model family (components.envs.tool_formats: hermes, llama3_json,
    # mistral, qwen3_xml, qwen3_coder): what the env parses, SFT demonstrations and chat write.
    tool_parser: str = "hermes"
    # Bounded staleness s of the train stage's rollouts (components.train.staleness): iteration k's
    # rollout is generated by the weights after update k-1-s (the SFT weights for k <= s), in the
    # background while updates k-s..k-1 are computed. 0 = synchronous: every rollout by the weights
    # its update starts from. s >= 1 needs an off-policy treatment (Params._staleness_is_corrected).
    staleness: int = Field(0, ge=0)
    # Partial rollouts (components.train.partial): an iteration's rollout stops as soon as it has
    # its batch of complete groups; the episodes still running go on in the next iteration's rollout,
    # under its weights, each step keeping the policy version that generated it.
    partial: bool = False
    # Groups in flight at once with partial rollouts, as a multiple of the batch's groups (>= 1): each
    # rollout tops the pool up with new groups and stops once the batch's worth are complete, so the
    # slowest (pool - 1) share goes on in the next iteration. 1 waits for every group, as without.
    partial_pool: float = Field(1.5, ge=1.0, le=8.0)
    # The CPUs the own-process engine's worker binds its threads to (vLLM's VLLM_CPU_OMP_THREADS_BIND):
    # auto (vLLM's choice: on 2 CPUs it keeps one for its scheduler and binds the worker to the other),
    # nobind, or a list such as "1" or "2-3,6". Only for the engine in its own process (rollout.own_process,
    # rollout.staleness >= 1 or deepspeed.world_size > 1); train.threads sets the trainer's side.
    engine_cpus: str = "auto"
    # vLLM in a process of its own at staleness 0 and one rank as well (as verl's standalone rollout
    # against its hybrid engine): each update's weights reach it through its worker RPC instead of
    # being loaded in place, and engine_cpus binds its threads. Always so at rollout.staleness >= 1
    # and deepspeed.world_size > 1 (Params.engine_in_own_process). false: the in-process engine.
    own_process: bool = False
    # In-flight weight updates (components.rollout.vllm_inflight), at rollout.staleness >= 1: each new
    # version is pushed into the engine as soon as the update has made it, into a running generation
    # too (paused between two decode steps, its requests kept and their caches recomputed), so a
    # rollout goes on under the newest weights; each step keeps the version it started with. Not
    # reproducible where a push lands mid-rollout (it depends on timing). false: a version is synced
    # only between two generations.
    inflight_updates: bool = False

    _tool_parser_known = field_validator("tool_parser")(_known("tool_parser"))

    @field_validator("engine_cpus", mode="before")
    @classmethod
    def _cpu_list(cls, value: Any) -> str:
        if isinstance(value, int) and not isinstance(value, bool):  # `-S rollout.engine_cpus=1`: YAML's int
            value = str(value)
        if isinstance(value, str) and (value in ("auto", "nobind") or cpu_ids(value)):
            return value
        raise ValueError(f"engine_cpus={value!r}: give auto, nobind or a CPU list such as '1' or '0,2-3'")

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The section's dump without the keys added since runs were recorded, at their defaults
        (``staleness`` 0, ``partial`` off and its pool, ``engine_cpus`` auto, ``own_process`` and
        ``inflight_updates`` off): what a run's fingerprint, its Prefect cache keys and its MLflow
        params read stays what it was before those keys existed."""
        out = _without_defaults(
            handler(self),
            {
                "staleness": 0,
                "partial": False,
                "engine_cpus": "auto",
                "own_process": False,
                "inflight_updates": False,
            },
        )
        if not self.partial:
            out.pop("partial_pool", None)
        return out

    def episode_limits(self) -> dict[str, int | None]:
        """The limits of an episode, as :func:`components.agent.loop.run_episodes` takes them."""
        return {
            "max_steps": self.max_steps,
            "max_prompt_len": self.max_prompt_len,
            "max_response_len": self.max_response_len,
            "context_window": self.context_window,
        }

    def engine_settings(
        self, seed: int, *, updates: bool = False, own_process: bool = False
    ) -> EngineSettings:
        """The rollout engine's :class:`components.rollout.base.EngineSettings` for a run seeded
        ``seed``: a step's prompt + response fit its context (``max_model_len``); it sleeps during the
        update (``sleep_during_update``) only where an update runs beside it (``updates``), and never at
        ``staleness`` >= 1, where it generates during the update;
        ``own_process``: vLLM in a process of its own (Params.engine_in_own_process)."""
        return EngineSettings(
            engine=self.engine,
            dtype=self.dtype,
            max_model_len=self.max_prompt_len + self.max_response_len,
            kv_cache_gib=self.kv_cache_gib,
            seed=seed,
            gpu_memory_utilization=self.gpu_memory_utilization,
            sleep_mode=self.sleep_during_update and updates and self.staleness == 0,
            own_process=own_process,
            cpu_bind=self.engine_cpus,
            inflight_updates=self.inflight_updates and own_process,
        )


# The suffix of a protocol played with the no-op escape (evaluate.noop_escape_protocols): greedy_escape.
ESCAPE = "_escape"


def protocol_name(temperature: float | None) -> str:
    """The name of an evaluation protocol: ``greedy`` (None), or ``t<T>`` for sampling at temperature T
    (``t0.4``, ``t1``); played with the no-op escape it is ``<name>_escape`` (``greedy_escape``). The key
    of its metrics in eval_<model>.json, ``eval/<name>/*`` and ``val/<name>/*``."""
    return "greedy" if temperature is None else f"t{temperature:g}"


def is_sampled(name: str) -> bool:
    """Whether a protocol samples (``t0.4``, ``t1_escape``) rather than decodes greedily."""
    return name.removesuffix(ESCAPE) != "greedy"


def protocol_label(name: str, samples: int | None = None) -> str:
    """A protocol in words for reports: ``greedy``, ``sampled at T=0.4`` (``, k per problem`` with k),
    ``greedy with the no-op escape``."""
    base = name.removesuffix(ESCAPE)
    escape = " with the no-op escape" if name != base else ""
    if base == "greedy":
        return f"greedy{escape}"
    k = "" if samples is None else f", {samples} per problem"
    return f"sampled at T={base[1:]}{k}{escape}"


def _temperatures_valid(values: list[float]) -> list[float]:
    """Sampling temperatures of evaluation protocols: each in (0, 2], none repeated."""
    for v in values:
        if not 0 < v <= 2:
            raise ValueError(f"{values}: every temperature must be in (0, 2] (greedy is always run), not {v}")
    names = [protocol_name(v) for v in values]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"{values} repeats temperature {repeated[0][1:]}")
    return values


class EvaluateParams(Section):
    # Split to evaluate on.
    split: Literal["val", "test"] = "test"
    # Evaluate at most this many rows (None = all).
    max_samples: int | None = Field(None, ge=1)
    # Sampled episodes per row at each of `temperatures`, besides the greedy one (mean@k, pass@k per
    # temperature); 0 = greedy only.
    samples: int = Field(2, ge=0, le=64)
    # The sampled protocols: one per temperature (verl-agent validates at 0.4, RAGEN at 0.5, BALROG at
    # 1.0; docs/evaluation.md). Each is named t<T> (t0.4, t1) in the eval files and MLflow.
    temperatures: list[float] = [0.4, 1.0]
    # Protocols (greedy, t<T>) played a second time with the no-op escape, each a protocol of its own
    # (greedy_escape, t0.4_escape): within an episode, a reply that already changed nothing from the same
    # state is resampled at noop_escape_temperature, up to noop_escape_tries times. [] = none. Tasks with
    # state keys only (sokoban, babyai); an inference-time rule, not training (docs/evaluation.md).
    noop_escape_protocols: list[str] = []
    noop_escape_tries: int = Field(4, ge=1, le=16)
    noop_escape_temperature: float = Field(1.0, gt=0, le=2)

    _temperatures_ok = field_validator("temperatures")(_temperatures_valid)

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "temperature" in data:
            raise ValueError(
                f"temperature={data['temperature']!r}: evaluate.temperature is now evaluate.temperatures, "
                "a list (one sampled protocol per temperature, e.g. [0.4, 1.0])"
            )
        if isinstance(data, dict) and data.get("noop_escape_tries") == 0:
            raise ValueError(
                "noop_escape_tries=0: the escape is now switched on per protocol by "
                "evaluate.noop_escape_protocols ([] = off, e.g. [greedy, t0.4]); tries must be >= 1"
            )
        return data

    @model_validator(mode="after")
    def _escape_protocols_evaluated(self) -> EvaluateParams:
        plain = self.plain_protocols
        for name in self.noop_escape_protocols:
            if name not in plain:
                raise ValueError(
                    f"noop_escape_protocols: {name!r} is not a protocol the evaluation runs without the "
                    f"escape ({plain}: greedy, and t<T> for each of temperatures when samples > 0)"
                )
        if len(set(self.noop_escape_protocols)) < len(self.noop_escape_protocols):
            raise ValueError(f"noop_escape_protocols: {self.noop_escape_protocols} names a protocol twice")
        return self

    @property
    def plain_protocols(self) -> list[str]:
        """Greedy, then one protocol per temperature (when samples > 0), without the escape."""
        sampled = [protocol_name(t) for t in self.temperatures] if self.samples else []
        return ["greedy", *sampled]

    @property
    def protocols(self) -> list[str]:
        """The protocols a test evaluation runs: :attr:`plain_protocols`, then each of
        noop_escape_protocols with the escape (``greedy_escape``): the names of :meth:`plays`."""
        return [name for name, _, _ in self.plays()]

    def plays(self) -> list[tuple[str, float | None, bool]]:
        """(protocol, temperature (None = greedy), with the escape) of every protocol, in order."""
        temps = {protocol_name(t): t for t in self.temperatures}
        plain = [(name, temps.get(name), False) for name in self.plain_protocols]
        return plain + [(name + ESCAPE, temps.get(name), True) for name in self.noop_escape_protocols]


class AlgoParams(Section):
    """One RL algorithm: a preset (grpo, ppo, steppo) and any part of it overridden."""

    # Preset that fills every part left null below (components.algos.PRESETS: grpo, ppo, steppo).
    preset: str
    # Advantage estimator (components.algos.ADVANTAGE_ESTIMATORS); null = the preset's.
    estimator: str | None = None
    # Policy loss (components.algos.POLICY_LOSSES: ppo, gspo, reinforce); null = the preset's.
    policy_loss: str | None = None
    # Loss aggregation (components.algos.AGG_MODES: token-mean, seq-mean-token-mean, seq-mean-token-sum,
    # seq-mean-token-sum-norm); null = the preset's.
    loss_agg: str | None = None
    # Trajectories sampled per prompt (GRPO-family estimators need >= 2).
    samples_per_prompt: int = Field(4, ge=1, le=64)
    # Policy ratio clip range (the gspo loss wants much smaller values, about 3e-4 / 4e-4).
    clip_low: float = Field(0.2, gt=0)
    clip_high: float = Field(0.2, gt=0)
    # Dual-clip constant for negative advantages (ppo loss).
    clip_ratio_c: float = Field(3.0, gt=1)
    # Actor learning rate.
    lr: float = Field(1e-4, gt=0, le=1)
    # gigpo estimator only: the step-level advantage's weight w, and how it is normalised within an
    # anchor-state group: std = (G - mean) / std (the paper's main variant, verl-agent's mean_std_norm);
    # mean = G - mean (verl-agent's mean_norm; no division by a near-zero std).
    step_weight: float = Field(1.0, ge=0)
    step_norm: Literal["std", "mean"] = "std"
    # DAPO's dynamic sampling for this algorithm alone (train.dynamic_sampling: null = that setting):
    # e.g. true for GRPO and GiGPO while PPO and StepPO, one sample per prompt, go without.
    dynamic_sampling: bool | None = None
    # Off-policy correction of the policy loss (components.algos.OFFPOLICY_CORRECTIONS): none; tis,
    # each token's loss times min(pi_old / pi_rollout, C), detached (per step row for the gspo loss);
    # decoupled, the ratio pi / pi_prox (pi_prox: the recomputed old log-probs) and the loss times
    # pi_prox / pi_rollout where <= C, else 0. tis needs train.old_logprobs detached or recompute,
    # decoupled recompute; both train.temperature 1.
    correction: str = "none"
    # The correction's cap C (>= 1).
    correction_cap: float = 2.0

    _preset_known = field_validator("preset")(_known("preset"))
    _estimator_known = field_validator("estimator")(_known("estimator"))
    _loss_known = field_validator("policy_loss")(_known("policy_loss"))
    _agg_known = field_validator("loss_agg")(_known("loss_agg"))
    _correction_known = field_validator("correction")(_known("correction"))

    @field_validator("correction_cap")
    @classmethod
    def _cap_at_least_one(cls, cap: float) -> float:
        if not cap >= 1.0:
            raise ValueError(
                f"correction_cap={cap} < 1 would down-weight tokens on which the rollout and the trainer "
                "agree (weight 1); C must be >= 1 (verl's TIS uses 2)"
            )
        return cap

    def parts(self) -> dict[str, str | None]:
        """The resolved parts: the preset's estimator, policy_loss, loss_agg with every non-null
        override applied, and ``critic`` (None, "token" or "step"), which follows from the estimator."""
        parts = dict(_registry("preset").get(self.preset))
        for key in ("estimator", "policy_loss", "loss_agg"):
            if getattr(self, key) is not None:
                parts[key] = getattr(self, key)
        parts["critic"] = _registry("estimator").get(parts["estimator"]).critic
        return parts

    @model_validator(mode="after")
    def _groups_have_samples(self) -> AlgoParams:
        estimator = self.parts()["estimator"]
        if _registry("estimator").get(estimator).needs_groups and self.samples_per_prompt < 2:
            raise ValueError(
                f"estimator {estimator!r} (preset {self.preset!r}) takes its baseline from the other samples "
                f"of the same prompt and needs samples_per_prompt >= 2 (got {self.samples_per_prompt})"
            )
        return self


class TrainParams(Section):
    # RL iterations (rollout -> score -> advantage -> update -> sync).
    iterations: int = Field(20, ge=1)
    # Trajectories sampled per iteration (prompts = this / samples_per_prompt, so every algorithm
    # sees the same number of episodes).
    trajectories_per_iteration: int = Field(64, ge=1)
    # Sampling temperature of training rollouts.
    temperature: float = Field(1.0, gt=0)
    # Passes over each iteration's batch, and step rows per optimizer step / per forward pass.
    ppo_epochs: int = Field(1, ge=1)
    mini_batch_size: int = Field(64, ge=1)
    micro_batch_size: int = Field(16, ge=1)
    # Discount and GAE lambda (the critic-based estimators).
    gamma: float = Field(1.0, ge=0, le=1)
    lam: float = Field(1.0, ge=0, le=1)
    # KL to the frozen SFT reference: coefficient (0 = off), estimator (kl, mse, low_var_kl), and
    # whether it is a loss term (false) or a per-token reward penalty (true).
    kl_coef: float = Field(0.0, ge=0)
    kl_kind: str = "low_var_kl"
    kl_in_reward: bool = False
    # Entropy bonus coefficient.
    entropy_coef: float = Field(0.0, ge=0)
    # Critic learning rate, value clip range and warm-up iterations with the actor frozen.
    critic_lr: float = Field(1e-3, gt=0, le=1)
    value_clip: float = Field(0.5, gt=0)
    critic_warmup: int = Field(0, ge=0)
    # Step rows per critic optimizer step (null = mini_batch_size, as the actor; verl's
    # critic.ppo_mini_batch_size): a critic may take several steps where the actor takes one.
    critic_mini_batch_size: int | None = Field(None, ge=1)
    # Gradient-norm clip for actor and critic.
    grad_clip: float = Field(1.0, gt=0)
    # Optimizer steps of linear learning-rate warmup for actor and critic (then constant), and AdamW's
    # epsilon. A fresh Adam's first steps move every weight by about lr whatever its gradient; warmup
    # lets the second-moment estimate settle first.
    lr_warmup_steps: int = Field(0, ge=0)
    adam_eps: float = Field(1e-8, gt=0, le=1)
    # The critic's own lr warmup (optimizer steps; null = lr_warmup_steps): a critic that starts from
    # the critic_warmup stage's fit without its Adam moments (bf16 or ZeRO >= 1) can take its first
    # in-run steps small instead of undoing the fit.
    critic_lr_warmup_steps: int | None = Field(None, ge=0)
    # Reward added to a step whose tool call or answer is malformed (0 = none; e.g. -0.1).
    malformed_penalty: float = Field(0.0, le=0)
    # Weight w of the task's process rewards (its score of each tool call), normalised apart from the
    # outcome reward (PRIME; docs/algorithms.md "Process rewards"). 0 = outcome only. Only for tasks
    # that score tool calls (TaskRecipe.scores_tool_calls).
    process_reward_weight: float = Field(0.0, ge=0, le=100)
    # Old log-probs of the policy ratio: "detached" (the update's own forward, detached: exact and free,
    # on-policy only), "rollout" (the sampler's own: no actor forward; exact only where the sampler and
    # the trainer agree numerically; needs temperature 1) or "recompute" (one actor forward).
    old_logprobs: Literal["detached", "rollout", "recompute"] = "rollout"
    # The update's (and the old-log-prob and value passes') forwards packed end to end, no padding
    # (components.train.packing): about 2.5x fewer positions on calc; equal up to matmul summation order.
    packed_forward: bool = False
    # Validation on this many val rows every `val_every` iterations (and after the last): one greedy
    # episode per row, and one sampled episode per row at each of `val_temperatures` ([] = greedy only;
    # val/<key> and val/greedy/<key> are the greedy episodes', val/t<T>/<key> the sampled ones').
    val_every: int = Field(5, ge=1)
    val_samples: int = Field(64, ge=1)
    val_temperatures: list[float] = [0.4]
    # Which sampled prompt groups an iteration trains on (components/train/group_filter.py; groups of
    # samples_per_prompt >= 2 only). std_filter_keep in (0, 1]: sample ceil(prompts / keep) groups and
    # keep the `prompts` whose returns vary most within the group (RAGEN's StarPO-S; 1 = off).
    # dynamic_sampling: drop groups whose returns are all equal and sample more, for at most
    # dynamic_sampling_rounds rounds of sampling (DAPO).
    std_filter_keep: float = Field(1.0, gt=0, le=1)
    dynamic_sampling: bool = False
    dynamic_sampling_rounds: int = Field(3, ge=1)
    # The train stage's torch threads (null: OMP_NUM_THREADS, else at most 2: components.determinism).
    # Beside an engine in its own process (rollout.engine_cpus) 1 leaves the other core to it.
    threads: int | None = Field(None, ge=1)

    _kl_known = field_validator("kl_kind")(_known("kl_kind"))
    _val_temperatures_ok = field_validator("val_temperatures")(_temperatures_valid)

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The section's dump without ``threads`` at null, so a run's fingerprint, cache keys and MLflow
        params stay what they were before the key existed."""
        return _without_defaults(handler(self), {"threads": None})

    @model_validator(mode="after")
    def _micro_divides(self) -> TrainParams:
        for key in ("mini_batch_size", "critic_mini_batch_size"):
            size = getattr(self, key)
            if size is not None and size % self.micro_batch_size:
                raise ValueError(
                    f"{key}={size} is not a multiple of micro_batch_size={self.micro_batch_size}"
                )
        return self


class CriticWarmupParams(Section):
    # The critic_warmup stage (flows/critic_warmup.py): fit the critic of the critic-based algorithms
    # on the SFT policy's returns once, before any RL run starts from it. Episodes of the SFT policy
    # (0 = off: each run's critic starts from the SFT backbone with a zero value head).
    episodes: int = Field(0, ge=0)
    # Episodes beyond the RL prompts play each prompt again (in new orders: no prompt two ahead).
    # Share of the prompts (each with all its episodes) held out to measure explained variance.
    held_out: float = Field(0.2, gt=0, lt=1)
    # Step rows per optimizer step, learning rate, and the most optimizer steps.
    batch_size: int = Field(128, ge=1)
    lr: float = Field(1e-3, gt=0, le=1)
    # Optimizer steps of linear learning-rate warmup: the fit starts from the linear probe's head, which
    # full-size first Adam steps on every weight would throw away.
    lr_warmup_steps: int = Field(20, ge=0)
    max_steps: int = Field(400, ge=1)
    # Held-out explained variance is measured every eval_every steps; the fit stops after `patience`
    # measurements without a new best and keeps the best weights.
    eval_every: int = Field(10, ge=1)
    patience: int = Field(4, ge=1)

    def split_problem(self, prompts: int | None, source: str, more_prompts: str) -> str | None:
        """Why the warm-up's split of its played prompts would leave a part empty, None when it would
        not. ``episodes`` play ``min(episodes, prompts)`` prompts (beyond them the same prompts again;
        ``prompts`` None: not known yet, as many as episodes), split by :func:`warmup_held_out` as
        flows/critic_warmup.py splits them; ``source`` says where ``prompts`` comes from,
        ``more_prompts`` how to get more."""
        played = self.episodes if prompts is None else min(self.episodes, prompts)
        if not self.episodes or warmup_held_out(played, self.held_out) is not None:
            return None
        held = math.ceil(self.held_out * played)
        enough = _fewest_prompts(self.held_out)  # the fewest prompts this held_out splits
        fixes = []
        if played >= 3:
            fixes.append(f"set critic_warmup.held_out above 1/{played} and at most {played - 1}/{played}")
        if (prompts is None or enough <= prompts) and self.episodes < enough:
            fixes.append(f"set critic_warmup.episodes={enough} or more")
        elif prompts is not None and enough > prompts:
            fixes.append(
                f"give RL more prompts ({more_prompts}; more episodes only replay the same {prompts}: at "
                f"held_out={self.held_out} the split needs {enough} prompts)"
            )
        fixes.append("set critic_warmup.episodes=0 (off)")
        pool = source if prompts is None else f"{source}: {prompts} RL prompt(s)"
        return (
            f"critic_warmup.episodes={self.episodes} play {played} prompt(s) ({pool}; episodes beyond "
            f"the RL prompts play the same prompts again) and critic_warmup.held_out="
            f"{self.held_out} holds out ceil({self.held_out} x {played}) = {held} of them; the fit needs "
            "at least one train prompt and two held out (one chooses the step, one reports it): "
            + "; or ".join(fixes)
        )


def warmup_held_out(prompts: int, held_out: float) -> tuple[int, int] | None:
    """(selection, report) prompt counts when the critic warm-up holds out a share ``held_out`` of
    ``prompts`` prompt groups (rounded up, then halved, the selection half rounded up); None when the
    train, selection or report part would be empty. The one rule of the split and of its checks."""
    held = math.ceil(held_out * prompts)
    if held < 2 or held >= prompts:
        return None
    select = math.ceil(held / 2)
    return select, held - select


def _fewest_prompts(held_out: float) -> int:
    """The fewest prompt groups :func:`warmup_held_out` splits at ``held_out`` (0 < held_out < 1)."""
    n = max(3, int(1 / held_out))
    while warmup_held_out(n, held_out) is None:
        n += 1
    return n


class CompareParams(Section):
    # Algorithms trained by `dvc repro` (keys of `algorithms`), compared in reports/compare.md.
    algorithms: list[str] = ["grpo", "ppo", "steppo"]
    # RL seeds: every algorithm is trained once per seed from the one SFT checkpoint (trained with
    # `seed`); the run of algorithm a with seed s is named `a-s<s>` (run_name).
    seeds: list[int] = [0, 1]
    # The evaluation protocol the report leads with: greedy, or t<T> for a temperature T of
    # evaluate.temperatures (t0.4: sampled at T=0.4); every headline line names it.
    headline: str = "t0.4"

    @model_validator(mode="after")
    def _seeds_valid(self) -> CompareParams:
        if not self.seeds:
            raise ValueError("seeds=[] is empty: give at least one RL seed (e.g. [0])")
        negative = [s for s in self.seeds if s < 0]
        if negative:
            raise ValueError(f"seeds={self.seeds}: every RL seed must be >= 0 (not {negative[0]})")
        repeated = sorted({s for s in self.seeds if self.seeds.count(s) > 1})
        if repeated:
            raise ValueError(f"seeds={self.seeds} repeats {repeated[0]}: every RL seed must be unique")
        return self

    @staticmethod
    def run_name(algo: str, seed: int) -> str:
        """The name of one RL run: models/<name>/final, runs/<name>/, metrics/*_<name>.json, MLflow run."""
        return f"{algo}-s{seed}"

    def runs(self) -> list[tuple[str, int, str]]:
        """(algorithm, RL seed, run name) of every compared run, algorithm-major."""
        return [(a, s, self.run_name(a, s)) for a in self.algorithms for s in self.seeds]


class MLflowParams(Section):
    # Tracking URI; None = sqlite store mlflow/mlflow.db with artifacts under mlflow/artifacts.
    tracking_uri: str | None = None
    # Experiment name; None = the task name.
    experiment: str | None = None


class Params(Section):
    # Task: a name registered in components.envs.TASKS (a folder components/tasks/<name>/, or a module
    # of `plugins` that registers it). Required: there is no default task.
    task: str
    # Modules imported before validation (e.g. a user's package with its own task): importing one
    # registers what it defines. Names like "mypkg.tasks.toy", importable from the working directory.
    plugins: list[str] = []
    # Each task's own params section by task name, validated by that task's params_model (after
    # validation: the validated model, with the selected task's section filled with its defaults if
    # it was omitted).
    tasks: dict[str, Any] = {}
    # Global seed (data generation, model init, sampling).
    seed: int = Field(0, ge=0)
    prepare: PrepareParams = PrepareParams()
    model: ModelParams = ModelParams()
    deepspeed: DeepSpeedParams = DeepSpeedParams()
    sft: SFTParams = SFTParams()
    rollout: RolloutParams = RolloutParams()
    evaluate: EvaluateParams = EvaluateParams()
    train: TrainParams = Field(default_factory=TrainParams)
    critic_warmup: CriticWarmupParams = CriticWarmupParams()
    algorithms: dict[str, AlgoParams] = Field(
        default_factory=lambda: {
            "grpo": AlgoParams(preset="grpo"),
            "ppo": AlgoParams(preset="ppo", samples_per_prompt=1),
            "steppo": AlgoParams(preset="steppo", samples_per_prompt=1, clip_low=3e-4, clip_high=4e-4),
        }
    )
    compare: CompareParams = CompareParams()
    mlflow: MLflowParams = MLflowParams()
    # Named sets of overrides (dotted key -> value) for a run that needs several keys changed at once,
    # e.g. a task with longer episodes. `python -m flows.repro --profile <name>` runs `dvc exp run` with
    # one `-S key=value` per entry; no stage reads them. Their keys are checked at load, their values
    # when the profile is applied.
    profiles: dict[str, dict[str, Any]] = {}

    _task_known = field_validator("task")(_known("task"))

    @field_validator("tasks")
    @classmethod
    def _task_sections_valid(cls, tasks: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        """Each section validated by its task's params_model (the selected task's filled with defaults
        when left out); errors name tasks.<name>.<key>. Runs beside the other fields' checks, so their
        errors are reported together."""
        errors: list[tuple[str, str, Any]] = []
        validated: dict[str, Any] = {}
        selected = info.data.get("task")  # absent when `task` itself failed
        for name, section in (({selected: None} if selected else {}) | tasks).items():
            try:
                recipe = _registry("task").get(name)
            except UnknownNameError as err:
                errors.append((f"tasks.{name}", str(err), name))
                continue
            if section is not None and not isinstance(section, dict | recipe.params_model):
                errors.append((f"tasks.{name}", "must be a mapping of the task's params", section))
                continue
            try:
                validated[name] = recipe.params(section)
            except ValidationError as err:
                for e in err.errors():
                    path = ".".join(["tasks", name, *(str(p) for p in e["loc"])])
                    errors.append((path, _message(e), e.get("input")))
        if errors:
            raise _KeyedErrors(errors)
        return validated

    @property
    def task_params(self) -> Any:
        """The selected task's validated params section (an instance of its recipe's params_model)."""
        return self.tasks[self.task]

    @model_validator(mode="after")
    def _headline_evaluated(self) -> Params:
        known = self.evaluate.protocols
        if self.compare.headline not in known:
            raise ValueError(
                f"compare.headline={self.compare.headline!r} is not an evaluated protocol: the test "
                f"evaluation runs {known} (evaluate.samples={self.evaluate.samples}, "
                f"evaluate.temperatures={self.evaluate.temperatures}); name one of them"
            )
        return self

    @model_validator(mode="after")
    def _context_fits(self) -> Params:
        need = self.rollout.max_prompt_len + self.rollout.max_response_len
        if self.model.path is None and need > self.model.max_position_embeddings:
            raise ValueError(
                f"rollout.max_prompt_len + rollout.max_response_len = {need} > "
                f"model.max_position_embeddings={self.model.max_position_embeddings}"
            )
        return self

    @model_validator(mode="after")
    def _episodes_fit_max_steps(self) -> Params:
        need = self.task_params.turns_needed()
        if need is not None and self.rollout.max_steps < need:
            hint = ""
            if any(p.get("task") == self.task for p in self.profiles.values()):
                name = next(n for n, p in self.profiles.items() if p.get("task") == self.task)
                hint = f"; profiles.{name} has settings for this task: python -m flows.repro --profile {name}"
            raise ValueError(
                f"rollout.max_steps={self.rollout.max_steps} < {need}, the agent turns the longest "
                f"{self.task} problem of tasks.{self.task} needs: raise rollout.max_steps or lower "
                f"the task's difficulty{hint}"
            )
        return self

    @model_validator(mode="after")
    def _process_rewards_exist(self) -> Params:
        w = self.train.process_reward_weight
        if w > 0 and not getattr(_registry("task").get(self.task), "scores_tool_calls", False):
            raise ValueError(
                f"train.process_reward_weight={self.train.process_reward_weight} but task {self.task!r} "
                "gives no process rewards (its recipe has scores_tool_calls=False): set it to 0"
            )
        return self

    @model_validator(mode="after")
    def _tool_parser_has_tools(self) -> Params:
        if self.rollout.tool_parser != "hermes" and not _registry("task").get(self.task).tools():
            raise ValueError(
                f"rollout.tool_parser={self.rollout.tool_parser!r} but task {self.task!r} has no tools "
                "(its actions are text): set rollout.tool_parser to hermes"
            )
        return self

    @model_validator(mode="after")
    def _rl_prompts_left(self) -> Params:
        rows, n_train = self.sft.rows, self.prepare.n_train
        if self.task_params.generates_train_rows() and rows is not None and rows >= n_train:
            raise ValueError(
                f"sft.rows={rows} leaves no train rows for RL prompts (prepare.n_train={n_train}); "
                f"raise prepare.n_train or lower sft.rows"
            )
        return self

    @model_validator(mode="after")
    def _critic_warmup_splits(self) -> Params:
        rows, n_train = self.sft.rows, self.prepare.n_train
        if not self.task_params.generates_train_rows():  # a file of unknown size: checked again on it
            prompts, source = None, "at most: the task's train file decides how many RL prompts there are"
        else:
            prompts = n_train - (rows or 0)
            source = f"prepare.n_train={n_train}" + (f" - sft.rows={rows}" if rows else ", sft.rows=None")
        problem = self.critic_warmup.split_problem(
            prompts, source, more_prompts="raise prepare.n_train or lower sft.rows"
        )
        if problem is not None and prompts != 0:  # none at all: _rl_prompts_left names the keys
            raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _algorithms_fit_train(self) -> Params:
        t = self.train
        for name, a in self.algorithms.items():
            if a.samples_per_prompt > t.trajectories_per_iteration:
                raise ValueError(
                    f"algorithms.{name}.samples_per_prompt={a.samples_per_prompt} > "
                    f"train.trajectories_per_iteration={t.trajectories_per_iteration}: an iteration samples "
                    "whole groups of samples_per_prompt trajectories"
                )
        if t.critic_warmup >= t.iterations:
            raise ValueError(
                f"train.critic_warmup={t.critic_warmup} >= train.iterations={t.iterations}: the actor would "
                "never be updated (it is frozen for the first critic_warmup iterations)"
            )
        return self

    @model_validator(mode="after")
    def _detached_is_on_policy(self) -> Params:
        t = self.train
        rows = t.trajectories_per_iteration * self.rollout.max_steps  # step rows of an iteration, at most
        if t.old_logprobs == "detached" and (t.ppo_epochs != 1 or t.mini_batch_size < rows):
            raise ValueError(
                f"train.old_logprobs='detached' needs an on-policy update (one optimizer step per "
                f"iteration): train.ppo_epochs={t.ppo_epochs} (need 1) and train.mini_batch_size="
                f"{t.mini_batch_size} (need >= trajectories_per_iteration x rollout.max_steps = {rows}); "
                "use old_logprobs='rollout' or 'recompute'"
            )
        return self

    @model_validator(mode="after")
    def _correction_has_its_logprobs(self) -> Params:
        t = self.train
        for name, a in self.algorithms.items():
            c = _registry("correction").get(a.correction)
            if c.weigh is None:
                continue
            if t.old_logprobs not in c.old_logprobs:
                raise ValueError(
                    f"algorithms.{name}.correction={a.correction!r} weighs by pi_old / pi_rollout, which "
                    f"needs the trainer's own old log-probs beside the rollout's: train.old_logprobs="
                    f"{t.old_logprobs!r} {_WITHOUT_OLD.get(t.old_logprobs, 'does not give them')}; set "
                    f"train.old_logprobs to {' or '.join(c.old_logprobs)}, or the correction to none"
                )
        return self

    def engine_in_own_process(self) -> bool:
        """Whether the train stage's vLLM engine runs in a process of its own: where it generates
        beside the update (``rollout.staleness`` >= 1), beside several data-parallel ranks, or where
        ``rollout.own_process`` asks for it."""
        return self.rollout.own_process or self.rollout.staleness > 0 or self.deepspeed.world_size > 1

    def staleness_problem(self, algo: str | None = None) -> str | None:
        """Why ``rollout.staleness`` > 0 cannot run as set (None when it can, and always at 0): the
        run-wide refusals, then ``algo``'s own (None: the run-wide ones only). The load checks the
        algorithms of compare.algorithms; the train stage the one it runs."""
        s, r, t = self.rollout.staleness, self.rollout, self.train
        problem = self._overlap_problem(algo)
        if problem is not None or s == 0:
            return problem
        if r.engine == "hf":
            return (
                f"rollout.staleness={s} generates in a thread beside the update, but rollout.engine='hf' "
                "samples from torch's process-wide random generator, which the update's thread shares: "
                "the rollout would not be reproducible; use rollout.engine vllm (a generator per "
                "request) or rollout.staleness 0"
            )
        if self.deepspeed.world_size > 1:
            return (
                f"rollout.staleness={s} with deepspeed.world_size={self.deepspeed.world_size}: the "
                "overlapped rollout is built for one rank (not for the followers' mirrored calls nor "
                "the own-process engine's weight sync); set deepspeed.world_size 1 or rollout.staleness 0"
            )
        if algo is None:
            return None
        a = self.algorithms[algo]
        if a.correction == "none" and t.old_logprobs != "rollout":
            return (
                f"rollout.staleness={s}: iteration k's batch is sampled by the weights up to {s} "
                f"update(s) back (pi_behav), but algorithms.{algo}.correction='none' with "
                f"train.old_logprobs={t.old_logprobs!r} takes pi_old from the trainer's current weights "
                "and never weighs by the rollout's log-probs, so the stale samples would count as "
                f"on-policy; set algorithms.{algo}.correction to tis or decoupled (weight pi_old / "
                "pi_behav), or train.old_logprobs to rollout (the ratio pi / pi_behav)"
            )
        return None

    def _overlap_problem(self, algo: str | None) -> str | None:
        """Why ``rollout.engine_cpus``, ``rollout.inflight_updates`` or ``rollout.partial`` cannot run as
        set (None when they can)."""
        r, t = self.rollout, self.train
        if r.engine_cpus != "auto" and not self.engine_in_own_process():
            return (
                f"rollout.engine_cpus={r.engine_cpus!r} binds the threads of the engine in its own "
                "process, which runs at rollout.own_process true, rollout.staleness >= 1 or "
                "deepspeed.world_size > 1; the in-process engine shares the trainer's threads "
                "(train.threads): set engine_cpus auto, or rollout.own_process true"
            )
        if r.own_process and r.engine != "vllm":
            return (
                f"rollout.own_process puts vLLM in a process of its own, but rollout.engine={r.engine!r} "
                "generates in the trainer's process: set rollout.engine vllm or own_process false"
            )
        if r.inflight_updates and r.staleness == 0:
            return (
                "rollout.inflight_updates pushes each version into the engine in its own process while it "
                "generates, which runs at rollout.staleness >= 1; at 0 every rollout is generated by the "
                "weights its update starts from: set rollout.staleness 1 or more, or inflight_updates false"
            )
        if r.inflight_updates and r.partial:
            return (
                "rollout.inflight_updates with rollout.partial is not built (a carried episode's replayed "
                "steps keep the version of the iteration that played them): turn one of them off"
            )
        if not r.partial:
            return None
        if self.deepspeed.world_size > 1:
            return (
                f"rollout.partial with deepspeed.world_size={self.deepspeed.world_size}: partial rollouts "
                "are built for one rank; set deepspeed.world_size 1 or rollout.partial false"
            )
        if algo is None:
            return None
        key = self.group_filter_key(algo)
        if key is not None:
            return (
                f"rollout.partial with {key}: a partial rollout's batch is the first complete groups, "
                "a group filter picks among all the groups it sampled; turn one of them off"
            )
        if self.algorithms[algo].correction == "none" and t.old_logprobs != "rollout":
            return (
                "rollout.partial: an episode carried to the next iteration goes on under newer weights, so "
                f"its earlier steps are off-policy, but algorithms.{algo}.correction='none' with "
                f"train.old_logprobs={t.old_logprobs!r} would count them as on-policy; set "
                f"algorithms.{algo}.correction to tis or decoupled, or train.old_logprobs to rollout"
            )
        return None

    @model_validator(mode="after")
    def _staleness_is_corrected(self) -> Params:
        for algo in [None, *(a for a in self.compare.algorithms if a in self.algorithms)]:
            problem = self.staleness_problem(algo)
            if problem is not None:
                raise ValueError(problem)
        return self

    def dynamic_sampling(self, algo: str) -> bool:
        """Whether ``algo`` samples dynamically: ``algorithms.<algo>.dynamic_sampling`` where set, else
        ``train.dynamic_sampling``."""
        own = self.algorithms[algo].dynamic_sampling
        return self.train.dynamic_sampling if own is None else own

    def group_filter_key(self, algo: str) -> str | None:
        """The params key that turns a prompt-group filter on for ``algo`` (None when none is on)."""
        if self.train.std_filter_keep < 1.0:
            return "train.std_filter_keep"
        if self.algorithms[algo].dynamic_sampling:
            return f"algorithms.{algo}.dynamic_sampling"
        return "train.dynamic_sampling" if self.dynamic_sampling(algo) else None

    @model_validator(mode="after")
    def _group_filter_has_groups(self) -> Params:
        for a in self.compare.algorithms:
            if a not in self.algorithms or self.algorithms[a].samples_per_prompt >= 2:
                continue
            which = self.group_filter_key(a)
            if which is not None:
                raise ValueError(
                    f"{which} picks prompt groups by the spread of their returns, but algorithms.{a}."
                    "samples_per_prompt=1 samples groups of one: give it samples_per_prompt >= 2 or turn "
                    f"the filter off for it (std_filter_keep: 1.0, algorithms.{a}.dynamic_sampling: false)"
                )
        return self

    @model_validator(mode="after")
    def _algorithms_known(self) -> Params:
        for name in self.compare.algorithms:
            if name not in self.algorithms:
                raise ValueError(
                    f"compare.algorithms names {name!r}, which is not a key of algorithms "
                    f"(known: {sorted(self.algorithms)})"
                )
        return self


# why a train.old_logprobs source cannot serve a correction that it does not list
_WITHOUT_OLD = {
    "rollout": "takes the rollout's log-probs as pi_old (the weight would always be 1)",
    "detached": "takes pi_old from the update's own forward, so there is no proximal policy apart "
    "from pi (the clip could never act)",
}


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """Dotted keys of a nested mapping (``{"a": {"b": 1}}`` -> ``{"a.b": 1}``, each key after
    ``prefix``); lists are values, empty sections have no key."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def apply_overrides(raw: dict[str, Any], overrides: dict[str, Any], source: str) -> dict[str, Any]:
    """A deep copy of ``raw`` with dotted keys set (e.g. {"sft.lr": 1e-3}); a parent that is not a
    section is an error naming the key."""
    raw = copy.deepcopy(raw)
    for dotted, value in overrides.items():
        node = raw
        *parents, leaf = str(dotted).split(".")
        for i, p in enumerate(parents):
            if node.get(p) is None:  # absent, or an empty section (`sft:` with every key commented out)
                node[p] = {}
            node = node[p]
            if not isinstance(node, dict):
                where = ".".join(parents[: i + 1])
                raise ConfigError(f"{source}: override {dotted}: {where} is {node!r}, not a section")
        node[leaf] = value
    return raw


def _check_profiles(raw: dict[str, Any], source: str) -> None:
    """Every key of every profile names a params field (``tasks.<name>.*`` and ``algorithms.<name>.*``
    are checked once applied); the values are validated when a profile is applied
    (``load_params(path, overrides=profile)``), since they are only meant to hold together with it."""
    profiles = raw.get("profiles") or {}
    for name, overrides in profiles.items():  # each a mapping: the field's type was checked
        for key in overrides:
            if not _known_path(str(key)):
                raise ConfigError(f"{source}: profiles.{name}: {key!r} is not a params key")


def _known_path(dotted: str) -> bool:
    """Whether a dotted key names a field of Params (anything inside a free-form mapping counts)."""
    model: Any = Params
    for part in dotted.split("."):
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return True  # inside tasks.<name> or algorithms.<name>: validated when applied
        field = model.model_fields.get(part)
        if field is None:
            return False
        model = field.annotation
    return True


def _message(e: dict[str, Any]) -> str:
    return "unknown key" if e["type"] == "extra_forbidden" else e["msg"].removeprefix("Value error, ")


def _line(source: str, path: str, msg: str, got: Any) -> str:
    shown = "" if isinstance(got, dict | BaseModel) else f" (got {got!r})"
    return f"{source}: {path or '<root>'}: {msg}{shown}"


def _format(err: ValidationError, source: str) -> str:
    lines = []
    for e in err.errors():
        keyed = (e.get("ctx") or {}).get("error")
        if isinstance(keyed, _KeyedErrors):
            lines += [_line(source, path, msg, got) for path, msg, got in keyed.errors]
            continue
        lines.append(_line(source, ".".join(str(p) for p in e["loc"]), _message(e), e.get("input")))
    return "\n".join(lines)


def import_plugins(raw: dict[str, Any], source: str = "params.yaml") -> None:
    """Import every module of ``raw["plugins"]`` (each registers its tasks, tools, ... on import)."""
    plugins = raw.get("plugins") or []
    if not isinstance(plugins, list):
        raise ConfigError(f"{source}: plugins: must be a list of module names (got {plugins!r})")
    for i, name in enumerate(plugins):
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{source}: plugins.{i}: must be a module name (got {name!r})")
        try:
            importlib.import_module(name)
        except ImportError as err:
            raise ConfigError(f"{source}: plugins.{i}: cannot import {name!r}: {err}") from None


def parse_params(raw: dict[str, Any] | None, source: str = "params.yaml") -> Params:
    """Import ``plugins``, then validate a params mapping; raise ConfigError naming every bad key path
    and value."""
    raw = raw or {}
    import_plugins(raw, source)
    try:
        params = Params.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_format(err, source)) from None
    _check_profiles(raw, source)
    return params


def load_params(path: str | Path = "params.yaml", overrides: dict[str, Any] | None = None) -> Params:
    """Read and validate a params file. ``overrides`` maps dotted keys to values (e.g. {"sft.lr": 1e-3})."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: params file not found")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(raw).__name__}")
    return parse_params(apply_overrides(raw, overrides or {}, str(path)), str(path))
