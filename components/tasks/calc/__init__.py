"""The ``calc`` task: arithmetic word problems solved with a calculator tool.

Data: generated problems (``generator.py``) or a GSM8K-style file (``gsm8k.py``), chosen by the
``tasks.calc`` params section (``params.py``). Environment: a ToolEnv with the calculator tool
(``calculator.py``, registered as ``calculator``); reward: exact match of ``<answer>N</answer>``
(``reward.py``). Importing this package registers the recipe under the name ``calc``. The generic tool
metrics (calls per step, answers without a tool) cover calc, so it has no ``episode_metrics`` hook.
"""

from components.envs.registry import register_task
from components.tasks.calc.calculator import CalculatorTool, calculate, evaluate, format_number
from components.tasks.calc.env import make_env, tools
from components.tasks.calc.expert import demonstrations, expert_messages
from components.tasks.calc.generator import generate_splits
from components.tasks.calc.gsm8k import load_gsm8k, load_splits
from components.tasks.calc.params import CalcParams, make_splits
from components.tasks.calc.prompts import SYSTEM_PROMPT, initial_messages
from components.tasks.calc.reward import parse_answer, score
from components.tasks.recipe import TaskRecipe

RECIPE = register_task(
    "calc",
    TaskRecipe(
        name="calc",
        params_model=CalcParams,
        make_splits=make_splits,
        make_env=make_env,
        tools=tools,
        reward=score,
        initial_messages=initial_messages,
        expert_messages=expert_messages,
        demonstrations=demonstrations,
    ),
)

__all__ = [
    "RECIPE",
    "SYSTEM_PROMPT",
    "CalcParams",
    "CalculatorTool",
    "calculate",
    "demonstrations",
    "evaluate",
    "expert_messages",
    "format_number",
    "generate_splits",
    "initial_messages",
    "load_gsm8k",
    "load_splits",
    "make_env",
    "make_splits",
    "parse_answer",
    "score",
    "tools",
]
