"""The protections of a sandboxed call, and the server's probe of which ones this machine grants.

Standard library and ``pyseccomp`` only: imported by the sandbox's server (``python -I -S``) and its
zygote, which apply these in each call's child between ``fork`` and the model's code
(docs/sandbox.md has the table of what each one stops):

- rlimits: address space, CPU seconds, file size, open files, threads (with a uid of its own), no core,
  no locked memory, no POSIX message queues;
- a uid/gid of the call's own (root only), from a range this sandbox instance alone holds on the
  machine (:func:`claim_uid_range`), with no groups and only ``CAP_DAC_READ_SEARCH`` kept;
- Landlock (written here over its three syscalls: the ``landlock`` package has no signal scoping and
  builds a ruleset per call): read and execute beneath the standard library, less any
  ``site-packages`` / ``dist-packages`` inside it, and beneath the system library directories, less
  their Python directories; read/write beneath the call's scratch directory; no TCP; where the ABI has
  them (6+), no signals and no abstract unix sockets out of the call's own domain. A ruleset per slot
  is built once, before any call, and each child only enters it;
- seccomp (compiled once by libseccomp): ``EPERM`` for sockets, new processes, exec, signals to other
  processes, System V IPC and POSIX message queues, inotify/fanotify, ``memfd_create`` (pages that
  ``RLIMIT_AS`` does not count), ``fallocate`` (blocks past ``RLIMIT_FSIZE``), ``fcntl`` /
  ``ioctl`` that set a signal owner (``F_SETOWN``, ``F_SETSIG``: the kernel would send the signal),
  rlimit and credential changes, namespaces, mounts, ptrace and the like;
- namespaces, taken by the server for itself (every child is born in them): an empty network
  namespace, an IPC namespace of its own, and a mount namespace in which each slot's scratch is a
  size- and inode-limited tmpfs (``scratch_tmpfs``).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import resource
import stat
import tempfile

from components.sandbox.limits import PROTECTIONS  # noqa: F401 (the server reads it here)

_LIBC = ctypes.CDLL(None, use_errno=True)
_CLONE_NEWNS = 0x00020000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWNET = 0x40000000
_CLONE_NEWUSER = 0x10000000
_CLONE_THREAD = 0x00010000
_PR_SET_KEEPCAPS = 8
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_PR_SET_PDEATHSIG = 1
_SECCOMP_MODE_FILTER = 2
_CAP_VERSION_3 = 0x20080522
_CAP_DAC_READ_SEARCH = 2
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REC, _MS_PRIVATE = 2, 4, 8, 1 << 14, 1 << 18
_F_SETPIPE_SZ = 1031

# Syscalls a child may not make (each fails with EPERM); see the module docstring.
_REFUSED = (
    "socket", "socketpair", "connect", "bind", "listen", "accept", "accept4",
    "fork", "vfork", "execve", "execveat",
    "kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo",
    "pidfd_open", "pidfd_send_signal", "pidfd_getfd", "process_vm_readv", "process_vm_writev",
    "process_madvise", "ptrace", "kcmp", "prlimit64", "setrlimit", "setpriority",
    "setsid", "setpgid", "setuid", "setgid", "setreuid", "setregid", "setresuid", "setresgid", "setgroups",
    "setfsuid", "setfsgid", "capset",
    "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "mknod", "mknodat",
    "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
    "bpf", "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key", "personality",
    "io_uring_setup", "io_uring_enter", "io_uring_register",
    "open_by_handle_at", "name_to_handle_at", "quotactl", "swapon", "swapoff", "reboot",
    "init_module", "finit_module", "delete_module", "kexec_load", "acct", "syslog",
    "shmget", "shmat", "shmdt", "shmctl", "msgget", "msgsnd", "msgrcv", "msgctl",
    "semget", "semop", "semtimedop", "semctl",
    "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr",
    "inotify_init", "inotify_init1", "inotify_add_watch", "fanotify_init", "fanotify_mark",
    "memfd_create", "memfd_secret", "fallocate",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex",
)  # fmt: skip
# fcntl commands that make the kernel signal some process (an owner) or watch a directory.
_FCNTL_REFUSED = {"F_SETOWN": 8, "F_SETSIG": 10, "F_SETOWN_EX": 15, "F_SETLEASE": 1024, "F_NOTIFY": 1026}
_IOCTL_REFUSED = {"FIOSETOWN": 0x8901, "SIOCSPGRP": 0x8902}
_U32 = 0xFFFFFFFF  # the kernel reads fcntl's and ioctl's command as an unsigned int


# --- rlimits, uid ----------------------------------------------------------------------------------


def set_rlimits(limits: dict, uid_switch: bool) -> None:
    mem = limits["memory_mb"] * 2**20
    cpu = limits["cpu_s"]
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU at cpu, SIGKILL a second later
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_mb"] * 2**20,) * 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits["open_files"],) * 2)
    for name in ("RLIMIT_CORE", "RLIMIT_MEMLOCK", "RLIMIT_MSGQUEUE"):
        resource.setrlimit(getattr(resource, name), (0, 0))
    if uid_switch:  # RLIMIT_NPROC counts the processes (and threads) of the real uid
        resource.setrlimit(resource.RLIMIT_NPROC, (limits["threads"],) * 2)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def switch_uid(uid: int, keep_read: bool) -> None:
    """Become ``uid``/``uid`` with no groups; ``keep_read``: keep CAP_DAC_READ_SEARCH alone (and no
    other capability), so a Python beneath a root-only home stays readable (Landlock then bounds what
    may be read)."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    if keep_read and _LIBC.prctl(_PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_KEEPCAPS) failed")
    os.setresuid(uid, uid, uid)
    if keep_read:
        header = _CapHeader(_CAP_VERSION_3, 0)
        bit = 1 << _CAP_DAC_READ_SEARCH
        data = (_CapData * 2)(_CapData(bit, bit, 0), _CapData(0, 0, 0))
        if _LIBC.capset(ctypes.byref(header), data) != 0:
            raise OSError(ctypes.get_errno(), "capset(CAP_DAC_READ_SEARCH) failed")


def die_with_parent(parent: int) -> None:
    """SIGKILL this process when its parent dies (set after the uid switch, which clears it)."""
    if _LIBC.prctl(_PR_SET_PDEATHSIG, 9, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:
        raise RuntimeError("the parent died before the child was set up")


def no_new_privs() -> None:
    if _LIBC.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")


def claim_uid_range(count: int, floor: int, ranges: int = 1024) -> tuple[int, int]:
    """A base uid whose ``count`` uids no other sandbox on this machine holds, and the fd of the lock
    that holds them (an ``flock`` the kernel drops when every process holding the fd is gone).

    Range i is ``floor + i * 1024``; it is taken when its lock file is free and no process runs as one
    of its uids (a leftover of a server that died). Two stages and a test beside them each get their
    own range, so one call can neither signal nor starve (``RLIMIT_NPROC``) another sandbox's calls."""
    if count > 1024:
        raise ValueError(f"workers must be <= 1024, got {count}")
    base_dir = "/run/steprl-sandbox" if os.geteuid() == 0 and os.path.isdir("/run") else None
    base_dir = base_dir or os.path.join(tempfile.gettempdir(), f"steprl-sandbox-{os.geteuid()}")
    os.makedirs(base_dir, mode=0o700, exist_ok=True)
    busy = _uids_in_use()
    for i in range(ranges):
        base = floor + i * 1024
        fd = os.open(os.path.join(base_dir, f"uids-{i}.lock"), os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        if any(base <= uid < base + 1024 for uid in busy):
            os.close(fd)
            continue
        return base, fd
    raise RuntimeError(f"no free sandbox uid range: all {ranges} are held (locks in {base_dir})")


def _uids_in_use() -> set[int]:
    out = set()
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                out.add(os.stat(f"/proc/{name}").st_uid)
    return out


def processes_of(uids: range) -> list[int]:
    """The pids whose uid is in ``uids`` (from /proc)."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid in uids:
                    out.append(int(name))
            except OSError:
                pass
    return out


# --- Landlock --------------------------------------------------------------------------------------

_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_LANDLOCK_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
# filesystem rights (uapi/linux/landlock.h), with the ABI that introduced each
_FS = {
    "EXECUTE": (1 << 0, 1), "WRITE_FILE": (1 << 1, 1), "READ_FILE": (1 << 2, 1), "READ_DIR": (1 << 3, 1),
    "REMOVE_DIR": (1 << 4, 1), "REMOVE_FILE": (1 << 5, 1), "MAKE_CHAR": (1 << 6, 1), "MAKE_DIR": (1 << 7, 1),
    "MAKE_REG": (1 << 8, 1), "MAKE_SOCK": (1 << 9, 1), "MAKE_FIFO": (1 << 10, 1), "MAKE_BLOCK": (1 << 11, 1),
    "MAKE_SYM": (1 << 12, 1), "REFER": (1 << 13, 2), "TRUNCATE": (1 << 14, 3), "IOCTL_DEV": (1 << 15, 5),
}  # fmt: skip
_NET_TCP = (1 << 0) | (1 << 1)  # bind, connect (ABI 4)
_SCOPE = (1 << 0) | (1 << 1)  # abstract unix sockets, signals (ABI 6)
_FILE_RIGHTS = ("EXECUTE", "WRITE_FILE", "READ_FILE", "TRUNCATE", "IOCTL_DEV")
_READ = ("READ_FILE", "READ_DIR", "EXECUTE")
_SCRATCH = ("READ_FILE", "WRITE_FILE", "READ_DIR", "REMOVE_DIR", "REMOVE_FILE", "MAKE_DIR", "MAKE_REG")
_SCRATCH += ("MAKE_SYM", "REFER", "TRUNCATE")
_NOT_STDLIB = ("site-packages", "dist-packages")


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0 when it has none)."""
    abi = _LIBC.syscall(_SYS_CREATE_RULESET, None, 0, _LANDLOCK_CREATE_RULESET_VERSION)
    return max(abi, 0)


def _rights(names: tuple[str, ...], abi: int, file_only: bool = False) -> int:
    keep = [n for n in names if _FS[n][1] <= abi and (not file_only or n in _FILE_RIGHTS)]
    return sum(_FS[n][0] for n in keep)


def read_rules(stdlib: list[str], system: list[str]) -> list[tuple[str, str]]:
    """(path, "read" | "list") rules of what a child may read: the standard library's directories
    (listable, since the import system lists them) and each of their entries but ``site-packages`` /
    ``dist-packages``; each entry of the system library directories but their Python ones (the
    dynamic loader reads there: the extension modules' shared libraries)."""
    rules: list[tuple[str, str]] = []
    for path in stdlib:
        if os.path.isdir(path):
            rules.append((path, "list"))
            rules += [
                (os.path.join(path, e), "read") for e in sorted(os.listdir(path)) if e not in _NOT_STDLIB
            ]
        elif os.path.exists(path):
            rules.append((path, "read"))
    for path in system:
        if os.path.isdir(path):
            for entry in sorted(os.listdir(path)):
                if not entry.startswith("python") and entry not in _NOT_STDLIB:
                    rules.append((os.path.join(path, entry), "read"))
        elif os.path.exists(path):
            rules.append((path, "read"))
    return rules


def landlock_ruleset(rules: list[tuple[str, str]], scratch: str, abi: int) -> int:
    """A ruleset fd: ``rules`` (:func:`read_rules`) readable, ``scratch`` writable, nothing else; no
    TCP (ABI 4+); signals and abstract sockets scoped to the domain (ABI 6+). Enter it with
    :func:`landlock_enter`; building costs a syscall per rule, entering one."""
    attr = _RulesetAttr(_rights(tuple(_FS), abi), _NET_TCP if abi >= 4 else 0, _SCOPE if abi >= 6 else 0)
    size = ctypes.sizeof(_RulesetAttr) if abi >= 6 else (16 if abi >= 4 else 8)
    fd = _LIBC.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), size, 0)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        for path, kind in [*rules, (scratch, "scratch")]:
            names = {"read": _READ, "list": ("READ_DIR",), "scratch": _SCRATCH}[kind]
            try:
                pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # vanished since it was listed
            try:
                allowed = _rights(names, abi, file_only=not stat.S_ISDIR(os.fstat(pfd).st_mode))
                if not allowed:
                    continue
                beneath = _PathBeneath(allowed, pfd)
                if _LIBC.syscall(_SYS_ADD_RULE, fd, _RULE_PATH_BENEATH, ctypes.byref(beneath), 0) != 0:
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule({path}) failed")
            finally:
                os.close(pfd)
    except BaseException:
        os.close(fd)
        raise
    return fd


def landlock_enter(ruleset_fd: int) -> None:
    """Restrict this process to the ruleset (after no_new_privs, as an unprivileged process must)."""
    if _LIBC.syscall(_SYS_RESTRICT_SELF, ruleset_fd, 0) != 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")


# --- seccomp ---------------------------------------------------------------------------------------


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def seccomp_program() -> bytes:
    """The filter as classic BPF (libseccomp compiles it once, in the server)."""
    import pyseccomp as sc

    f = sc.SyscallFilter(sc.ALLOW)
    for name in _REFUSED:
        f.add_rule(sc.ERRNO(errno.EPERM), name)
    f.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, _CLONE_THREAD, 0))
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    for cmd in _FCNTL_REFUSED.values():
        f.add_rule(sc.ERRNO(errno.EPERM), "fcntl", sc.Arg(1, sc.MASKED_EQ, _U32, cmd))
    for cmd in _IOCTL_REFUSED.values():
        f.add_rule(sc.ERRNO(errno.EPERM), "ioctl", sc.Arg(1, sc.MASKED_EQ, _U32, cmd))
    with tempfile.TemporaryFile() as file:
        f.export_bpf(file)
        file.seek(0)
        return file.read()


def load_seccomp(program: bytes) -> None:
    """Install ``program`` on this process (after no_new_privs)."""
    buf = ctypes.create_string_buffer(program, len(program))
    prog = _SockFprog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p))
    if _LIBC.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")


# --- namespaces and the scratch tmpfs --------------------------------------------------------------


def unshare_network() -> str | None:
    """Move this process into a new, empty network namespace and an IPC namespace of its own; None on
    success, else why not."""
    user = 0 if os.geteuid() == 0 else _CLONE_NEWUSER
    if _LIBC.unshare(user | _CLONE_NEWNET | _CLONE_NEWIPC) == 0:
        return None
    if _LIBC.unshare(user | _CLONE_NEWNET) == 0:  # a kernel without IPC namespaces
        return None
    return f"unshare(CLONE_NEWNET) refused: {os.strerror(ctypes.get_errno())}"


def unshare_mounts() -> str | None:
    """A mount namespace of this process's own, with nothing propagating back to the host's; None on
    success, else why not."""
    if _LIBC.unshare(_CLONE_NEWNS) != 0:
        return f"unshare(CLONE_NEWNS) refused: {os.strerror(ctypes.get_errno())}"
    if _LIBC.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        return f"mount(/, MS_REC|MS_PRIVATE) refused: {os.strerror(ctypes.get_errno())}"
    return None


def mount_tmpfs(path: str, size_mb: int, inodes: int, uid: int) -> None:
    """A tmpfs of ``size_mb`` MB and ``inodes`` inodes on ``path`` (no setuid, devices or exec), its
    root owned by ``uid`` with mode 0700."""
    opts = f"size={size_mb}m,nr_inodes={inodes},mode=0700,uid={uid},gid={uid}".encode()
    flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
    if _LIBC.mount(b"steprl-scratch", path.encode(), b"tmpfs", flags, opts) != 0:
        raise OSError(ctypes.get_errno(), f"mount tmpfs on {path} failed")


def unmount(path: str) -> None:
    if _LIBC.umount2(path.encode(), 2) != 0:  # MNT_DETACH
        raise OSError(ctypes.get_errno(), f"umount {path} failed")


def set_pipe_size(fd: int, size: int) -> None:
    """Grow a pipe's buffer to at least ``size`` bytes (the kernel rounds up to pages)."""
    if size > 65536:
        fcntl.fcntl(fd, _F_SETPIPE_SZ, size)
