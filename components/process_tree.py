"""A process's children that cannot outlive it: the parent-death signal, and stopping a process tree.

- :func:`die_with_parent`: the calling process gets ``SIGKILL`` when its parent dies (Linux
  ``prctl(PR_SET_PDEATHSIG)``, one ``ctypes`` call into libc), so a rank or an engine process that
  its parent left behind (the parent killed with ``SIGKILL``, out of memory) does not linger. The
  kernel sends it when the parent *thread* that started the child ends; the processes here are
  started by the thread that also waits for them. A parent that died before the call is caught by
  comparing ``os.getppid()`` with the parent's pid. Elsewhere than Linux it does nothing.
- :func:`stop_descendants`: ``SIGTERM`` to every descendant of a process (``psutil``), ``SIGKILL``
  to those still alive after a grace period; returns what was stopped.
- :func:`describe_exit`: "was killed by SIGKILL" / "exited with code 3" for an exit code as
  ``multiprocessing`` reports it (negative: the signal).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys

import psutil

__all__ = ["describe_exit", "die_with_parent", "stop_descendants"]

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent_pid: int, sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent dies; exit at once if the
    parent (``parent_pid``) is already gone. Returns whether the signal is armed (Linux only)."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(err)}")
    if os.getppid() != parent_pid:  # the parent died before the signal was armed
        os._exit(1)
    return True


def describe_exit(exitcode: int | None) -> str:
    """How a process ended, from its exit code (``multiprocessing``: ``-N`` is signal ``N``)."""
    if exitcode is None:
        return "is still running"
    if exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


def stop_descendants(pid: int | None = None, grace_s: float = 3.0) -> list[psutil.Process]:
    """SIGTERM every descendant of ``pid`` (default: this process), SIGKILL those alive after
    ``grace_s``; returns the processes that were found."""
    try:
        found = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    for proc in found:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.terminate()
    _, alive = psutil.wait_procs(found, timeout=grace_s)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(alive, timeout=grace_s)
    return found
