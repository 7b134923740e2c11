"""Same inputs, same outputs: seed every random source and fix what else changes a CPU result.

What it does:
- ``make_deterministic(seed, threads)``: seeds Python's ``random``, numpy's global RNG and torch
  (``torch.manual_seed`` seeds the CPU generator and every CUDA device's), switches torch to
  deterministic algorithms, and fixes torch's intra-op thread count. Call it once at the start of a
  process, before any model is built or batch drawn (every stage does, in ``flows._stage.stage_main``).
  Returns what it set, for logging.
- ``default_threads()``: the thread count used when none is given: ``OMP_NUM_THREADS`` if set, else
  the CPUs this process may run on, at most ``MAX_DEFAULT_THREADS`` (2).

Why each setting:
- Seeds: code that draws from the global RNGs (weight init without its own generator, dropout,
  ``random.shuffle``) then draws the same numbers on every run. Code with its own seeded generator
  (``random.Random(seed)``, per-request vLLM seeds) does not need it.
- Thread count: a parallel float reduction may split its work by thread and add the partial sums in
  that order, so a different thread count CAN give different last bits, which then grow over hundreds
  of optimizer steps; torch otherwise picks the count from the machine (physical cores). Fixing it
  makes the count an input of a run like its params (rerun with the same one). Measured on the
  2-CPU dev machine (torch 2.13 CPU, MKL + oneDNN): SFT of the embedded model gave bit-identical
  weights at 1 and 2 threads, so there the count did not matter; it may on other shapes or builds.
  Default at most 2: the same default on any machine with >= 2 CPUs, and on the shared 2-CPU
  machine more threads than free cores made SFT several times slower (OpenMP threads wait on each
  other). A bigger model on a bigger machine: pass ``threads`` or set ``OMP_NUM_THREADS``. MKL and
  oneDNN choose kernels by instruction set: bit-identity across CPU models is not promised.
- ``torch.use_deterministic_algorithms(True, warn_only=True)``: where torch has a deterministic and a
  non-deterministic kernel it takes the deterministic one; ops that have none warn instead of raising,
  because in this code base such an op would come from vLLM or DeepSpeed internals that a run cannot
  avoid. On CPU almost every kernel is already deterministic for a fixed thread count; the switch
  matters on GPU (atomics in scatter/index_add/embedding backward). Uninitialised memory
  (``torch.empty``) is then filled with NaN, so a read of it shows up instead of varying silently.
- GPU (nothing here runs on GPU; for completeness): cuBLAS needs ``CUBLAS_WORKSPACE_CONFIG=:4096:8``
  (or ``:16:8``) in the environment BEFORE CUDA initialises, else deterministic mode raises on
  matmuls; cuDNN must not pick kernels by timing. This helper sets ``cudnn.benchmark = False`` and
  ``cudnn.deterministic = True`` (no effect on CPU) and, when CUDA is available, sets
  ``CUBLAS_WORKSPACE_CONFIG`` if it is unset (effective only if CUDA has not initialised yet).
- Not handled: Python's string hash randomisation (``PYTHONHASHSEED``) can only be fixed before the
  interpreter starts. A read of components/ and flows/ found no output that depends on the iteration
  order of a set of strings or on ``hash()`` (sets there are sorted or only tested for membership;
  ``random.Random(str)`` seeds from a SHA-512 of the string, not from ``hash``).

What it does not do: make vLLM deterministic by itself. vLLM samples with its own per-request
generators (``SamplingParams.seed``); the rollout engines take seeds per request. A vLLM CPU engine
started in the process replaces ``torch.set_num_threads`` by a no-op: call this helper before it
(``make_deterministic`` raises if the thread count cannot be set).
"""

from __future__ import annotations

import os
import random
from dataclasses import asdict, dataclass

__all__ = ["MAX_DEFAULT_THREADS", "DeterminismSettings", "default_threads", "make_deterministic"]

MAX_DEFAULT_THREADS = 2


@dataclass(frozen=True)
class DeterminismSettings:
    seed: int
    threads: int
    deterministic_algorithms: bool

    def as_dict(self) -> dict:
        return asdict(self)


def default_threads() -> int:
    """``OMP_NUM_THREADS`` when it is set to a positive int (the usual knob, e.g. two experiments
    sharing a machine at one thread each), else the CPUs this process may run on (its affinity
    mask), at most MAX_DEFAULT_THREADS."""
    raw = os.environ.get("OMP_NUM_THREADS", "").strip()
    if raw.isdigit() and int(raw) > 0:
        return int(raw)
    try:
        available = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        available = os.cpu_count() or 1
    return max(1, min(MAX_DEFAULT_THREADS, available))


def make_deterministic(seed: int, threads: int | None = None) -> DeterminismSettings:
    """Seed random, numpy and torch with ``seed``; deterministic torch algorithms; ``threads`` intra-op
    threads (None: :func:`default_threads`). Idempotent; raises ValueError on a bad argument."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed={seed!r} must be an int >= 0")
    if threads is None:
        threads = default_threads()
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads={threads!r} must be a positive int")

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)  # numpy's legacy global seed must fit in 32 bits
    torch.manual_seed(seed)  # CPU and every CUDA device
    if torch.cuda.is_available():
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    if torch.get_num_threads() != threads:
        # vLLM's CPU worker replaces torch.set_num_threads by a no-op once its engine has started.
        raise RuntimeError(
            f"could not set {threads} torch threads (still {torch.get_num_threads()}): call "
            "make_deterministic before starting a vLLM engine in this process"
        )
    return DeterminismSettings(seed=seed, threads=threads, deterministic_algorithms=True)
