"""TCP ports on this machine's loopback interface, where steprl's servers listen (never beyond it).

:func:`port_free` says whether a port can be bound now; :func:`free_port` asks the OS for one. Both
are a moment's truth: another process may take the port before a server binds it.
"""

from __future__ import annotations

import socket

__all__ = ["HOST", "free_port", "port_free"]

HOST = "127.0.0.1"


def port_free(port: int, host: str = HOST) -> bool:
    """Nobody listens on ``port`` of ``host`` (SO_REUSEADDR, as the servers bind: TIME_WAIT leftovers
    do not count)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = HOST) -> int:
    """A port the OS says is free now on ``host``."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
