"""The limits of one sandboxed call (:class:`SandboxLimits`) and the names of the protections."""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["PROTECTIONS", "SandboxLimits"]

# What the sandbox's server probes and applies (docs/sandbox.md): an empty network namespace (and an
# IPC one), a uid of the call's own (root only), Landlock (filesystem, signals), seccomp (syscalls), a
# size-limited tmpfs per call's scratch (in a mount namespace of the server's own).
PROTECTIONS = ("network_namespace", "uid_switch", "landlock", "seccomp", "scratch_tmpfs")


@dataclass(frozen=True)
class SandboxLimits:
    """What one call of model code may use; each, when hit, ends the call with its own message."""

    wall_s: float = 5.0  # wall-clock seconds, then the call's process group is killed
    cpu_s: int = 3  # CPU seconds of all its threads (RLIMIT_CPU)
    memory_mb: int = 512  # address space (RLIMIT_AS): a larger allocation raises MemoryError
    output_bytes: int = 16_384  # stdout kept, and stderr kept (each); more on either stops the program
    file_mb: int = 16  # largest file it may write in its scratch directory (RLIMIT_FSIZE)
    disk_mb: int = 64  # all its files together (the size of its scratch tmpfs)
    open_files: int = 64  # open file descriptors (RLIMIT_NOFILE)
    threads: int = 16  # processes + threads of its uid (RLIMIT_NPROC; binds only with a uid switch)

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"SandboxLimits.{name} must be a positive number, got {value!r}")
        for name in ("cpu_s", "memory_mb", "output_bytes", "file_mb", "disk_mb", "open_files", "threads"):
            if not isinstance(getattr(self, name), int):
                raise ValueError(f"SandboxLimits.{name} must be an integer, got {getattr(self, name)!r}")
        if self.open_files < 8:
            raise ValueError(
                f"SandboxLimits.open_files must be >= 8 (Python needs a few), got {self.open_files}"
            )
