"""Advantage estimators, policy/value losses, KL and entropy terms, and loss aggregation (docs/algorithms.md).

Registries with one signature each: ``ADVANTAGE_ESTIMATORS`` (``get_advantage_estimator``),
``POLICY_LOSSES`` (``get_policy_loss``), ``KL_ESTIMATORS`` (``get_kl_estimator``), ``AGG_MODES``;
``OFFPOLICY_CORRECTIONS`` (``get_correction``); ``PRESETS`` names the combinations of grpo, ppo and
steppo. Pure tensor math: no models, no engines.
"""

from components.algos.advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageEstimator,
    AdvantageOutput,
    get_advantage_estimator,
)
from components.algos.aggregation import AGG_MODES, aggregate_loss, loss_normalisers
from components.algos.kl import KL_ESTIMATORS, get_kl_estimator, kl_penalty, kl_reward
from components.algos.losses import POLICY_LOSSES, entropy_from_logits, get_policy_loss, value_loss
from components.algos.offpolicy import OFFPOLICY_CORRECTIONS, get_correction
from components.algos.presets import PRESETS, get_preset

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AGG_MODES",
    "KL_ESTIMATORS",
    "OFFPOLICY_CORRECTIONS",
    "POLICY_LOSSES",
    "PRESETS",
    "AdvantageEstimator",
    "AdvantageOutput",
    "aggregate_loss",
    "entropy_from_logits",
    "get_advantage_estimator",
    "get_correction",
    "get_kl_estimator",
    "get_policy_loss",
    "get_preset",
    "kl_penalty",
    "kl_reward",
    "loss_normalisers",
    "value_loss",
]
