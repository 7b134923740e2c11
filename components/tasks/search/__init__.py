"""The ``search`` task: multi-hop questions answered by searching an encyclopedia (Search-R1 style).

Data: a generated knowledge base of people, companies, cities and countries with one short passage
each (``kb.py``) and 1-3 hop questions over it (``generator.py``), or local HotpotQA-format files and a
passage corpus (``hotpotqa.py``), chosen by the ``tasks.search`` params section (``params.py``).
Retrieval: BM25 (``bm25s``) built in ``prepare`` and saved with the task data (``index.py``).
Environment: a ToolEnv with the ``search`` tool (``tool.py``, registered as ``search``; ``env.py``);
reward: exact match of the normalised ``<answer>`` (``reward.py``, F1 beside it); task metrics EM,
F1, queries per episode and gold-passage hit rate (``metrics.py``). Importing this package registers
the recipe under the name ``search``.
"""

from components.envs.registry import register_task
from components.tasks.recipe import TaskRecipe
from components.tasks.search.env import SearchEnv, make_env, tools
from components.tasks.search.expert import demonstrations, expert_messages
from components.tasks.search.index import SearchIndex, load_index
from components.tasks.search.metrics import episode_metrics
from components.tasks.search.params import SearchParams, make_splits
from components.tasks.search.prompts import SYSTEM_PROMPT, initial_messages
from components.tasks.search.reward import exact_match, f1, normalize_answer, parse_answer, score
from components.tasks.search.tool import SearchTool

RECIPE = register_task(
    "search",
    TaskRecipe(
        name="search",
        params_model=SearchParams,
        make_splits=make_splits,
        make_env=make_env,
        tools=tools,
        reward=score,
        initial_messages=initial_messages,
        expert_messages=expert_messages,
        demonstrations=demonstrations,
        episode_metrics=episode_metrics,
    ),
)

__all__ = [
    "RECIPE",
    "SYSTEM_PROMPT",
    "SearchEnv",
    "SearchIndex",
    "SearchParams",
    "SearchTool",
    "demonstrations",
    "episode_metrics",
    "exact_match",
    "expert_messages",
    "f1",
    "initial_messages",
    "load_index",
    "make_env",
    "make_splits",
    "normalize_answer",
    "parse_answer",
    "score",
    "tools",
]
