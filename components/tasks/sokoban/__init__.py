"""The ``sokoban`` task: push boxes onto targets on a grid shown as text, one move per agent turn.

A long-horizon task in the RAGEN / GiGPO style: the model reads the grid each turn and writes
``<action>up|down|left|right</action>``; the reward arrives per move (step penalty, box on/off a
target) and at the end (all boxes placed). Levels are generated and solvable by construction
(``level.py``: reverse play, breadth-first solver); the environment is a Gymnasium env driven through
``components.envs.gym_text.GymTextEnv`` (``env.py``); demonstrations are the solver's shortest
solutions and a careless player's (``generator.py``); each step's state key (player and boxes) gives
GiGPO its anchor states. Importing this package registers the recipe under the name ``sokoban``.
"""

from components.envs.registry import register_task
from components.tasks.demonstrations import demonstrations, expert_messages
from components.tasks.prompts import question_messages
from components.tasks.recipe import TaskRecipe
from components.tasks.sokoban.env import CODEC, SokobanEnv, make_env, parse_action, tools
from components.tasks.sokoban.generator import make_splits
from components.tasks.sokoban.metrics import episode_metrics
from components.tasks.sokoban.params import SokobanParams
from components.tasks.sokoban.prompts import SYSTEM_PROMPT, intro

# [system, user]: the system prompt and the start grid (a row's question)
initial_messages = question_messages(SYSTEM_PROMPT, intro)


RECIPE = register_task(
    "sokoban",
    TaskRecipe(
        name="sokoban",
        params_model=SokobanParams,
        make_splits=make_splits,
        make_env=make_env,
        tools=tools,
        initial_messages=initial_messages,
        expert_messages=expert_messages,
        demonstrations=demonstrations,
        episode_metrics=episode_metrics,
    ),
)

__all__ = ["CODEC", "RECIPE", "SokobanEnv", "SokobanParams", "episode_metrics", "initial_messages",
           "make_env", "make_splits", "parse_action"]  # fmt: skip
