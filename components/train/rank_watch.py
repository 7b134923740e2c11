"""Rank 0 watches the ranks it spawned: a rank that dies stops the stage within seconds.

A data-parallel world's ranks meet only in collectives, so without a watch a rank that dies (killed,
out of memory) is noticed by rank 0 at its next collective, which may come after a whole rollout or
evaluation. :class:`RankWatch` joins the spawned ranks from a thread with torch.multiprocessing's
own join (``ProcessContext.join``: on the first rank that exits with a non-zero code or a signal it
stops the others, SIGTERM then SIGKILL, and says how the rank ended). Then, in this order:

1. one line on stderr names the rank and how it ended
   (``error: rank 1 of 2 (pid 4242) was killed by SIGKILL: stopping the stage``);
2. :class:`WorldStopped` is raised in rank 0's thread that runs the world (CPython's
   ``PyThreadState_SetAsyncExc``, as Prefect's own timeouts do), so the stage unwinds as from any
   error: its Prefect run fails, its MLflow run ends, vLLM's process is shut down. A collective
   that is running when the rank dies fails by itself (gloo: "Connection reset by peer") and gets
   there first;
3. if rank 0 has not left the world :data:`STOP_GRACE_S` seconds later (its thread blocked where no
   exception can reach it), every process below rank 0 is stopped and rank 0 exits with code 1.

So a rank's death ends the stage within ``STOP_GRACE_S`` (+ about 2 s for the join's SIGTERM /
SIGKILL of the other ranks) whatever rank 0 was doing, and the stage's exception is
:class:`RankFailed` naming the rank (raised from what rank 0 was interrupted with). A rank
that ends with code 0 before the world does is not a failure (the SFT followers finish their last
step and exit). An error of the watch itself (its join) stops the stage the same way, with that
error instead of :class:`RankFailed`: a watch that cannot watch must not let rank 0 take the ranks
for finished.

Rank 0 leaving on an error of its own (:meth:`RankWatch.settle`) first gives the watch a moment to
see a rank failure behind it (a collective fails on rank 0 as soon as its peer's socket closes),
and from then on no :class:`WorldStopped` is raised into it: the failure is only recorded.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading

from torch.multiprocessing import ProcessContext, ProcessExitedException, ProcessRaisedException

from components.process_tree import describe_exit, stop_descendants

__all__ = ["STOP_GRACE_S", "RankFailed", "RankWatch", "WorldStopped", "how_it_ended"]

log = logging.getLogger(__name__)

# Seconds rank 0 has to unwind after a rank's failure before it is stopped by force.
STOP_GRACE_S = 20.0
# Seconds rank 0, leaving on an error of its own, gives the watch to find a rank failure behind it
# (the wait ends as soon as the watch has).
SETTLE_S = 2.0


class RankFailed(RuntimeError):
    """A rank of the world ended before the world did; the message names it and how it ended."""

    def __init__(self, rank: int, world_size: int, pid: int | None, how: str, where: str = "") -> None:
        self.rank, self.world_size, self.pid, self.how = rank, world_size, pid, how
        pid_part = f"pid {pid}" if pid is not None else "pid unknown"
        super().__init__(f"rank {rank} of {world_size} ({where}{pid_part}) {how}")


class WorldStopped(RuntimeError):
    """Raised in rank 0's thread when another rank failed (the line before it names the rank)."""

    def __init__(self, msg: str = "another rank of this data-parallel world failed") -> None:
        super().__init__(msg)


def _raise_in_thread(thread_id: int, exc_type: type[BaseException] | None) -> None:
    """Raise ``exc_type`` in thread ``thread_id`` at its next Python instruction (None: cancel)."""
    arg = None if exc_type is None else ctypes.py_object(exc_type)
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), arg)


def how_it_ended(err: ProcessExitedException | ProcessRaisedException) -> str:
    """How a spawned rank ended, for the line naming it: its exit (signal or code), or the last line
    of the exception torch pickled from it (at most 300 characters)."""
    if isinstance(err, ProcessExitedException):
        return describe_exit(err.exit_code)
    lines = [line.strip() for line in err.msg.strip().splitlines() if line.strip()]
    return f"raised {lines[-1][:300] if lines else 'an exception'}"


class RankWatch:
    """Joins the spawned ranks of ``ctx`` (ranks ``first_rank``, ``first_rank + 1``, ...) from a
    thread; on a failure stops the thread that made the watch (rank 0's), as the module says."""

    def __init__(
        self,
        ctx: ProcessContext,
        *,
        first_rank: int,
        world_size: int,
        grace_s: float | None = None,
        poll_s: float = 0.2,
    ) -> None:
        self._ctx, self._first, self._world = ctx, first_rank, world_size
        self._grace_s = STOP_GRACE_S if grace_s is None else grace_s
        self._poll_s = poll_s
        self._owner = threading.get_ident()
        self._lock = threading.Lock()
        self._closing = False
        self._unwinding = False  # rank 0 is leaving on an error of its own: record, raise nothing
        self._verdict = threading.Event()  # a failure is recorded, or the watch thread has ended
        self._left = threading.Event()  # rank 0 has left the world
        # Why the stage stops: a rank's failure, or the watch's own error (None: no reason yet).
        self.failure: RankFailed | Exception | None = None
        self._thread = threading.Thread(target=self._run, name="steprl-rank-watch", daemon=True)
        self._thread.start()

    # --- the watch thread ------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._watch()
        except Exception as err:  # the watch cannot go on: the ranks are no longer watched
            self._fail(err)
        finally:
            self._verdict.set()

    def _watch(self) -> None:
        """Until every rank ended well (returns) or one failed (:meth:`_fail`, then returns)."""
        while not self._closing:
            try:
                if self._ctx.join(timeout=self._poll_s, grace_period=1.0):
                    return
            except (ProcessExitedException, ProcessRaisedException) as err:
                self._fail(self._describe(err))
                return

    def _describe(self, err: ProcessExitedException | ProcessRaisedException) -> RankFailed:
        return RankFailed(self._first + err.error_index, self._world, err.error_pid, how_it_ended(err))

    def _fail(self, failure: RankFailed | Exception) -> None:
        """Record why the stage stops and stop rank 0's thread (unless it is already leaving)."""
        with self._lock:
            if self._closing:  # rank 0 has left (its own error): it stopped the ranks
                return
            self.failure = failure
            self._verdict.set()
            if isinstance(failure, RankFailed):
                log.error(f"error: {failure}: stopping the stage")
            else:
                log.error(
                    f"error: the rank watch failed ({type(failure).__name__}: {failure}): stopping the stage"
                )
            if not self._unwinding:
                _raise_in_thread(self._owner, WorldStopped)
        if self._left.wait(self._grace_s):
            return
        what = f"rank {failure.rank}" if isinstance(failure, RankFailed) else "the rank watch"
        log.error(
            f"error: rank 0 did not stop within {self._grace_s:.0f} s of the failure of {what}: "
            "stopping its processes and exiting"
        )
        stop_descendants(grace_s=2.0)
        os._exit(1)

    # --- rank 0's side ---------------------------------------------------------------------------
    def wait_for_ranks(self) -> None:
        """Rank 0 is done: wait until the spawned ranks end; raise :attr:`failure` if one failed (or
        the watch did). Waits in short steps, so that a failure's :class:`WorldStopped` can reach
        this thread."""
        while not self._verdict.wait(self._poll_s):
            pass
        if self.failure is not None:
            raise self.failure

    def settle(self, err: BaseException) -> None:
        """Rank 0 is leaving on ``err``: from now on a failure is recorded, not raised into this
        thread. A collective fails on rank 0 as soon as its peer's socket closes, maybe before the
        watch has seen the process end: unless ``err`` is Ctrl-C or a failure is known already, the
        watch is given up to :data:`SETTLE_S` to find one; the wait ends as soon as it does (or the
        watch ends)."""
        with self._lock:
            self._unwinding = True
        if self.failure is None and not isinstance(err, KeyboardInterrupt):
            self._verdict.wait(SETTLE_S)

    def close(self) -> None:
        """Rank 0 leaves the world (normally or not): stop watching, stop the ranks still running
        (SIGTERM, SIGKILL after 5 s), cancel a :class:`WorldStopped` not yet delivered. Safe to call
        again (a :class:`WorldStopped` delivered inside it cuts it short)."""
        with self._lock:
            self._closing = True
            if self.failure is not None and threading.get_ident() == self._owner:
                _raise_in_thread(self._owner, None)
        self._left.set()
        self._thread.join()  # within poll_s, or the ~2 s of a failed join's SIGTERM/SIGKILL
        for proc in self._ctx.processes:
            if proc.is_alive():
                proc.terminate()
        for proc in self._ctx.processes:
            proc.join(5.0)
            if proc.is_alive():
                proc.kill()
                proc.join()
