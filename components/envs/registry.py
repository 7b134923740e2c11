"""The registries of tools, environments and tasks (instances of :class:`components.registry.Registry`).

``TOOLS``: tool classes by name (a task registers its tools on import, e.g. ``@register_tool("x")``;
its ``make_env`` looks them up with ``get_tool``). ``ENVS``: environment classes. ``TASKS``: one
:class:`~components.tasks.recipe.TaskRecipe` per task; a name not registered yet is imported from
``components.tasks.<name>`` on first lookup, so a built-in task is one folder; a task elsewhere (a
user's package, tests) registers itself when its module is imported (params ``plugins``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from components.registry import Registry, UnknownNameError

__all__ = [
    "ENVS",
    "TASKS",
    "TOOLS",
    "Registry",
    "UnknownNameError",
    "get_env",
    "get_task",
    "get_tool",
    "register_env",
    "register_task",
    "register_tool",
]

TOOLS: Registry[Callable[..., Any]] = Registry("tool")
ENVS: Registry[Callable[..., Any]] = Registry("env")
TASKS: Registry[Any] = Registry("task", autoload_package="components.tasks")

register_tool = TOOLS.register
register_env = ENVS.register
register_task = TASKS.register
get_tool = TOOLS.get
get_env = ENVS.get
get_task = TASKS.get
