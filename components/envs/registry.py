"""Name registries for tools, environments and tasks.

``register_tool("calculator")(CalculatorTool)`` (or as a decorator) adds an entry; ``get_tool(name)``
returns it, and an unknown name raises :class:`UnknownNameError` listing the valid names. A task named
``x`` that is not registered yet is imported from ``components.tasks.x`` on first lookup (importing a
task's package registers it), so adding a task is one folder and nothing else.

It does not construct anything: entries are classes, factories or recipe objects, used by the caller.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Callable
from typing import Any, Generic, TypeVar

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

T = TypeVar("T")
_MODULE_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")


class UnknownNameError(KeyError):
    """A registry lookup of a name that is not registered; the message lists the valid names."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class Registry(Generic[T]):
    def __init__(self, kind: str, autoload_package: str | None = None) -> None:
        self.kind = kind
        self.autoload_package = autoload_package
        self._entries: dict[str, T] = {}

    def register(self, name: str, obj: T | None = None, *, replace: bool = False) -> Any:
        """Register ``obj`` under ``name``; without ``obj``, return a decorator that does."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")

        def add(value: T) -> T:
            if name in self._entries and not replace and self._entries[name] is not value:
                raise ValueError(f"{self.kind} {name!r} is already registered ({self._entries[name]!r})")
            self._entries[name] = value
            return value

        return add if obj is None else add(obj)

    def _autoload(self, name: str) -> None:
        if self.autoload_package is None or not _MODULE_NAME.match(name):
            return
        module = f"{self.autoload_package}.{name}"
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as err:
            if err.name != module:  # the task exists but one of its own imports is missing
                raise

    def _discoverable(self) -> list[str]:
        if self.autoload_package is None:
            return []
        package = importlib.import_module(self.autoload_package)
        return [m.name for m in pkgutil.iter_modules(getattr(package, "__path__", [])) if m.ispkg]

    def names(self) -> list[str]:
        """Every valid name: the registered ones and, for autoloading registries, the importable ones."""
        return sorted(set(self._entries) | set(self._discoverable()))

    def get(self, name: str) -> T:
        if name not in self._entries:
            self._autoload(name)
        if name not in self._entries:
            raise UnknownNameError(f"unknown {self.kind} {name!r}; valid: {self.names()}")
        return self._entries[name]

    def __contains__(self, name: object) -> bool:
        return name in self._entries


TOOLS: Registry[Callable[..., Any]] = Registry("tool")
ENVS: Registry[Callable[..., Any]] = Registry("env")
TASKS: Registry[Any] = Registry("task", autoload_package="components.tasks")

register_tool = TOOLS.register
register_env = ENVS.register
register_task = TASKS.register
get_tool = TOOLS.get
get_env = ENVS.get
get_task = TASKS.get
