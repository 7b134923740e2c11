"""The ``search_calc`` task: questions that need a search and then arithmetic over what it found.

Data: the search task's generated knowledge base with numeric facts added (``facts.py``: years born
and founded, populations) and questions computed from them (``questions.py``: "How old was the
founder of Bolt Co when it was founded?"), with expert and weaker demonstrations (``generator.py``).
Environment: a ToolEnv with the search task's ``search`` tool and the calc task's ``calculator``
(``env.py``); reward: the calc task's exact numeric match of ``<answer>N</answer>``; per-step process
rewards for useful tool calls (``train.process_reward_weight``); per-tool metrics (``metrics.py``).
Importing this package registers the recipe under the name ``search_calc``.
"""

from components.envs.registry import register_task
from components.tasks.calc.reward import score
from components.tasks.recipe import TaskRecipe
from components.tasks.search.expert import demonstrations, expert_messages
from components.tasks.search_calc.env import SearchCalcEnv, make_env, tools
from components.tasks.search_calc.metrics import episode_metrics
from components.tasks.search_calc.params import SearchCalcParams, make_splits
from components.tasks.search_calc.prompts import SYSTEM_PROMPT, initial_messages

RECIPE = register_task(
    "search_calc",
    TaskRecipe(
        name="search_calc",
        params_model=SearchCalcParams,
        make_splits=make_splits,
        make_env=make_env,
        tools=tools,
        reward=score,
        initial_messages=initial_messages,
        expert_messages=expert_messages,
        demonstrations=demonstrations,
        episode_metrics=episode_metrics,
        scores_tool_calls=True,
    ),
)

__all__ = [
    "RECIPE",
    "SYSTEM_PROMPT",
    "SearchCalcEnv",
    "SearchCalcParams",
    "demonstrations",
    "episode_metrics",
    "expert_messages",
    "initial_messages",
    "make_env",
    "make_splits",
    "score",
    "tools",
]
