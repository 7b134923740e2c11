"""Load an installed verifiers (0.4, ``verifiers.v1``) environment and refuse what steprl cannot train.

An environment is a module or package exporting a ``vf.Taskset`` subclass (the tasks) and, for a
game or any multi-turn exchange, a ``vf.Env`` subclass (how a task becomes an episode) through its
``__all__``, as ``vf-eval`` finds them; without an ``Env`` it is a plain taskset, played by
``SingleAgentEnv``. :func:`load` resolves it with verifiers' own loaders and checks, before any work:

- the module is installed (else the error names it and the install command);
- ``args`` validate against the taskset's config class (the error names the key);
- the ``Env`` declares exactly one agent seat (multi-agent envs: judge, best-of-n, user simulators
  are refused), does not override ``finalize`` (cross-agent judgement), and its tasks need no
  container, no model judge and no runtime box to score;
- every tool server is a ``vf.Toolset`` without shared state, whose ``@vf.tool`` methods steprl
  calls in this process (schemas from their type hints).

Optional hook of the environment module: ``expert_policy(task) -> policy``, ``policy(messages) ->
reply text``: the demonstrations SFT imitates (played through the environment at prepare time).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from pydantic import ValidationError, create_model

__all__ = ["SUPPORTED", "Loaded", "LocalTool", "load"]

SUPPORTED = (
    "SingleAgentEnv (a plain Taskset: one reply, or tool calls then a reply), and an Env subclass with "
    "exactly one AgentConfig seat whose run() plays it through agents.<seat>.interaction(task) / "
    ".turn() or agents.<seat>.run(task) (e.g. verifiers' TextArenaEnv)"
)


@dataclass(frozen=True)
class LocalTool:
    """A toolset's ``@vf.tool`` method, called in this process."""

    name: str
    fn: Callable[..., Any]
    args_model: Any  # a pydantic model of the arguments

    def schema(self) -> dict[str, Any]:
        params = self.args_model.model_json_schema()
        params.pop("title", None)
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": (self.fn.__doc__ or "").strip() or self.name,
                "parameters": params,
            },
        }


@dataclass(frozen=True)
class Loaded:
    """One loaded environment: the verifiers objects and what steprl derived from them."""

    env_id: str
    module: ModuleType
    env: Any  # vf.Env
    taskset: Any  # vf.Taskset
    task_cls: type
    seat: str
    tools: tuple[LocalTool, ...]
    expert_policy: Callable[[Any], Callable[[list[dict[str, Any]]], str]] | None
    single_agent: bool

    def tool_schemas(self) -> list[dict[str, Any]]:
        return [t.schema() for t in self.tools]

    def task(self, data: Mapping[str, Any]) -> Any:
        """The ``vf.Task`` of a row's ``task`` column (its TaskData as JSON)."""
        return self.task_cls(self.task_cls.data_type().model_validate(dict(data)), self.taskset.config.task)


def _module_name(env_id: str) -> str:
    """The module verifiers imports for ``env_id`` (hub ids ``owner/name@version`` -> ``name``)."""
    name = env_id.rsplit("/", 1)[-1].split("@", 1)[0]
    return name if "." in name else name.replace("-", "_").lower()


def _not_installed(env_id: str, module: str) -> ValueError:
    dist = env_id.rsplit("/", 1)[-1].split("@", 1)[0]
    return ValueError(
        f"tasks.verifiers.env: the verifiers environment {env_id!r} is not installed (no module "
        f"{module!r}); install it with `uv pip install {dist}` (an Environments Hub id: "
        f"`prime env install {env_id}`), or name a module on the path"
    )


def _import(env_id: str) -> tuple[str, ModuleType]:
    """(the id verifiers' loaders resolve, the module). verifiers imports top-level names only
    (``verifiers.v1.tasksets.<name>`` or ``<name>``): a dotted module (one in this repo) is imported
    here and registered in ``sys.modules`` under its dots replaced by underscores, that id."""
    module = _module_name(env_id)
    if "." in module:
        try:
            found = importlib.util.find_spec(module)
        except ModuleNotFoundError:  # a parent package is missing
            found = None
        if found is None:
            raise _not_installed(env_id, module)
        alias = module.replace(".", "_").lower()
        sys.modules[alias] = importlib.import_module(module)
        return alias, sys.modules[alias]
    namespaced = f"verifiers.v1.tasksets.{module}"
    target = namespaced if importlib.util.find_spec(namespaced) else module
    if importlib.util.find_spec(target) is None:
        raise _not_installed(env_id, module)
    return env_id, importlib.import_module(target)


def _tool_model(name: str, fn: Callable[..., Any]) -> Any:
    fields = {}
    for pname, p in inspect.signature(fn).parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise ValueError(f"tool {name!r} takes *{pname}: steprl needs named, typed arguments")
        ann = Any if p.annotation is p.empty else p.annotation
        fields[pname] = (ann, ... if p.default is p.empty else p.default)
    return create_model(f"{name}_args", **fields)


def _local_tools(toolsets: list[Any]) -> tuple[LocalTool, ...]:
    import verifiers.v1 as vf
    from verifiers.v1.state import state_cls
    from verifiers.v1.utils.decorators import discover_decorated

    tools: list[LocalTool] = []
    for ts in toolsets:
        if not isinstance(ts, vf.Toolset):
            raise ValueError(
                f"tasks.verifiers.env: tool server {type(ts).__name__} is not a vf.Toolset (an MCP "
                "server launched as a program): steprl calls @vf.tool methods in process only"
            )
        if state_cls(type(ts)) is not vf.State:
            raise ValueError(
                f"tasks.verifiers.env: toolset {type(ts).__name__} keeps shared state "
                f"({state_cls(type(ts)).__name__}), which verifiers syncs over its MCP server; not supported"
            )
        for fn in discover_decorated(ts, "tool"):
            name = getattr(fn, "tool_name", None) or fn.__name__
            tools.append(LocalTool(name, fn, _tool_model(name, fn)))
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise ValueError(f"tasks.verifiers.env: tool names must be unique, got {names}")
    return tuple(tools)


def _check_scoring(task_cls: type, config: Any, env_id: str) -> None:
    if getattr(task_cls, "NEEDS_CONTAINER", False):
        raise ValueError(
            f"tasks.verifiers.env: {env_id}'s tasks ({task_cls.__name__}) need a container "
            "(NEEDS_CONTAINER); steprl runs no container runtime. Supported: " + SUPPORTED
        )
    if getattr(config, "judges", None):
        raise ValueError(
            f"tasks.verifiers.env: {env_id}'s tasks plug model judges ({len(config.judges)}); a judge calls "
            "a model client that steprl does not provide"
        )
    for attr in ("reward", "metric"):
        for fn in _hooks_of(task_cls, attr):
            param = inspect.signature(fn).parameters.get("runtime")
            if param is not None and param.default is inspect.Parameter.empty:
                raise ValueError(
                    f"tasks.verifiers.env: @vf.{attr} {fn.__name__} of {task_cls.__name__} needs a runtime "
                    "box (parameter 'runtime'); steprl scores without one"
                )


def _hooks_of(task_cls: type, attr: str) -> list[Callable[..., Any]]:
    return [
        fn for klass in task_cls.__mro__ for fn in vars(klass).values() if callable(fn) and hasattr(fn, attr)
    ]


@functools.lru_cache(maxsize=8)
def _load(env_id: str, args_json: str) -> Loaded:
    vf_id, module = _import(env_id)
    import verifiers.v1 as vf
    from verifiers.v1.configs.agent import agent_config_fields
    from verifiers.v1.utils.loaders import taskset_class

    args = json.loads(args_json)
    try:
        ts_cls = taskset_class(vf_id)
    except (TypeError, AttributeError, ValueError) as err:
        raise ValueError(f"tasks.verifiers.env: {env_id!r} is not a verifiers environment: {err}") from None
    if "id" in args:
        raise ValueError("tasks.verifiers.args: 'id' is tasks.verifiers.env, not an argument")
    cfg_cls = vf.env_config_type(vf_id)
    try:
        cfg = cfg_cls.model_validate({"taskset": {**args, "id": vf_id}})
    except ValidationError as err:
        raise ValueError(f"tasks.verifiers.args: {err}") from None
    env_cls = vf.environment_class(vf_id)
    seats = list(agent_config_fields(cfg))
    if len(seats) != 1:
        raise ValueError(
            f"tasks.verifiers.env: {env_cls.__name__} declares {len(seats)} agent seats {seats}; "
            f"steprl trains one policy on one seat. Supported: {SUPPORTED}"
        )
    if env_cls.finalize is not vf.Env.finalize:
        raise ValueError(
            f"tasks.verifiers.env: {env_cls.__name__} overrides finalize() (cross-agent judgement over an "
            f"episode); not supported. Supported: {SUPPORTED}"
        )
    env = env_cls(cfg)
    task_cls = ts_cls.task_type()
    _check_scoring(task_cls, env.taskset.config.task, env_id)
    toolsets = list(ts_cls.toolsets(env.taskset.config)) + list(task_cls.toolsets(env.taskset.config.task))
    policy = getattr(module, "expert_policy", None)
    return Loaded(
        env_id=env_id,
        module=module,
        env=env,
        taskset=env.taskset,
        task_cls=task_cls,
        seat=seats[0],
        tools=_local_tools(toolsets),
        expert_policy=policy if callable(policy) else None,
        single_agent=isinstance(env, vf.SingleAgentEnv),
    )


def load(env_id: str, args: Mapping[str, Any] | None = None) -> Loaded:
    """The environment ``env_id`` with taskset arguments ``args`` (cached per pair); a ValueError
    naming ``tasks.verifiers.env`` or ``tasks.verifiers.args`` for anything refused (module docstring)."""
    return _load(env_id, json.dumps(dict(args or {}), sort_keys=True))
