"""The zygote: the process every call's child is forked from, forked by the server before any call.

It holds the configuration, the preloaded standard-library modules, the compiled seccomp filter and
one Landlock ruleset per slot; never a call's code, output or result, nor the server's queue (the
privilege separation of Chromium's zygote: a child that walks its frames or reads its memory with
``ctypes`` finds nothing of another call). The server asks it over a unix socket:

- ``{"op": "spawn", "slot": i}`` with four fds (the child's code pipe, stdout, stderr and a ready
  pipe): fork the call's child (``{"op": "failed", "slot", "error"}`` when it cannot);
- ``{"op": "kill", "slot": i}``: kill that child's process group;

and tells the server ``{"op": "exited", "slot", "status", "cpu_s", "clean"}`` when a child is reaped
(its orphans too, when seccomp is off and it could fork: every process of the slot's uid is killed
first; ``clean`` false when some could not be, and the server then retires the slot).
The child reads its code from the pipe *after* its confinement, writes one byte on the ready pipe
(so that a setup failure is never confused with the program's own exit status), and runs the code.
The zygote's loop survives anything a child does; it exits when the server's socket closes, killing
the children left, and dies with the server (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import json
import logging
import os
import selectors
import signal
import socket
import sys
import time
import traceback

from components.sandbox import confine

log = logging.getLogger("components.sandbox.zygote")  # the server's handler, inherited
_READY = b"R"
_KILL_UID_S = 5.0  # seconds to kill what a call without seccomp left, then its slot is retired


class Zygote:
    def __init__(self, cfg: dict, sock: socket.socket, rulesets: dict[int, int], seccomp: bytes | None):
        self.cfg, self.sock, self.rulesets, self.seccomp = cfg, sock, rulesets, seccomp
        self.children: dict[int, int] = {}  # slot -> pid of its running child
        self.exited: dict[int, tuple[int, float]] = {}  # slot -> (wait status, CPU seconds), not yet told
        self.uids = range(cfg["uid_base"], cfg["uid_base"] + cfg["workers"])

    def send(self, obj: dict) -> None:
        self.sock.send(json.dumps(obj).encode())

    def spawn(self, slot: int, fds: list[int]) -> None:
        if len(fds) != 4 or slot in self.children or not 0 <= slot < self.cfg["workers"]:
            self.send({"op": "failed", "slot": slot, "error": f"bad spawn request ({len(fds)} fds)"})
            return
        try:
            pid = os.fork()
        except OSError as err:
            self.send({"op": "failed", "slot": slot, "error": f"fork failed: {err}"})
            return
        if pid == 0:
            _child(self.cfg, slot, fds, self.rulesets.get(slot), self.seccomp)
        self.children[slot] = pid

    def kill(self, slot: int) -> None:
        pid = self.children.get(slot)
        if pid is not None:  # not reaped yet: the pid (and its group) is still this child's
            for kill in (os.killpg, os.kill):
                with contextlib.suppress(OSError):
                    kill(pid, signal.SIGKILL)

    def collect(self) -> None:
        """Wait for every exited child: a call's child is kept in ``exited`` for :meth:`reap`, an
        orphan of a call (this process is the subreaper) is just waited for."""
        slots = {pid: slot for slot, pid in self.children.items()}
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in slots:
                self.exited[slots[pid]] = (status, usage.ru_utime + usage.ru_stime)

    def reap(self) -> None:
        """Tell the server of every call's child that exited (after killing what it left)."""
        self.collect()
        for slot in list(self.exited):
            status, cpu = self.exited.pop(slot)
            clean = True
            if self.cfg["uid_switch"] and not self.cfg["seccomp"]:
                clean = self.kill_uid(self.cfg["uid_base"] + slot)
            del self.children[slot]
            self.send({"op": "exited", "slot": slot, "status": status, "cpu_s": cpu, "clean": clean})

    def kill_uid(self, uid: int) -> bool:
        """Kill every process of ``uid`` (a forked killer running as that uid signals them all) until
        none is left, zombies included (a call without seccomp could fork), for at most
        ``_KILL_UID_S``; whether none is left."""
        deadline = time.monotonic() + _KILL_UID_S
        while confine.processes_of(range(uid, uid + 1)):
            if time.monotonic() > deadline:
                return False
            pid = os.fork()
            if pid == 0:
                try:
                    os.setresuid(uid, uid, uid)
                    os.kill(-1, signal.SIGKILL)
                finally:
                    os._exit(0)
            _wait_for(pid, 1.0)  # before the slot is used again: a late killer would kill its next call
            self.collect()
            time.sleep(0.001)
        return True

    def serve(self) -> None:
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        confine._LIBC.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans of a call come here
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        sel = selectors.DefaultSelector()
        sel.register(wake_r, selectors.EVENT_READ, "wake")
        sel.register(self.sock, selectors.EVENT_READ, "server")
        gc.freeze()  # what is loaded now stays out of the collector: children touch fewer shared pages
        while True:
            for key, _ in sel.select(1.0):
                try:
                    if key.data == "wake":
                        with contextlib.suppress(BlockingIOError):
                            os.read(wake_r, 4096)
                    elif not self.handle():
                        self.stop()
                        return
                except Exception:  # never down because of one child: say it and go on
                    log.exception("handling a message failed")
            try:
                self.reap()
            except Exception:
                log.exception("reaping failed")

    def handle(self) -> bool:
        """One message of the server; False when the server is gone."""
        try:
            data, fds, _, _ = socket.recv_fds(self.sock, 4096, 8)
        except (BlockingIOError, InterruptedError):
            return True
        if not data:
            return False
        try:
            msg = json.loads(data)
            if msg["op"] == "spawn":
                self.spawn(int(msg["slot"]), fds)
            elif msg["op"] == "kill":
                self.kill(int(msg["slot"]))
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
        return True

    def stop(self) -> None:
        for slot in list(self.children):
            self.kill(slot)
        deadline = time.monotonic() + 2.0
        while self.children and time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                self.collect()
                for slot in list(self.exited):
                    self.exited.pop(slot)
                    self.children.pop(slot, None)
            time.sleep(0.01)


def _wait_for(pid: int, timeout: float) -> None:
    """Wait for a child of this process, killing it when it takes longer than ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        except ChildProcessError:
            return
        if time.monotonic() > deadline:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 1.0
        time.sleep(0.0005)


def run(cfg: dict, sock: socket.socket, rulesets: dict[int, int], seccomp: bytes | None) -> None:
    """The zygote's body (in the process the server just forked); never returns."""
    try:
        null = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1):  # the server's protocol pipes: only the server may hold them
            os.dup2(null, fd)
        os.close(null)
        confine.die_with_parent(cfg["server_pid"])
        Zygote(cfg, sock, rulesets, seccomp).serve()
    except BaseException:
        log.exception("the zygote failed")
    os._exit(0)


# --- the child -------------------------------------------------------------------------------------


def _child(cfg: dict, slot: int, fds: list[int], ruleset: int | None, seccomp: bytes | None) -> None:
    """Set up the confinement, read the code, run it; never returns."""
    try:
        zygote = os.getppid()
        os.setsid()
        wanted = [*fds, ruleset] if ruleset is not None else fds
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 1024) for fd in wanted]  # out of the way of 0-4
        for target, fd in enumerate(high):  # code, stdout, stderr, ready (, ruleset)
            os.dup2(fd, target)
        os.closerange(len(high), 1 << 16)
        os.chdir(cfg["scratch"][slot])
        confine.set_rlimits(cfg["limits"], cfg["uid_switch"])
        if cfg["uid_switch"]:
            confine.switch_uid(cfg["uid_base"] + slot, keep_read=cfg["landlock"])
        confine.die_with_parent(zygote)
        confine.no_new_privs()
        if ruleset is not None:
            confine.landlock_enter(4)
            os.close(4)
        if seccomp is not None:
            confine.load_seccomp(seccomp)
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        chunks = []
        while chunk := os.read(0, 1 << 16):
            chunks.append(chunk)
        code = b"".join(chunks).decode("utf-8")
        sys.path[:] = cfg["stdlib_path"]
        sys.argv[:] = ["<code>"]
        for name in [n for n in sys.modules if n.split(".")[0] in ("components", "pyseccomp")]:
            del sys.modules[name]  # the model's code sees the standard library only
        sys.stdin = open(0, closefd=False)  # noqa: SIM115
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
        os.write(3, _READY)
        os.close(3)
    except BaseException as err:
        with contextlib.suppress(BaseException):
            os.write(2, f"sandbox setup failed: {type(err).__name__}: {err}\n".encode())
        os._exit(125)
    os._exit(_run_code(code, cfg["limits"]["output_bytes"]) & 0xFF)


def _run_code(code: str, budget: int) -> int:
    """Run ``code`` as ``__main__``; its exit status (an uncaught exception: 1, its traceback on
    stderr, cut to keep the last line within ``budget``)."""
    status = 0
    try:
        exec(compile(code, "<code>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit as err:
        if err.code is None:
            status = 0
        elif isinstance(err.code, int):
            status = err.code
        else:  # as the interpreter does: the message on stderr, status 1
            status = 1
            with contextlib.suppress(BaseException):
                sys.stderr.write(f"{err.code}\n")
    except BaseException:
        status = 1
        try:
            _print_traceback(budget)
        except BaseException:
            os.write(2, b"Error: the traceback could not be printed\n")
    with contextlib.suppress(BaseException):
        sys.stdout.flush()
    with contextlib.suppress(BaseException):
        sys.stderr.flush()
    return status


def _print_traceback(budget: int) -> None:
    """The traceback (its last 8 frames); when longer than half of ``budget``, its head and its last
    line (itself at most a quarter of it), so that the error's line always comes back."""
    kind, value, tb = sys.exc_info()
    if tb is not None and tb.tb_frame.f_code is _run_code.__code__:
        tb = tb.tb_next  # the program's frames only, as the interpreter shows them
    text = "".join(traceback.format_exception(kind, value, tb, limit=-8))
    half = max(budget // 2, 64)
    if len(text.encode()) > half:
        lines = text.rstrip("\n").split("\n")
        last = lines[-1][: max(budget // 4, 32)]
        head = text[: max(half - len(last) - 32, 0)]
        text = f"{head}\n[... traceback cut ...]\n{last}\n"
    sys.stderr.write(text)
