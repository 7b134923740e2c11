"""Emptying a call's scratch directory, whatever the call left in it.

Standard library only (the sandbox's server imports it, and so does the client, which cleans up after
a server that died). :func:`empty_dir` never recurses, so a tree thousands of levels deep costs no
stack; it opens nothing by a path longer than one name; it makes unreadable directories readable
again before it lists them; it follows no symbolic link; and it removes files of any type. It holds
two directory fds at a time however deep the tree is: a directory found inside another is first moved
up to the top (renamed under a fresh name), then emptied from there.
"""

from __future__ import annotations

import contextlib
import os
import stat

__all__ = ["empty_dir", "remove_tree"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def empty_dir(path: str) -> None:
    """Remove everything beneath ``path`` (a directory, kept). Raises OSError only when something
    could not be removed."""
    top = os.open(path, _DIR_FLAGS)
    try:
        _empty(top)
    finally:
        os.close(top)


def remove_tree(path: str) -> None:
    """Remove ``path`` and everything beneath it (nothing when it does not exist)."""
    try:
        empty_dir(path)
    except FileNotFoundError:
        return
    except NotADirectoryError:
        os.unlink(path)
        return
    os.rmdir(path)


def _empty(top: int) -> None:
    """Empty the directory ``top``: its subdirectories are renamed into ``top`` as ``.rm<n>`` and
    emptied there one after the other (a work list, no recursion)."""
    serial = 0
    pending: list[str] = []  # names in top of directories still to empty and remove
    _open_up(top)
    for entry in _entries(top):
        if _is_dir(top, entry):
            pending.append(entry)
        else:
            os.unlink(entry, dir_fd=top)
    while pending:
        name = pending.pop()
        fd = _open_dir(top, name)
        try:
            for entry in _entries(fd):
                if _is_dir(fd, entry):
                    _make_writable(fd, entry)  # moving a directory rewrites its ".."
                    serial += 1
                    moved = f".rm{serial}"
                    while _exists(top, moved):
                        serial += 1
                        moved = f".rm{serial}"
                    os.rename(entry, moved, src_dir_fd=fd, dst_dir_fd=top)
                    pending.append(moved)
                else:
                    os.unlink(entry, dir_fd=fd)
        finally:
            os.close(fd)
        os.rmdir(name, dir_fd=top)


def _open_up(fd: int) -> None:
    """Make the directory readable and searchable by its owner (a call may have chmod-ed it to 0)."""
    with contextlib.suppress(OSError):
        os.chmod(fd, stat.S_IRWXU | (os.fstat(fd).st_mode & 0o7777))


def _open_dir(parent: int, name: str) -> int:
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    except PermissionError:
        _make_writable(parent, name)
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    _open_up(fd)
    return fd


def _make_writable(parent: int, name: str) -> None:
    """chmod u+rwx a directory already known to be one (not a link: nothing else writes there now)."""
    with contextlib.suppress(OSError):
        mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
        os.chmod(name, stat.S_IRWXU | (mode & 0o7777), dir_fd=parent)


def _entries(fd: int) -> list[str]:
    with os.scandir(fd) as it:
        return [e.name for e in it]


def _is_dir(parent: int, name: str) -> bool:
    return stat.S_ISDIR(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode)


def _exists(parent: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True
