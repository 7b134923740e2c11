"""The sandbox's warm parent: a single-threaded server that forks one confined child per call.

Run as a script, ``python -I -S server.py CONFIG_JSON`` (isolated: no ``site``, no user paths, no
environment variables read), by :class:`components.sandbox.client.Sandbox`; it imports only the
standard library, ``landlock`` and ``pyseccomp`` (both ctypes only, from the directories the config
names). It holds nothing but its config, so a child, which inherits its memory, inherits nothing
secret. At start it takes the protections it can (an empty network namespace for itself and so for
every child) and probes the others in throw-away children; it answers a first frame
``{"probe": {...}, "missing": [...], "error": str | None}`` and exits when a protection is missing and
``allow_weaker`` is false.

Protocol (stdin/stdout): frames of a 4-byte big-endian length and a JSON object. A request
``{"id": int, "code": str}``; a reply ``{"id", "status", "stdout", "stderr", "exit_code", "signal",
"output_bytes", "wall_s"}``. Requests are served concurrently, at most ``workers`` children at a
time (the rest queue), each in a scratch directory of its own, emptied after each call (and at start).

A child, between ``fork`` and the model's code: its own session and process group; pipes on fds 0-2
and every other fd closed (it cannot write the protocol); ``chdir`` to its scratch directory;
rlimits (address space, CPU seconds, file size, open files, processes, no core); when the server is
root, a uid/gid of its own with no supplementary groups (so ``RLIMIT_NPROC`` binds and it cannot
signal the server, the trainer or another child); Landlock: read and execute beneath the Python
standard library and the system library directories, everything beneath its scratch directory,
nothing else; seccomp: ``EPERM`` for sockets, fork (clone without ``CLONE_THREAD``), exec, signals
to other processes, ptrace, rlimit changes, namespaces, mounts and the like (threads stay allowed,
bounded by ``RLIMIT_NPROC`` and ``RLIMIT_CPU``). Then it runs the code as ``__main__`` and exits 0, or
prints the traceback to stderr and exits 1.

The server kills a child's whole process group at the wall-time limit and when its output passes
``output_bytes`` (the output is cut there). After each call, with uids switched, a reaper forked as
the call's uid kills every process left with that uid.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import gc
import json
import os
import resource
import selectors
import shutil
import signal
import struct
import sys
import tempfile
import time
import traceback

PROTECTIONS = ("network_namespace", "uid_switch", "landlock", "seccomp")
_CLONE_NEWNET = 0x40000000
_CLONE_NEWUSER = 0x10000000
_CLONE_THREAD = 0x00010000
_PR_SET_KEEPCAPS = 8
_CAP_VERSION_3 = 0x20080522
_CAP_DAC_READ_SEARCH = 2
_HEADER = struct.Struct(">I")
_READ = 65536
# Syscalls a child may not make (each fails with EPERM); clone without CLONE_THREAD (a new process)
# too, and clone3 fails with ENOSYS so that libc falls back to clone, whose flags seccomp can read.
_REFUSED = (
    "socket", "socketpair", "connect", "bind", "listen", "accept", "accept4",
    "fork", "vfork", "execve", "execveat",
    "kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo",
    "pidfd_open", "pidfd_send_signal", "pidfd_getfd", "process_vm_readv", "process_vm_writev",
    "ptrace", "kcmp", "prlimit64", "setrlimit", "setpriority",
    "setsid", "setpgid", "setuid", "setgid", "setreuid", "setregid", "setresuid", "setresgid", "setgroups",
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "mknod", "mknodat",
    "bpf", "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key", "personality",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "open_by_handle_at", "name_to_handle_at", "quotactl", "swapon", "swapoff", "reboot",
    "init_module", "finit_module", "delete_module", "kexec_load", "acct", "syslog",
)  # fmt: skip


_LIBC = ctypes.CDLL(None, use_errno=True)
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_PR_SET_CHILD_SUBREAPER = 36
_SECCOMP_MODE_FILTER = 2


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


# --- the protections, applied in the child -------------------------------------------------------


def _set_rlimits(cfg: dict) -> None:
    lim = cfg["limits"]
    mem = lim["memory_mb"] * 2**20
    cpu = lim["cpu_s"]
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU at cpu, SIGKILL a second later
    resource.setrlimit(resource.RLIMIT_FSIZE, (lim["file_mb"] * 2**20,) * 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (lim["open_files"],) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if cfg["uid_switch"]:  # RLIMIT_NPROC counts the processes (and threads) of the real uid
        resource.setrlimit(resource.RLIMIT_NPROC, (lim["threads"],) * 2)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _switch_uid(uid: int, keep_read: bool) -> None:
    """Become ``uid``/``uid`` with no groups; ``keep_read``: keep CAP_DAC_READ_SEARCH alone (and no
    other capability), so the Python beneath a root-only home stays readable (Landlock then bounds
    what may be read)."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    if keep_read and _LIBC.prctl(_PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_KEEPCAPS) failed")
    os.setresuid(uid, uid, uid)
    if keep_read:
        header = _CapHeader(_CAP_VERSION_3, 0)
        data = (_CapData * 2)(
            _CapData(1 << _CAP_DAC_READ_SEARCH, 1 << _CAP_DAC_READ_SEARCH, 0), _CapData(0, 0, 0)
        )
        if _LIBC.capset(ctypes.byref(header), data) != 0:
            raise OSError(ctypes.get_errno(), "capset(CAP_DAC_READ_SEARCH) failed")


def _landlock(read_paths: list[str], scratch: str) -> None:
    from landlock import FSAccess, Ruleset

    rules = Ruleset()
    read = FSAccess.READ_FILE | FSAccess.READ_DIR | FSAccess.EXECUTE
    for path in read_paths:
        rules.allow(path, rules=read if os.path.isdir(path) else read & FSAccess.all_file())
    rules.allow(scratch)
    rules.apply()


def _warm_landlock() -> None:
    """Resolve the landlock package's syscall wrappers once here, not in every child."""
    from landlock import FSAccess, plumbing

    FSAccess.all()
    for getter in (plumbing.get_create_ruleset, plumbing.get_add_rule, plumbing.get_restrict_self):
        getter()
    plumbing.get_prctl()


def _seccomp_program() -> bytes:
    """The filter as classic BPF (libseccomp compiles it once, in the server)."""
    import pyseccomp as sc

    f = sc.SyscallFilter(sc.ALLOW)
    for name in _REFUSED:
        f.add_rule(sc.ERRNO(errno.EPERM), name)
    f.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, _CLONE_THREAD, 0))
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    with tempfile.TemporaryFile() as file:
        f.export_bpf(file)
        file.seek(0)
        return file.read()


def _load_seccomp(program: bytes) -> None:
    """Install ``program`` on this process (after no_new_privs, as an unprivileged process must)."""
    buf = ctypes.create_string_buffer(program, len(program))
    prog = _SockFprog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p))
    if _LIBC.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if _LIBC.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")


# --- probe ---------------------------------------------------------------------------------------


def _unshare_network() -> str | None:
    """Move this process into a new, empty network namespace; None on success, else why not."""
    flags = [_CLONE_NEWNET] if os.geteuid() == 0 else [_CLONE_NEWUSER | _CLONE_NEWNET]
    for flag in flags:
        if _LIBC.unshare(flag) == 0:
            return None
    return f"unshare(CLONE_NEWNET) refused: {os.strerror(ctypes.get_errno())}"


def _in_child(fn) -> str | None:
    """Run ``fn`` in a forked child; None when it returned, else the error it raised (or its status)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            fn()
            os._exit(0)
        except BaseException as err:
            os.write(w, f"{type(err).__name__}: {err}".encode()[:500])
            os._exit(1)
    os.close(w)
    message = os.read(r, 1000).decode(errors="replace")
    os.close(r)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) == 0:
        return None
    return message or f"probe exited with status {os.waitstatus_to_exitcode(status)}"


def _probe_seccomp() -> None:
    _load_seccomp(_seccomp_program())
    try:
        os.fork()
    except PermissionError:
        return
    raise RuntimeError("a seccomp filter loaded but fork was still allowed")


def _probe_landlock(cfg: dict) -> None:
    _landlock(cfg["read_paths"], cfg["scratch_root"])
    try:
        with open(cfg["probe_file"]):
            pass
    except PermissionError:
        return
    raise RuntimeError(f"Landlock applied but {cfg['probe_file']} could still be read")


def _probe_uid() -> None:
    if os.geteuid() != 0:
        raise RuntimeError(f"the server runs as uid {os.geteuid()}, not root: it cannot switch uids")
    _switch_uid(_SLOT_UID_PROBE, keep_read=True)
    try:
        os.kill(1, 0)
    except PermissionError:
        return
    raise RuntimeError("switched uid but could still signal pid 1")


_SLOT_UID_PROBE = 2**31 - 2


def probe(cfg: dict) -> dict[str, str | None]:
    """Each protection -> None when granted, else why not (network: applied to this process)."""
    found: dict[str, str | None] = {}
    found["network_namespace"] = None if "network_namespace" in cfg["disable"] else _unshare_network()
    found["uid_switch"] = _in_child(_probe_uid)
    found["landlock"] = _in_child(lambda: _probe_landlock(cfg))
    found["seccomp"] = _in_child(_probe_seccomp)
    for name in cfg["disable"]:
        found[name] = found[name] or "disabled by the sandbox's settings"
    return found


# --- the child -----------------------------------------------------------------------------------


def _child(cfg: dict, code: str, scratch: str, uid: int, fds: tuple[int, int, int]) -> None:
    """Set up the confinement and run ``code``; never returns."""
    try:
        os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        os.closerange(3, 1 << 16)
        os.chdir(scratch)
        _set_rlimits(cfg)
        if cfg["uid_switch"]:
            _switch_uid(uid, keep_read=cfg["landlock"])
        if cfg["landlock"]:
            _landlock(cfg["read_paths"], scratch)
        if cfg["seccomp"]:
            _load_seccomp(_SECCOMP)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        sys.path[:] = cfg["stdlib_path"]
        sys.argv[:] = ["<code>"]
        for name in ("landlock", "pyseccomp"):  # the model's code sees the standard library only
            sys.modules.pop(name, None)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
    except BaseException as err:
        os.write(2, f"sandbox setup failed: {type(err).__name__}: {err}\n".encode())
        os._exit(125)
    status = 0
    try:
        exec(compile(code, "<code>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    except SystemExit as err:
        status = err.code if isinstance(err.code, int) else (0 if err.code is None else 1)
    except BaseException:
        status = 1
        try:
            traceback.print_exc(limit=-8)
        except BaseException:
            os.write(2, b"Error: the traceback could not be printed\n")
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass
    os._exit(status & 0xFF)


# --- the server ----------------------------------------------------------------------------------


class _Call:
    def __init__(self, rid: int, slot: int, pid: int, pidfd: int, out: int, err: int, deadline: float):
        self.rid, self.slot, self.pid, self.pidfd = rid, slot, pid, pidfd
        self.pipes = {out: "stdout", err: "stderr"}
        self.data = {"stdout": bytearray(), "stderr": bytearray()}
        self.total = 0
        self.deadline = deadline
        self.start = time.monotonic()
        self.stopped: str | None = None  # why the server killed it


class Server:
    def __init__(self, cfg: dict):
        self.cfg = cfg
        lim = cfg["limits"]
        self.wall_s = lim["wall_s"]
        self.output_bytes = lim["output_bytes"]
        self.workers = cfg["workers"]
        self.sel = selectors.DefaultSelector()
        self.inbuf = bytearray()
        self.queue: list[dict] = []
        self.calls: dict[int, _Call] = {}  # by pidfd
        self.free_slots = list(range(self.workers))
        self.scratch = [os.path.join(cfg["scratch_root"], f"slot{i}") for i in range(self.workers)]
        self.exited: dict[int, int] = {}  # wait status of call children reaped with the orphans

    def reap_orphans(self) -> None:
        """Wait for every exited child (orphans of a call come here: the server is their subreaper);
        a call's own child is kept in ``exited`` for :meth:`finish`."""
        calls = {c.pid for c in self.calls.values()}
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in calls:
                self.exited[pid] = status

    def slot_uid(self, slot: int) -> int:
        return self.cfg["uid_base"] + slot

    def reset_scratch(self, slot: int) -> None:
        path = self.scratch[slot]
        shutil.rmtree(path, ignore_errors=True)
        os.mkdir(path, 0o700)
        if self.cfg["uid_switch"]:
            os.chown(path, self.slot_uid(slot), self.slot_uid(slot))

    def send(self, obj: dict) -> None:
        data = json.dumps(obj).encode()
        out = _HEADER.pack(len(data)) + data
        while out:
            n = os.write(1, out)
            out = out[n:]

    def start_call(self, req: dict) -> None:
        slot = self.free_slots.pop()  # its scratch directory was emptied when its last call ended
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        in_r, in_w = os.pipe()
        os.close(in_w)  # the child's stdin: at end of file at once
        pid = os.fork()
        if pid == 0:
            _child(self.cfg, req["code"], self.scratch[slot], self.slot_uid(slot), (in_r, out_w, err_w))
        for fd in (in_r, out_w, err_w):
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        call = _Call(req["id"], slot, pid, pidfd, out_r, err_r, time.monotonic() + self.wall_s)
        self.calls[pidfd] = call
        self.sel.register(pidfd, selectors.EVENT_READ, ("exit", call))
        for fd in call.pipes:
            os.set_blocking(fd, False)
            self.sel.register(fd, selectors.EVENT_READ, ("pipe", call))

    def kill(self, call: _Call, why: str) -> None:
        if call.stopped is None:
            call.stopped = why
        with contextlib.suppress(ProcessLookupError):
            os.killpg(call.pid, signal.SIGKILL)

    def read_pipe(self, fd: int, call: _Call) -> None:
        try:
            chunk = os.read(fd, _READ)
        except BlockingIOError:
            return
        if not chunk:
            self.sel.unregister(fd)
            os.close(fd)
            del call.pipes[fd]
            return
        call.total += len(chunk)
        buf = call.data[call.pipes[fd]]
        room = self.output_bytes - len(call.data["stdout"]) - len(call.data["stderr"])
        buf += chunk[: max(room, 0)]
        if call.total > self.output_bytes:
            self.kill(call, "output")

    def finish(self, call: _Call) -> None:
        status = self.exited.pop(call.pid) if call.pid in self.exited else os.waitpid(call.pid, 0)[1]
        self.sel.unregister(call.pidfd)
        os.close(call.pidfd)
        del self.calls[call.pidfd]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(call.pid, signal.SIGKILL)  # anything left in its group
        for fd in list(call.pipes):  # what is left in the pipes, without waiting on a writer
            while fd in call.pipes and call.stopped != "output" and _readable(fd):
                self.read_pipe(fd, call)
            if fd in call.pipes:
                self.sel.unregister(fd)
                os.close(fd)
                del call.pipes[fd]
        if self.cfg["uid_switch"] and not self.cfg["seccomp"]:  # (seccomp: it could not fork)
            self.reap(self.slot_uid(call.slot))
        self.reap_orphans()
        self.reset_scratch(call.slot)
        self.free_slots.append(call.slot)
        code = os.waitstatus_to_exitcode(status)
        self.send(
            {
                "id": call.rid,
                "status": _status(call.stopped, code),
                "stdout": call.data["stdout"].decode("utf-8", "replace"),
                "stderr": call.data["stderr"].decode("utf-8", "replace"),
                "exit_code": code if code >= 0 else None,
                "signal": signal.Signals(-code).name if code < 0 else None,
                "output_bytes": call.total,
                "wall_s": time.monotonic() - call.start,
            }
        )

    def reap(self, uid: int) -> None:
        """Kill every process of ``uid`` (a forked reaper running as that uid signals them all) and
        wait, at most a second, until none is left, zombies included."""
        deadline = time.monotonic() + 1.0
        while _processes_of(uid) and time.monotonic() < deadline:
            pid = os.fork()
            if pid == 0:
                try:
                    os.setresuid(uid, uid, uid)
                    os.kill(-1, signal.SIGKILL)
                except BaseException:
                    pass
                os._exit(0)
            os.waitpid(pid, 0)
            self.reap_orphans()
            time.sleep(0.001)

    def read_requests(self) -> bool:
        chunk = os.read(0, _READ)
        if not chunk:
            return False
        self.inbuf += chunk
        while len(self.inbuf) >= 4:
            (n,) = _HEADER.unpack_from(self.inbuf)
            if len(self.inbuf) < 4 + n:
                break
            self.queue.append(json.loads(bytes(self.inbuf[4 : 4 + n])))
            del self.inbuf[: 4 + n]
        return True

    def serve(self) -> None:
        for slot in range(self.workers):
            self.reset_scratch(slot)
        gc.freeze()  # what is loaded now stays out of the collector: children touch fewer shared pages
        _LIBC.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        wake_r, wake_w = os.pipe()  # SIGCHLD wakes the loop, which waits for orphans
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.sel.register(wake_r, selectors.EVENT_READ, ("wake", None))
        self.sel.register(0, selectors.EVENT_READ, ("requests", None))
        open_input = True
        while open_input or self.calls:
            while self.queue and self.free_slots:
                self.start_call(self.queue.pop(0))
            now = time.monotonic()
            for call in list(self.calls.values()):
                if call.deadline <= now:
                    self.kill(call, "wall")
            timeout = min((c.deadline for c in self.calls.values()), default=now + 60) - now
            for key, _ in self.sel.select(max(timeout, 0) + 0.001):
                kind, call = key.data
                if kind == "wake":
                    with contextlib.suppress(BlockingIOError):
                        os.read(key.fd, _READ)
                    self.reap_orphans()
                elif kind == "requests":
                    if not self.read_requests():
                        self.sel.unregister(0)
                        open_input = False
                        for c in list(self.calls.values()):
                            self.kill(c, "closed")
                elif kind == "pipe" and key.fd in call.pipes:
                    self.read_pipe(key.fd, call)
                elif kind == "exit" and call.pidfd in self.calls:
                    self.finish(call)


def _processes_of(uid: int) -> list[int]:
    """The pids whose real uid is ``uid`` (read from /proc)."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    out.append(int(name))
            except OSError:
                pass
    return out


def _readable(fd: int) -> bool:
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    try:
        return bool(sel.select(0))
    finally:
        sel.close()


def _status(stopped: str | None, code: int) -> str:
    """ok | error | wall_time | cpu_time | output | killed | setup (the sandbox failed)."""
    if stopped in ("wall", "output"):
        return {"wall": "wall_time", "output": "output"}[stopped]
    if code == 0:
        return "ok"
    if code == 125:
        return "setup"
    if code > 0:
        return "error"
    if -code in (signal.SIGXCPU, signal.SIGKILL) and stopped is None:
        return "cpu_time"
    return "killed"


_SECCOMP = None


def main() -> None:
    global _SECCOMP
    cfg = json.loads(sys.argv[1])
    sys.path[:0] = cfg["lib_paths"]
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    cfg["scratch_root"] = tempfile.mkdtemp(prefix="steprl-sandbox-")
    os.chmod(cfg["scratch_root"], 0o711)
    try:
        found = probe(cfg)
        missing = {k: v for k, v in found.items() if v is not None}
        for name in PROTECTIONS:
            cfg[name] = found[name] is None
        error = None
        if missing and not cfg["allow_weaker"]:
            error = "the sandbox lacks " + "; ".join(f"{k} ({v})" for k, v in missing.items())
        if not cfg["seccomp"] and not cfg["uid_switch"]:  # a floor that allow_weaker does not lower
            error = (
                "the sandbox has neither seccomp nor a uid switch, so model code could signal every "
                "process of this user (kill(-1)), the trainer's included; it refuses to start even with "
                "allow_weaker"
            )
        server = Server(cfg)
        if cfg["landlock"]:
            _warm_landlock()
        for name in cfg["preload"]:
            __import__(name)
        if cfg["seccomp"]:
            _SECCOMP = _seccomp_program()
        server.send(
            {
                "probe": found,
                "missing": sorted(missing),
                "error": error,
                "pid": os.getpid(),
                "scratch_root": cfg["scratch_root"],
            }
        )
        if error is None:
            server.serve()
    finally:
        shutil.rmtree(cfg["scratch_root"], ignore_errors=True)


if __name__ == "__main__":
    main()
