"""The ``babyai`` task: minigrid's BabyAI levels as text, one action per agent turn.

A real third-party environment through the Gymnasium adapter: the level (``BabyAI-GoToLocalS8N4-v0`` by
default) is made and stepped by minigrid (``env.py``); each turn the model reads the mission and what
it sees in its partial view as short sentences (``text.py``, GLAM-style) and writes
``<action>go forward</action>``; the reward is minigrid's (``1 - 0.9 * steps / max_steps`` on
success) plus a penalty for invalid actions. Demonstrations are minigrid's own BabyAIBot and the bot
with random detours (``generator.py``); each step's state key (agent, carried object, grid) gives
GiGPO its anchor states. Importing this package registers the recipe under the name ``babyai``.
"""

from components.envs.registry import register_task
from components.tasks.babyai.env import CODEC, WorldState, make_env, make_level, state_key, tools
from components.tasks.babyai.generator import bot_episode, make_splits
from components.tasks.babyai.metrics import episode_metrics
from components.tasks.babyai.params import BabyAIParams
from components.tasks.babyai.prompts import SYSTEM_PROMPT, intro
from components.tasks.babyai.text import ACTIONS, action_text, describe, parse_action
from components.tasks.demonstrations import demonstrations, expert_messages
from components.tasks.prompts import question_messages
from components.tasks.recipe import TaskRecipe

# [system, user]: the system prompt and the first observation (a row's question)
initial_messages = question_messages(SYSTEM_PROMPT, intro)


RECIPE = register_task(
    "babyai",
    TaskRecipe(
        name="babyai",
        params_model=BabyAIParams,
        make_splits=make_splits,
        make_env=make_env,
        tools=tools,
        initial_messages=initial_messages,
        expert_messages=expert_messages,
        demonstrations=demonstrations,
        episode_metrics=episode_metrics,
    ),
)

__all__ = ["ACTIONS", "CODEC", "RECIPE", "BabyAIParams", "WorldState", "action_text", "bot_episode",
           "describe", "episode_metrics", "initial_messages", "make_env", "make_level", "make_splits",
           "parse_action", "state_key"]  # fmt: skip
