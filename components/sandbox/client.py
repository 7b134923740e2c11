"""The trainer's side of the sandbox: :class:`Sandbox` starts the warm server once and runs calls on it.

``Sandbox(limits).run(code)`` sends the code to the server (``server.py``, a ``python -I -S`` child of
this process) and blocks until the server answers with a :class:`SandboxResult`; ``run`` is
thread-safe, so a thread pool runs calls concurrently (the server forks one child per call, at most
``workers`` at a time). Nothing of the model's code runs in this process. At start the server's probe
of the machine's protections is logged; a missing protection raises :class:`SandboxUnavailable`
naming it, unless ``allow_weaker``. A server that dies (nothing a call does should make it) fails
the calls in flight with a ``sandbox`` status at once, before anything else; then its processes left
(its zygote, any process of its uid range) are killed and its scratch removed, and the next call
starts a new server. A call that was in flight when its server died is not sent again.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import logging
import os
import struct
import subprocess
import sys
import threading
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from pathlib import Path

import pyseccomp

from components.sandbox.confine import processes_of
from components.sandbox.limits import PROTECTIONS, SandboxLimits
from components.sandbox.scratch import remove_tree

__all__ = ["Sandbox", "SandboxResult", "SandboxUnavailable", "shared_sandbox"]

log = logging.getLogger(__name__)
_SERVER = Path(__file__).with_name("server.py")
_REPO = Path(__file__).resolve().parents[2]
_HEADER = struct.Struct(">I")
# Sandbox uids start here (a range no account on a usual machine uses): each sandbox instance holds a
# range of 1024 of its own (components.sandbox.confine.claim_uid_range), slot i its base + i.
UID_FLOOR = 1_900_000_000
MAX_CODE_BYTES = 1 << 20  # the largest program a call takes (UTF-8 bytes)
_NOT_SENT = "the sandbox server is gone"  # a call that never reached a server: sent again
# Standard-library modules the server imports before serving: a child finds them loaded (no file
# read, no import time).
_PRELOAD = (
    "math", "cmath", "fractions", "decimal", "itertools", "functools", "collections", "re", "string",
    "statistics", "random", "json", "heapq", "bisect", "datetime", "operator", "traceback", "textwrap",
    "encodings.idna",
)  # fmt: skip


class SandboxUnavailable(RuntimeError):
    """The machine lacks a protection the sandbox needs (and weaker sandboxes are not accepted)."""


@dataclass(frozen=True)
class SandboxResult:
    """What one call did. ``status``: ok | error (an exception or a non-zero exit) | wall_time |
    cpu_time | output (stdout or stderr over ``output_bytes``) | killed (by a signal: ``signal`` names
    it, e.g. ``SIGSEGV`` or ``SIGRTMIN+6``) | setup (the sandbox failed before the program ran) |
    sandbox (the server failed)."""

    status: str
    stdout: str
    stderr: str
    exit_code: int | None
    signal: str | None
    output_bytes: int
    wall_s: float
    cpu_s: float = 0.0

    @classmethod
    def failed(cls, why: str) -> SandboxResult:
        return cls("sandbox", "", why, None, None, 0, 0.0)

    @classmethod
    def from_reply(cls, reply: dict) -> SandboxResult:
        """The server's reply as a result (a malformed one raises ValueError)."""
        try:
            return cls(
                status=str(reply["status"]),
                stdout=str(reply["stdout"]),
                stderr=str(reply["stderr"]),
                exit_code=None if reply["exit_code"] is None else int(reply["exit_code"]),
                signal=None if reply["signal"] is None else str(reply["signal"]),
                output_bytes=int(reply["output_bytes"]),
                wall_s=float(reply["wall_s"]),
                cpu_s=float(reply.get("cpu_s", 0.0)),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"malformed sandbox reply: {err}") from err

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
        self.zygote_pid: int | None = None  # the server's child that forks every call's child
        self.uids: range = range(0)  # the uids of this sandbox's calls (one range per server)
        self.landlock_abi = 0
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
                "uid_floor": UID_FLOOR,
                "lib_paths": [str(_REPO), str(Path(pyseccomp.__file__).parent)],
                "stdlib_path": _stdlib_path(),
                "system_paths": _system_paths(),
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
            self.zygote_pid, self.landlock_abi = hello["zygote_pid"], hello["landlock_abi"]
            self.uids = range(hello["uid_base"], hello["uid_base"] + self.workers)
            server = (proc, self.zygote_pid, self.uids, self.scratch_root)
            threading.Thread(target=self._reader, args=server, name="sandbox-reader", daemon=True).start()
            return self.probe

    def _reader(self, proc: subprocess.Popen, zygote: int | None, uids: range, scratch_root: str) -> None:
        """Hand each reply to its call; when the server is gone (or says something malformed), fail
        every call still pending first, then clean up after it."""
        why = "the sandbox server exited"
        try:
            while True:
                reply = _read_frame(proc.stdout)
                if reply is None:
                    break
                result = SandboxResult.from_reply(reply)
                with self._lock:
                    future = self._pending.pop(reply.get("id"), None)
                    self.calls += 1
                if future is not None:
                    future.set_result(result)
        except Exception as err:  # a malformed frame: this server cannot be trusted any more
            why = f"the sandbox server failed ({type(err).__name__}: {err})"
        finally:
            with self._lock:
                pending, self._pending = self._pending, {}
                if self._proc is proc:
                    self._proc = None
            for future in pending.values():
                future.set_result(SandboxResult.failed(why))
            self._clean_up(proc, zygote, uids, scratch_root)

    def _clean_up(self, proc: subprocess.Popen, zygote: int | None, uids: range, scratch_root: str) -> None:
        """Kill what a dead (or misbehaving) server left and remove its scratch; never raises."""
        with contextlib.suppress(Exception):
            proc.kill()
        with contextlib.suppress(Exception):
            proc.wait(timeout=10)
        if zygote is not None:  # it dies with the server (PR_SET_PDEATHSIG); in case it did not
            with contextlib.suppress(Exception):
                os.kill(zygote, 9)
        if self.probe.get("uid_switch") is None:
            for _ in range(3):
                left = processes_of(uids)
                for pid in left:
                    with contextlib.suppress(Exception):
                        os.kill(pid, 9)
                if not left:
                    break
        with contextlib.suppress(Exception):
            remove_tree(scratch_root)  # the server removes it, unless it was killed

    def submit(self, code: str) -> Future:
        """Send ``code`` to the server; the future's result is its SandboxResult."""
        if not isinstance(code, str):
            raise TypeError(f"code must be a string, got {type(code).__name__}")
        size = len(code.encode("utf-8", "replace"))
        if size > MAX_CODE_BYTES:
            raise ValueError(f"code is {size} bytes; the sandbox takes at most {MAX_CODE_BYTES}")
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
            future.set_result(SandboxResult.failed(_NOT_SENT))
        return future

    def run(self, code: str) -> SandboxResult:
        """Run ``code`` in a fresh confined child and wait for what it did. A call that could not be sent
        (the server was already gone) is sent once more to a new server; one that was running when its
        server died is not."""
        result = self.submit(code).result()
        if result.status == "sandbox" and result.stderr == _NOT_SENT:
            result = self.submit(code).result()
        return result

    def leftover_processes(self) -> list[int]:
        """The pids running as one of this sandbox's uids (none between calls: every call's process is
        gone by the time its result is)."""
        return processes_of(self.uids)

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


def _system_paths() -> list[str]:
    """The system library directories (and the loader's cache) that the extension modules of the
    standard library load shared libraries from; their Python directories are left out
    (components.sandbox.confine.read_rules)."""
    system = ["/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib", "/etc/ld.so.cache"]
    return sorted({os.path.realpath(p) for p in system if os.path.exists(p)})
