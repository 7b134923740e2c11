"""The three algorithms the user compares, as plain data (docs/algorithms.md, "The presets compared by default").

Each preset names an advantage estimator, a policy loss, a loss aggregation mode and the critic kind
("token", "step" or None; it always equals the estimator's ``critic``). Does not: hold
hyper-parameters (those live in params.yaml) or validate a run's config.
"""

from __future__ import annotations

from components.registry import Registry

__all__ = ["PRESETS", "get_preset"]

PRESETS: Registry[dict[str, str | None]] = Registry("algorithm preset")
PRESETS.register(
    "grpo", {"estimator": "grpo", "policy_loss": "ppo", "loss_agg": "token-mean", "critic": None}
)
PRESETS.register(
    "ppo", {"estimator": "gae", "policy_loss": "ppo", "loss_agg": "token-mean", "critic": "token"}
)
PRESETS.register(
    "steppo",
    {"estimator": "step_gae", "policy_loss": "gspo", "loss_agg": "seq-mean-token-mean", "critic": "step"},
)


def get_preset(name: str) -> dict[str, str | None]:
    """A copy of the preset ``name``; unknown names raise UnknownNameError listing the known ones."""
    return dict(PRESETS.get(name))
