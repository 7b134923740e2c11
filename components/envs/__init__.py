"""Environments: the AgentEnv interface, ToolEnv, BaseTool, tool-call parsing and name registries."""

from components.envs.base import AgentEnv, BaseTool, StepOutcome, ToolEnv, ToolResult, run_tool
from components.envs.parsing import CallError, ParsedAction, ToolCall, format_tool_call, parse_tool_calls
from components.envs.registry import (
    ENVS,
    TASKS,
    TOOLS,
    UnknownNameError,
    get_env,
    get_task,
    get_tool,
    register_env,
    register_task,
    register_tool,
)

register_env("tool", ToolEnv)

__all__ = [
    "ENVS",
    "TASKS",
    "TOOLS",
    "AgentEnv",
    "BaseTool",
    "CallError",
    "ParsedAction",
    "StepOutcome",
    "ToolCall",
    "ToolEnv",
    "ToolResult",
    "UnknownNameError",
    "format_tool_call",
    "get_env",
    "get_task",
    "get_tool",
    "parse_tool_calls",
    "register_env",
    "register_task",
    "register_tool",
    "run_tool",
]
