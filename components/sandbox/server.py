"""The sandbox's server: holds the queue and the calls' output; never runs or forks a call itself.

Run as a script, ``python -I -S server.py CONFIG_JSON`` (isolated: no ``site``, no user paths, no
environment variables read), by :class:`components.sandbox.client.Sandbox`; it imports the standard
library, ``pyseccomp`` and this package's ``confine``, ``scratch`` and ``zygote`` modules. At start it
claims a uid range of its own, takes its namespaces (network and IPC; a mount namespace with a tmpfs
per slot), probes the other protections in throw-away children, builds a Landlock ruleset per slot
and the seccomp filter, and forks the zygote (``zygote.py``) before reading any request: every call's
child is forked by the zygote, which holds none of the queue or of other calls' data. It answers a
first frame ``{"probe": {...}, "missing": [...], "error": str | None, ...}`` and exits when a
protection is missing and ``allow_weaker`` is false.

Protocol (stdin/stdout): frames of a 4-byte big-endian length and a JSON object. A request
``{"id": int, "code": str}``; a reply ``{"id", "status", "stdout", "stderr", "exit_code", "signal",
"output_bytes", "wall_s", "cpu_s"}``. At most ``workers`` calls run at once (the rest queue), each in
a scratch directory of its own, emptied after each call. stdout and stderr have a budget each of
``output_bytes``: a stream past it is cut there and the program stopped.

Nothing a child does can raise out of the loop: every handler of a call's exit, output or scratch is
guarded, and a failure there answers that call with status ``sandbox`` (and retires its slot when
its scratch cannot be emptied) while the other calls go on.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import signal
import socket
import struct
import sys
import tempfile
import time

log = logging.getLogger("components.sandbox.server")  # to the trainer's stderr (main's handler)
_HEADER = struct.Struct(">I")
_READ = 65536
_MAX_CODE = 1 << 20  # bytes of code a call's pipe takes (the client refuses more)
_KILL_GRACE_S = 10.0  # after a kill, seconds to wait for the zygote's word that the child is gone
_INODES = 4096  # files and directories a call may create in its scratch tmpfs


class _Call:
    def __init__(self, rid: int, slot: int, deadline: float):
        self.rid, self.slot, self.deadline = rid, slot, deadline
        self.pipes: dict[int, str] = {}  # fd -> "stdout" | "stderr"
        self.data = {"stdout": bytearray(), "stderr": bytearray()}
        self.sizes = {"stdout": 0, "stderr": 0}
        self.ready: int | None = None  # read end of the ready pipe
        self.start = time.monotonic()
        self.stopped: str | None = None  # why the server had it killed
        self.killed_at: float | None = None


class Server:
    def __init__(self, cfg: dict, zsock: socket.socket):
        self.cfg, self.zsock = cfg, zsock
        self.output_bytes = cfg["limits"]["output_bytes"]
        self.wall_s = cfg["limits"]["wall_s"]
        self.sel = selectors.DefaultSelector()
        self.inbuf = bytearray()
        self.queue: list[dict] = []
        self.calls: dict[int, _Call] = {}  # by slot
        self.free_slots = list(range(cfg["workers"]))[::-1]

    # --- replies -----------------------------------------------------------------------------------

    def send(self, obj: dict) -> None:
        data = json.dumps(obj).encode()
        out = _HEADER.pack(len(data)) + data
        while out:
            n = os.write(1, out)
            out = out[n:]

    def reply(self, call: _Call, status: str, wait_status: int | None, cpu_s: float, note: str = "") -> None:
        code = os.waitstatus_to_exitcode(wait_status) if wait_status is not None else None
        stderr = call.data["stderr"].decode("utf-8", "replace") + note
        self.send(
            {
                "id": call.rid,
                "status": status,
                "stdout": call.data["stdout"].decode("utf-8", "replace"),
                "stderr": stderr,
                "exit_code": code if code is not None and code >= 0 else None,
                "signal": signal_name(-code) if code is not None and code < 0 else None,
                "output_bytes": call.sizes["stdout"] + call.sizes["stderr"],
                "wall_s": time.monotonic() - call.start,
                "cpu_s": cpu_s,
            }
        )

    def fail(self, rid: int, why: str) -> None:
        self.send(
            {"id": rid, "status": "sandbox", "stdout": "", "stderr": why, "exit_code": None, "signal": None,
             "output_bytes": 0, "wall_s": 0.0, "cpu_s": 0.0}
        )  # fmt: skip

    # --- a call's life -----------------------------------------------------------------------------

    def start_call(self, req: dict) -> None:
        if not isinstance(req, dict):
            return
        rid = req.get("id")
        code = req.get("code")
        if not isinstance(rid, int) or not isinstance(code, str):
            return
        data = code.encode("utf-8", "replace")
        if len(data) > _MAX_CODE:
            self.fail(rid, f"the code is {len(data)} bytes; the sandbox takes at most {_MAX_CODE}")
            return
        slot = self.free_slots.pop()
        call = _Call(rid, slot, time.monotonic() + self.wall_s)
        fds: list[int] = []
        try:
            code_r, code_w = os.pipe()
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            ready_r, ready_w = os.pipe()
            fds = [code_r, code_w, out_r, out_w, err_r, err_w, ready_r, ready_w]
            from components.sandbox.confine import set_pipe_size

            set_pipe_size(code_w, len(data))
            view = memoryview(data)
            while view:
                view = view[os.write(code_w, view) :]
            os.close(code_w)
            socket.send_fds(self.zsock, [json.dumps({"op": "spawn", "slot": slot}).encode()],
                            [code_r, out_w, err_w, ready_w])  # fmt: skip
            for fd in (code_r, out_w, err_w, ready_w):
                os.close(fd)
        except OSError as err:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self.free_slots.append(slot)
            self.fail(rid, f"the sandbox could not start the call: {err}")
            return
        call.pipes = {out_r: "stdout", err_r: "stderr"}
        call.ready = ready_r
        self.calls[slot] = call
        for fd in call.pipes:
            os.set_blocking(fd, False)
            self.sel.register(fd, selectors.EVENT_READ, ("pipe", call))

    def kill(self, call: _Call, why: str) -> None:
        if call.stopped is None:
            call.stopped = why
        if call.killed_at is None:
            call.killed_at = time.monotonic()
        self.zsock.send(json.dumps({"op": "kill", "slot": call.slot}).encode())

    def read_pipe(self, fd: int, call: _Call) -> None:
        try:
            chunk = os.read(fd, _READ)
        except BlockingIOError:
            return
        if not chunk:
            self.close_pipe(fd, call)
            return
        stream = call.pipes[fd]
        call.sizes[stream] += len(chunk)
        buf = call.data[stream]
        buf += chunk[: max(self.output_bytes - len(buf), 0)]
        if call.sizes[stream] > self.output_bytes:
            self.kill(call, "output")

    def close_pipe(self, fd: int, call: _Call) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(fd)
        with contextlib.suppress(OSError):
            os.close(fd)
        call.pipes.pop(fd, None)

    def finish(
        self, slot: int, wait_status: int | None, cpu_s: float, failure: str = "", retire: bool = False
    ) -> None:
        """The call of ``slot`` is over (its child reaped, or given up on): answer it, reset the slot
        (``retire``: processes of its uid could not be killed, so the slot is not used again).
        Whatever goes wrong here answers the call with ``sandbox`` rather than raising."""
        call = self.calls.pop(slot, None)
        if call is None:
            return
        try:
            for fd in list(call.pipes):  # what is left in the pipes; the writers are gone
                for _ in range(1 << 12):
                    if fd not in call.pipes or call.stopped == "output":
                        break
                    self.read_pipe(fd, call)
                    if fd in call.pipes and not _readable(fd):
                        break
                self.close_pipe(fd, call)
            ready = _read_ready(call.ready)
            if failure:
                status, note = "sandbox", failure
            else:
                status = call_status(call.stopped, wait_status, ready, cpu_s, self.cfg["limits"]["cpu_s"])
                note = ""
            self.reply(call, status, wait_status, cpu_s, note)
        except Exception as err:  # the call is answered whatever failed above
            log.exception("ending call %s failed", call.rid)
            with contextlib.suppress(Exception):
                self.fail(call.rid, f"the sandbox failed while ending the call: {type(err).__name__}: {err}")
        finally:
            if retire:
                log.warning("slot %s retired (what its call left could not be stopped)", slot)
            else:
                self.reset_slot(slot)

    def reset_slot(self, slot: int) -> None:
        """Empty the slot's scratch and give it back; a slot whose scratch cannot be emptied is retired
        (its calls go to the others), and a server with none left exits (the client starts another)."""
        try:
            reset_scratch(self.cfg, slot)
        except Exception:
            log.exception("slot %s retired (its scratch could not be emptied)", slot)
            return
        self.free_slots.append(slot)

    # --- the zygote's reports ----------------------------------------------------------------------

    def zygote_message(self) -> bool:
        """Handle one report of the zygote; False when it is gone."""
        data = self.zsock.recv(4096)
        if not data:
            return False
        msg = json.loads(data)
        slot = int(msg["slot"])
        if msg["op"] == "exited":
            self.finish(slot, int(msg["status"]), float(msg["cpu_s"]))
        elif msg["op"] == "failed":
            self.finish(slot, None, 0.0, f"the sandbox could not start the call: {msg.get('error')}")
        return True

    # --- the loop ----------------------------------------------------------------------------------

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
        self.sel.register(self.zsock, selectors.EVENT_READ, ("zygote", None))
        self.sel.register(0, selectors.EVENT_READ, ("requests", None))
        open_input = True
        while open_input or self.calls:
            while self.queue and self.free_slots:
                self.start_call(self.queue.pop(0))
            if not self.free_slots and not self.calls:
                log.error("every slot is retired; the server stops")
                for req in self.queue:
                    self.fail(req.get("id", -1), "the sandbox stopped: every slot is retired")
                return
            now = time.monotonic()
            for call in list(self.calls.values()):
                if call.killed_at is not None and now - call.killed_at > _KILL_GRACE_S:
                    self.finish(call.slot, None, 0.0, "the sandbox could not stop the call", retire=True)
                elif call.deadline <= now and call.stopped is None:
                    self.kill(call, "wall")
            deadlines = [c.deadline if c.killed_at is None else c.killed_at + _KILL_GRACE_S
                         for c in self.calls.values()]  # fmt: skip
            timeout = min(deadlines, default=now + 60) - now
            for key, _ in self.sel.select(max(timeout, 0) + 0.001):
                kind, call = key.data
                if kind == "requests":
                    if not self.read_requests():
                        self.sel.unregister(0)
                        open_input = False
                        for c in list(self.calls.values()):
                            self.kill(c, "closed")
                elif kind == "zygote":
                    if not self.zygote_message():
                        log.error("the zygote is gone; the server stops")
                        return
                elif kind == "pipe" and key.fd in call.pipes:
                    try:
                        self.read_pipe(key.fd, call)
                    except OSError:
                        log.exception("reading call %s's output failed", call.rid)
                        self.close_pipe(key.fd, call)


def call_status(
    stopped: str | None, wait_status: int | None, ready: bool, cpu_s: float, cpu_limit: int
) -> str:
    """ok | error (a non-zero exit) | wall_time | cpu_time | output | killed (by a signal) | setup
    (the sandbox failed before the program ran) | sandbox."""
    if stopped in ("wall", "output"):
        return {"wall": "wall_time", "output": "output"}[stopped]
    if wait_status is None:
        return "sandbox"
    if not ready:
        return "setup"
    code = os.waitstatus_to_exitcode(wait_status)
    if code == 0:
        return "ok"
    if code > 0:
        return "error"
    # the CPU limit sends SIGXCPU, then SIGKILL a second later; a signal the program sent itself does not
    # come with the CPU time spent. Half the limit, not all of it: the exit's rusage can read below the
    # clock the limit counts (0.81 s for a 1 s limit seen under a fork bomb on a busy machine).
    if -code in (signal.SIGXCPU, signal.SIGKILL) and cpu_s >= 0.5 * cpu_limit:
        return "cpu_time"
    return "killed"


def signal_name(number: int) -> str:
    """SIGSEGV, SIGRTMIN+6, or "signal 70" for a number without a name (never raises)."""
    try:
        return signal.Signals(number).name
    except ValueError:
        pass
    if signal.SIGRTMIN <= number <= signal.SIGRTMAX:
        return f"SIGRTMIN+{number - signal.SIGRTMIN}"
    return f"signal {number}"


def reset_scratch(cfg: dict, slot: int) -> None:
    from components.sandbox.scratch import empty_dir

    path = cfg["scratch"][slot]
    empty_dir(path)
    uid = cfg["uid_base"] + slot if cfg["uid_switch"] else os.geteuid()
    os.chown(path, uid, uid)
    os.chmod(path, 0o700)


def _readable(fd: int) -> bool:
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    try:
        return bool(sel.select(0))
    finally:
        sel.close()


def _read_ready(fd: int | None) -> bool:
    """Whether the child wrote its ready byte (it did once its confinement and code were in place)."""
    if fd is None:
        return False
    try:
        os.set_blocking(fd, False)
        return os.read(fd, 1) == b"R"
    except OSError:
        return False
    finally:
        os.close(fd)


# --- start-up --------------------------------------------------------------------------------------


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


_PROBE_UID = 2**31 - 2


def probe(cfg: dict) -> dict[str, str | None]:
    """Each protection -> None when granted, else why not (the namespaces: applied to this process)."""
    from components.sandbox import confine

    def seccomp() -> None:
        confine.no_new_privs()
        confine.load_seccomp(confine.seccomp_program())
        try:
            os.fork()
        except PermissionError:
            return
        raise RuntimeError("a seccomp filter loaded but fork was still allowed")

    def landlock() -> None:
        abi = confine.landlock_abi()
        if abi < 1:
            raise RuntimeError("the kernel has no Landlock")
        fd = confine.landlock_ruleset([], cfg["scratch_root"], abi)
        confine.no_new_privs()
        confine.landlock_enter(fd)
        try:
            with open(cfg["probe_file"]):
                pass
        except PermissionError:
            return
        raise RuntimeError(f"Landlock applied but {cfg['probe_file']} could still be read")

    def uid_switch() -> None:
        if os.geteuid() != 0:
            raise RuntimeError(f"the server runs as uid {os.geteuid()}, not root: it cannot switch uids")
        confine.switch_uid(_PROBE_UID, keep_read=True)
        try:
            os.kill(1, 0)
        except PermissionError:
            return
        raise RuntimeError("switched uid but could still signal pid 1")

    disabled = cfg["disable"]
    found: dict[str, str | None] = {}
    found["network_namespace"] = None if "network_namespace" in disabled else confine.unshare_network()
    found["scratch_tmpfs"] = None if "scratch_tmpfs" in disabled else confine.unshare_mounts()
    found["uid_switch"] = _in_child(uid_switch)
    found["landlock"] = _in_child(landlock)
    found["seccomp"] = _in_child(seccomp)
    for name in disabled:
        found[name] = found[name] or "disabled by the sandbox's settings"
    return found


def _prepare_scratch(cfg: dict) -> None:
    """One directory per slot beneath the scratch root; with ``scratch_tmpfs`` a tmpfs on each (the
    call's disk total and file count), in this server's own mount namespace."""
    from components.sandbox import confine

    cfg["scratch"] = [os.path.join(cfg["scratch_root"], f"slot{i}") for i in range(cfg["workers"])]
    for slot, path in enumerate(cfg["scratch"]):
        os.mkdir(path, 0o700)
        uid = cfg["uid_base"] + slot if cfg["uid_switch"] else os.geteuid()
        if cfg["scratch_tmpfs"]:
            confine.mount_tmpfs(path, cfg["limits"]["disk_mb"], _INODES, uid)
        reset_scratch(cfg, slot)


def main() -> None:
    cfg = json.loads(sys.argv[1])
    sys.path[:0] = cfg["lib_paths"]
    logging.basicConfig(stream=sys.stderr, format="sandbox %(name)s: %(levelname)s: %(message)s")
    from components.sandbox import confine, scratch, zygote

    protections = confine.PROTECTIONS
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    cfg["scratch_root"] = tempfile.mkdtemp(prefix="steprl-sandbox-")
    os.chmod(cfg["scratch_root"], 0o711)
    uid_lock = None
    try:
        cfg["uid_base"], uid_lock = confine.claim_uid_range(cfg["workers"], cfg["uid_floor"])
        found = probe(cfg)
        missing = {k: v for k, v in found.items() if v is not None}
        for name in protections:
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
        zygote_pid = None
        if error is None:
            _prepare_scratch(cfg)
            abi = confine.landlock_abi() if cfg["landlock"] else 0
            rules = confine.read_rules(cfg["stdlib_path"], cfg["system_paths"]) if abi else []
            rulesets = (
                {s: confine.landlock_ruleset(rules, p, abi) for s, p in enumerate(cfg["scratch"])}
                if abi
                else {}
            )
            for name in cfg["preload"]:
                __import__(name)
            program = confine.seccomp_program() if cfg["seccomp"] else None
            cfg["server_pid"] = os.getpid()
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            zygote_pid = os.fork()
            if zygote_pid == 0:
                ours.close()
                os.close(uid_lock)
                zygote.run(cfg, theirs, rulesets, program)
            theirs.close()
            for fd in rulesets.values():
                os.close(fd)
            cfg["landlock_abi"] = abi
        server_hello = {
            "probe": found,
            "missing": sorted(missing),
            "error": error,
            "pid": os.getpid(),
            "zygote_pid": zygote_pid,
            "scratch_root": cfg["scratch_root"],
            "uid_base": cfg["uid_base"],
            "landlock_abi": cfg.get("landlock_abi", 0),
        }
        Server(cfg, None).send(server_hello)
        if error is None:
            Server(cfg, ours).serve()
            ours.close()  # the zygote kills what is left and exits
            with contextlib.suppress(ChildProcessError):
                os.waitpid(zygote_pid, 0)
    finally:
        for path in cfg.get("scratch", []):
            with contextlib.suppress(Exception):
                confine.unmount(path) if cfg.get("scratch_tmpfs") else scratch.empty_dir(path)
        with contextlib.suppress(Exception):
            scratch.remove_tree(cfg["scratch_root"])
        if uid_lock is not None:
            os.close(uid_lock)


if __name__ == "__main__":
    main()
