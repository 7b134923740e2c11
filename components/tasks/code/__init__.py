"""The ``code`` task: short procedurally generated problems solved by running Python in a sandbox.

Data: eight of reasoning-gym's seeded generators (``generator.py``) mixed by the ``tasks.code`` params
(``params.py``). Environment: a ToolEnv with the ``python`` tool (``tool.py``, registered as ``python``),
whose calls run in the sandbox (components/sandbox); reward: reasoning-gym's ``score_answer`` of the
row's generator on ``<answer>...</answer>``, 1 at its full score, else 0 (``env.py``). Demonstrations: the expert's program and answer, and weaker ones with a NameError first
and the fix after. Importing this package registers the recipe under the name ``code``.
"""

from components.envs.registry import register_task
from components.tasks.code.env import SYSTEM_PROMPT, CodeEnv, initial_messages, make_env, parse_answer, tools
from components.tasks.code.generator import GENERATORS, generate_splits, score_answer
from components.tasks.code.params import CodeParams, make_splits
from components.tasks.code.tool import PythonTool, format_result
from components.tasks.demonstrations import demonstrations, expert_messages
from components.tasks.recipe import TaskRecipe

RECIPE = register_task(
    "code",
    TaskRecipe(
        name="code",
        params_model=CodeParams,
        make_splits=make_splits,
        make_env=make_env,
        tools=tools,
        initial_messages=initial_messages,
        expert_messages=expert_messages,
        demonstrations=demonstrations,
    ),
)

__all__ = [
    "GENERATORS",
    "RECIPE",
    "SYSTEM_PROMPT",
    "CodeEnv",
    "CodeParams",
    "PythonTool",
    "demonstrations",
    "expert_messages",
    "format_result",
    "generate_splits",
    "initial_messages",
    "make_env",
    "make_splits",
    "parse_answer",
    "score_answer",
    "tools",
]
