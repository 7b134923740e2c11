"""The ``verifiers`` task: any installed verifiers (0.4, ``verifiers.v1``) environment trains in steprl.

``tasks.verifiers.env`` names the environment (a module or package exporting its ``Taskset``, and
its ``Env`` for a multi-turn exchange), ``tasks.verifiers.args`` its taskset's config. The loader
(``loader.py``) resolves it with verifiers' own loaders and refuses, before any work, what steprl
cannot run; the adapter (``adapter.py``) plays an episode with steprl's agent loop as the seat's
harness; the recipe's functions (``recipe.py``) turn the taskset into the prepare stage's tables and
the rubric into the reward and metrics. ``envs/mastermind.py`` is TextArena's Mastermind as a
verifiers environment, with a solver for SFT's demonstrations. Importing this package registers the
recipe under the name ``verifiers`` (docs/tasks/verifiers.md).
"""

from components.envs.registry import register_task
from components.tasks.recipe import TaskRecipe
from components.tasks.verifiers.params import DEFAULT_ENV, VerifiersParams
from components.tasks.verifiers.recipe import (
    demonstrations,
    episode_metrics,
    expert_messages,
    initial_messages,
    make_env,
    make_splits,
    tools,
)

RECIPE = register_task(
    "verifiers",
    TaskRecipe(
        name="verifiers",
        params_model=VerifiersParams,
        make_splits=make_splits,
        make_env=make_env,
        tools=tools,
        initial_messages=initial_messages,
        expert_messages=expert_messages,
        demonstrations=demonstrations,
        episode_metrics=episode_metrics,
    ),
)

__all__ = ["DEFAULT_ENV", "RECIPE", "VerifiersParams"]
