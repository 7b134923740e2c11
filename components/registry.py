"""One name registry type for every pluggable part: estimators, losses, aggregation modes, KL
estimators, presets, tasks, tools and environments.

``REG.register("name", obj)`` or ``@REG.register("name")`` adds an entry; ``REG.get(name)`` (or
``REG[name]``) returns it, and an unknown name raises :class:`UnknownNameError` (a ``KeyError``)
whose message lists the known names. ``REG.names()`` lists them, ``name in REG`` tests one.

A registry built with ``autoload_package="pkg"`` imports ``pkg.<name>`` on the first lookup of a name
it does not hold yet (importing that module registers it), and lists the sub-packages of ``pkg`` among
its names: adding a built-in task is one folder. Entries are stored as given; nothing is constructed.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

__all__ = ["Registry", "UnknownNameError"]

T = TypeVar("T")
_MODULE_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")


class UnknownNameError(KeyError):
    """A lookup of a name that is not registered; the message lists the known names."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class Registry(Generic[T]):
    """Names -> entries of one kind (``kind`` names it in errors, e.g. "advantage estimator")."""

    def __init__(self, kind: str, autoload_package: str | None = None) -> None:
        self.kind = kind
        self.autoload_package = autoload_package
        self._entries: dict[str, T] = {}

    def register(self, name: str, obj: T | None = None, *, replace: bool = False) -> Any:
        """Register ``obj`` under ``name`` and return it; without ``obj``, return a decorator that does.

        Registering another object under a taken name raises ValueError unless ``replace``."""
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
            if err.name != module:  # the module exists but one of its own imports is missing
                raise

    def _discoverable(self) -> list[str]:
        if self.autoload_package is None:
            return []
        package = importlib.import_module(self.autoload_package)
        return [m.name for m in pkgutil.iter_modules(getattr(package, "__path__", [])) if m.ispkg]

    def names(self) -> list[str]:
        """Every known name, sorted: the registered ones and, when autoloading, the importable ones."""
        return sorted(set(self._entries) | set(self._discoverable()))

    def get(self, name: str) -> T:
        """The entry registered as ``name``; an unknown name raises UnknownNameError listing the known ones."""
        if isinstance(name, str) and name not in self._entries:
            self._autoload(name)
        if not isinstance(name, str) or name not in self._entries:
            raise UnknownNameError(f"unknown {self.kind} {name!r}; valid: {self.names()}")
        return self._entries[name]

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def __contains__(self, name: object) -> bool:
        """Whether ``name`` is registered, or (autoloading registries) becomes registered on import."""
        if not isinstance(name, str):
            return False
        try:
            self.get(name)
        except UnknownNameError:
            return False
        return True

    def __iter__(self) -> Iterator[str]:
        """The registered names (not the not-yet-imported ones), sorted."""
        return iter(sorted(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def items(self) -> list[tuple[str, T]]:
        return [(k, self._entries[k]) for k in sorted(self._entries)]

    def values(self) -> list[T]:
        return [v for _, v in self.items()]

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {sorted(self._entries)})"
