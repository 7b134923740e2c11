"""The critic: a value head (one scalar per position) on the same architecture as the actor.

Built with transformers' token-classification class for the architecture (``num_labels=1``), its
backbone initialised from the SFT checkpoint and the head from zero, so that the first values are 0 for
every state (verl keeps transformers' random head; on sokoban the random head was the slower of the two
to make the values depend on the state: benchmarks/critic_fit.py, docs/tasks/sokoban.md). Saved and
loaded in HF format like any checkpoint. transformers' model classes are imported when a critic is
built or loaded, not with this module (docs/performance.md).
"""

from __future__ import annotations

from pathlib import Path

import torch


def build_critic(model_dir: str | Path, *, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A critic whose backbone is the causal LM in ``model_dir`` and whose value head starts at zero.

    No dropout before the value head (``classifier_dropout=0``, as verl's critic): transformers'
    token-classification heads default to 0.1, which made value regression noisy and made two
    processes (data-parallel ranks) compute different gradients from the same batch."""
    from transformers import AutoConfig, AutoModelForTokenClassification

    config = AutoConfig.from_pretrained(str(model_dir), num_labels=1)
    config.classifier_dropout = 0.0
    critic = AutoModelForTokenClassification.from_pretrained(str(model_dir), config=config, dtype=dtype)
    head = getattr(critic, "score", None) or critic.classifier
    with torch.no_grad():
        head.weight.zero_()
        if getattr(head, "bias", None) is not None:
            head.bias.zero_()
    return critic


def load_critic(model_dir: str | Path, *, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    from transformers import AutoModelForTokenClassification

    return AutoModelForTokenClassification.from_pretrained(str(model_dir), dtype=dtype)
