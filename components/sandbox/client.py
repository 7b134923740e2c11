"""The trainer's side of the sandbox: :class:`Sandbox` starts the warm server once and runs calls on it.

``Sandbox(limits).run(code)`` sends the code to the server (``server.py``, a ``python -I -S`` child of
this process) and blocks until the server answers with a :class:`SandboxResult`; ``run`` is
thread-safe, so a thread pool runs calls concurrently (the server forks one child per call, at most
``workers`` at a time). Nothing of the model's code runs in this process. At start the server's probe
of the machine's protections is logged; a missing protection raises :class:`SandboxUnavailable`
naming it, unless ``allow_weaker``. A server that dies (it should not) fails the calls in flight with
a ``sandbox`` status and is started again on the next call.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import logging
import os
import shutil
import struct
import subprocess
import sys
import threading
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from pathlib import Path

import landlock
import pyseccomp

from components.sandbox.limits import PROTECTIONS, SandboxLimits

__all__ = ["Sandbox", "SandboxResult", "SandboxUnavailable", "shared_sandbox"]

log = logging.getLogger(__name__)
_SERVER = Path(__file__).with_name("server.py")
_HEADER = struct.Struct(">I")
# The uid of slot i is _UID_BASE + i (a range no account on a usual machine uses).
_UID_BASE = 1_900_000_000
# Standard-library modules the server imports before serving: a child finds them loaded (no file
# read, no import time).
_PRELOAD = (
    "math", "cmath", "fractions", "decimal", "itertools", "functools", "collections", "re", "string",
    "statistics", "random", "json", "heapq", "bisect", "datetime", "operator", "traceback", "textwrap",
)  # fmt: skip


class SandboxUnavailable(RuntimeError):
    """The machine lacks a protection the sandbox needs (and weaker sandboxes are not accepted)."""


@dataclass(frozen=True)
class SandboxResult:
    """What one call did. ``status``: ok | error (an exception or a non-zero exit) | wall_time |
    cpu_time | output (more than ``output_bytes``) | killed (by a signal) | setup |
    sandbox (the server failed)."""

    status: str
    stdout: str
    stderr: str
    exit_code: int | None
    signal: str | None
    output_bytes: int
    wall_s: float

    @property
    def last_error_line(self) -> str:
        """The last non-empty line of stderr (a traceback's ``Error: message`` line), or ""."""
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        return lines[-1].strip() if lines else ""


class Sandbox:
    """A warm sandbox server and the calls sent to it; close it (or use ``with``) when done."""

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        workers: int = 4,
        allow_weaker: bool = False,
        disable: tuple[str, ...] = (),
    ) -> None:
        unknown = sorted(set(disable) - set(PROTECTIONS))
        if unknown:
            raise ValueError(f"disable: unknown protections {unknown}; known: {list(PROTECTIONS)}")
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.limits = limits or SandboxLimits()
        self.workers = workers
        self.allow_weaker = allow_weaker
        self.disable = tuple(disable)
        self.probe: dict[str, str | None] = {}
        self.server_pid: int | None = None
        self.scratch_root: str | None = None  # the server's scratch directories are beneath it
        self.calls = 0  # calls answered since start
        self._lock = threading.Lock()  # guards the process, the pending calls and the next id
        self._write = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._pending: dict[int, Future] = {}
        self._next_id = 0

    def _config(self) -> str:
        return json.dumps(
            {
                "limits": asdict(self.limits),
                "workers": self.workers,
                "allow_weaker": self.allow_weaker,
                "disable": list(self.disable),
                "uid_base": _UID_BASE,
                "lib_paths": sorted(
                    {str(Path(landlock.__file__).parents[1]), str(Path(pyseccomp.__file__).parent)}
                ),
                "stdlib_path": _stdlib_path(),
                "read_paths": _read_paths(),
                "probe_file": str(_SERVER),
                "preload": list(_PRELOAD),
            }
        )

    def start(self) -> dict[str, str | None]:
        """Start the server (if not running) and return its probe: protection -> None when granted,
        else why not. Raises SandboxUnavailable when one is missing and weaker is not accepted."""
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                return self.probe
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(_SERVER), self._config()],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=None,
                close_fds=True,
                env={},
            )
            hello = _read_frame(proc.stdout)
            if hello is None or set(hello.get("probe", {})) != set(PROTECTIONS):
                proc.kill()
                proc.wait()
                raise SandboxUnavailable(f"the sandbox server did not start (it said {hello!r})")
            self.probe = hello["probe"]
            granted = [k for k, v in self.probe.items() if v is None]
            log.info("sandbox protections granted: %s; missing: %s", granted, hello["missing"] or "none")
            if hello["error"] is not None:
                proc.wait()
                raise SandboxUnavailable(
                    f"{hello['error']}. Run where these are allowed, or accept a weaker sandbox "
                    "(allow_weaker)"
                )
            for name in hello["missing"]:
                log.warning("sandbox runs WITHOUT %s: %s", name, self.probe[name])
            self._proc, self.server_pid, self.scratch_root = proc, hello["pid"], hello["scratch_root"]
            threading.Thread(
                target=self._reader, args=(proc, self.scratch_root), name="sandbox-reader", daemon=True
            ).start()
            return self.probe

    def _reader(self, proc: subprocess.Popen, scratch_root: str) -> None:
        while True:
            try:
                reply = _read_frame(proc.stdout)
            except (OSError, ValueError):
                reply = None
            if reply is None:
                break
            with self._lock:
                future = self._pending.pop(reply.pop("id"), None)
                self.calls += 1
            if future is not None:
                future.set_result(SandboxResult(**reply))
        proc.wait()
        shutil.rmtree(scratch_root, ignore_errors=True)  # the server removes it, unless it was killed
        with self._lock:
            pending, self._pending = self._pending, {}
            if self._proc is proc:
                self._proc = None
        for future in pending.values():
            future.set_result(
                SandboxResult(
                    "sandbox", "", f"the sandbox server exited ({proc.returncode})", None, None, 0, 0.0
                )
            )

    def submit(self, code: str) -> Future:
        """Send ``code`` to the server; the future's result is its SandboxResult."""
        if not isinstance(code, str):
            raise TypeError(f"code must be a string, got {type(code).__name__}")
        self.start()
        future: Future = Future()
        with self._lock:
            proc = self._proc
            rid, self._next_id = self._next_id, self._next_id + 1
            self._pending[rid] = future
        data = json.dumps({"id": rid, "code": code}).encode()
        try:
            with self._write:
                proc.stdin.write(_HEADER.pack(len(data)) + data)
                proc.stdin.flush()
        except (OSError, AttributeError):
            with self._lock:
                self._pending.pop(rid, None)
            future.set_result(SandboxResult("sandbox", "", "the sandbox server is gone", None, None, 0, 0.0))
        return future

    def run(self, code: str) -> SandboxResult:
        """Run ``code`` in a fresh confined child and wait for what it did (sent once more to a
        restarted server when the server was gone)."""
        result = self.submit(code).result()
        if result.status == "sandbox":
            result = self.submit(code).result()
        return result

    def close(self) -> None:
        """Stop the server: it kills the calls still running and removes its scratch directories."""
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
            try:
                proc.wait(timeout=self.limits.wall_s + 5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def __enter__(self) -> Sandbox:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_SHARED: dict[tuple, Sandbox] = {}
_SHARED_LOCK = threading.Lock()


def shared_sandbox(limits: SandboxLimits, *, workers: int = 4, allow_weaker: bool = False) -> Sandbox:
    """The process's one started sandbox for these settings (started on first use, closed at exit):
    every environment of a stage sends its calls to the same warm server."""
    key = (limits, workers, allow_weaker)
    with _SHARED_LOCK:
        if key not in _SHARED:
            sandbox = Sandbox(limits, workers=workers, allow_weaker=allow_weaker)
            sandbox.start()
            _SHARED[key] = sandbox
            atexit.register(sandbox.close)
        return _SHARED[key]


def _read_frame(stream) -> dict | None:
    head = stream.read(4)
    if len(head) < 4:
        return None
    (n,) = _HEADER.unpack(head)
    body = stream.read(n)
    if len(body) < n:
        return None
    return json.loads(body)


@functools.cache
def _stdlib_path() -> list[str]:
    """The module path of ``python -I -S``: the standard library and its extension modules."""
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", "import sys, json; print(json.dumps(sys.path))"],
        capture_output=True,
        text=True,
        check=True,
        env={},
    )
    return [p for p in json.loads(out.stdout) if os.path.exists(p)]


def _read_paths() -> list[str]:
    """What a child may read: the standard library and the system library directories its extension
    modules load shared libraries from."""
    system = ["/lib", "/lib64", "/usr/lib", "/usr/lib64", "/etc/ld.so.cache"]
    return sorted({*_stdlib_path(), *(p for p in system if os.path.exists(p))})
