"""A sandbox for model-written Python: a warm server forks one confined child per call (docs/sandbox.md).

``Sandbox(SandboxLimits(...)).run(code) -> SandboxResult``; the server is ``server.py``. The names
below load on first use (PEP 562), so the server, which imports ``confine`` and ``scratch`` from this
package, loads none of the client.
"""

from __future__ import annotations

import importlib

__all__ = ["PROTECTIONS", "Sandbox", "SandboxLimits", "SandboxResult", "SandboxUnavailable", "shared_sandbox"]

_WHERE = {
    "Sandbox": "client",
    "SandboxResult": "client",
    "SandboxUnavailable": "client",
    "shared_sandbox": "client",
    "PROTECTIONS": "limits",
    "SandboxLimits": "limits",
}


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
