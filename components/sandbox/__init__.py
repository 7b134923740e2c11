"""A sandbox for model-written Python: a warm server forks one confined child per call (docs/sandbox.md).

``Sandbox(SandboxLimits(...)).run(code) -> SandboxResult``; the server is ``server.py``.
"""

from components.sandbox.client import Sandbox, SandboxResult, SandboxUnavailable, shared_sandbox
from components.sandbox.limits import PROTECTIONS, SandboxLimits

__all__ = ["PROTECTIONS", "Sandbox", "SandboxLimits", "SandboxResult", "SandboxUnavailable", "shared_sandbox"]
