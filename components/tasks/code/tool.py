"""The ``python`` tool: model-written code run in the sandbox (components/sandbox), never in this process.

What comes back is what ToRL returns: the program's stdout, cut to the sandbox's output limit, and on
an error the last line of the traceback (``ZeroDivisionError: division by zero``); a limit that stops
the program is named with its value. The tool holds a started :class:`~components.sandbox.Sandbox`
(shared by every environment of the process, :func:`~components.sandbox.shared_sandbox`).
"""

from __future__ import annotations

from typing import Any

from components.envs.base import BaseTool, ToolResult
from components.envs.registry import register_tool
from components.sandbox import Sandbox, SandboxResult

__all__ = ["PythonTool", "format_result"]

MAX_CODE_CHARS = 8192


def format_result(result: SandboxResult, sandbox: Sandbox) -> ToolResult:
    """The tool's text for one sandboxed call (an error result unless the program exited 0)."""
    lim = sandbox.limits
    out = result.stdout.rstrip("\n")
    stopped = {
        "wall_time": f"error: the program ran longer than {lim.wall_s:g} s (wall-time limit) and was stopped",
        "cpu_time": f"error: the program used more than {lim.cpu_s} s of CPU time (CPU limit) and was stopped",
        "output": f"[output cut at {lim.output_bytes} bytes: the program printed more and was stopped]",
        "killed": f"error: the program was killed by {result.signal}",
        "setup": f"error: the sandbox could not start the program: {result.last_error_line}",
        "sandbox": f"error: the sandbox failed: {result.stderr}",
    }
    if result.status == "ok":
        return ToolResult(out if out else "(no output: print the values you need)")
    if result.status == "error":
        last = result.last_error_line or f"the program exited with status {result.exit_code}"
        if last.startswith("MemoryError"):
            last = f"MemoryError: out of memory (memory limit {lim.memory_mb} MB)"
        elif "[Errno 27]" in last:  # EFBIG
            last = f"{last} (file size limit {lim.file_mb} MB)"
        elif "[Errno 28]" in last:  # ENOSPC: the scratch directory is full
            last = f"{last} (disk limit {lim.disk_mb} MB for all files)"
        return ToolResult(f"{out}\n{last}" if out else last, is_error=True)
    message = stopped.get(result.status, f"error: {result.status}")
    return ToolResult(f"{out}\n{message}" if out else message, is_error=True)


@register_tool("python")
class PythonTool(BaseTool):
    name = "python"
    description = (
        "Run a Python 3 program (standard library only, no files or network) and return what it printed."
    )
    parameters = {
        "type": "object",
        "properties": {
            "code": {
                "type": "string",
                "description": "a whole program; print() the values you need",
                "maxLength": MAX_CODE_CHARS,
            }
        },
        "required": ["code"],
        "additionalProperties": False,
    }

    def __init__(self, sandbox: Sandbox) -> None:
        self.sandbox = sandbox

    def execute(self, args: dict[str, Any]) -> ToolResult:
        return format_result(self.sandbox.run(args["code"]), self.sandbox)
