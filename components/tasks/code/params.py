"""The code task's params section, ``tasks.code`` in params.yaml, and how it makes the splits."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import polars as pl
from pydantic import Field, model_validator

from components.sandbox import SandboxLimits
from components.tasks.code.generator import GENERATORS, generate_splits
from components.tasks.recipe import TaskParams

__all__ = ["SANDBOX_FILE", "CodeParams", "make_splits"]

SANDBOX_FILE = "sandbox.json"  # the sandbox settings prepare saves beside the splits


class CodeParams(TaskParams):
    # Weight of each of reasoning-gym's generators in the mix (a problem's generator is drawn with
    # these weights; 0 or absent = not used): basic_arithmetic, gcd, lcm, prime_factorization,
    # base_conversion, count_primes, letter_counting, word_sorting.
    mix: dict[str, float] = Field(default_factory=lambda: dict.fromkeys(GENERATORS, 1.0))
    # Size of the numbers in a question, set in each generator's reasoning-gym config (operands up to
    # this, a counted range up to 2x, a factorised or converted number up to 4x).
    max_number: int = Field(60, ge=10, le=10**6)
    # Weaker demonstrations per train question on average: a first program with a mistake (NameError),
    # its error, the fixed program, the answer (0 = the expert's only).
    weak_per_question: float = Field(0.5, ge=0, le=8)
    # The sandbox of each `python` call (docs/sandbox.md): wall-clock seconds, CPU seconds, address
    # space (MB), output kept (bytes of stdout, and of stderr; more stops the program), largest scratch
    # file (MB), all scratch files together (MB).
    wall_s: float = Field(5.0, gt=0, le=600)
    cpu_s: int = Field(3, ge=1, le=600)
    memory_mb: int = Field(512, ge=64, le=65536)
    output_bytes: int = Field(4096, ge=64, le=10**7)
    file_mb: int = Field(16, ge=1, le=4096)
    disk_mb: int = Field(64, ge=1, le=65536)
    # Calls run at once by the sandbox's server (one child process each; more queue).
    workers: int = Field(4, ge=1, le=256)
    # Start even where the machine refuses a protection (network namespace, uid switch, Landlock,
    # seccomp, scratch tmpfs), with a warning naming it; false = refuse to start and say what is missing.
    allow_weaker: bool = False

    @model_validator(mode="after")
    def _known_generators(self) -> CodeParams:
        unknown = sorted(set(self.mix) - set(GENERATORS))
        if unknown:
            raise ValueError(f"mix: unknown generators {unknown}; known: {sorted(GENERATORS)}")
        if any(w < 0 for w in self.mix.values()) or not any(w > 0 for w in self.mix.values()):
            raise ValueError(f"mix: weights must be >= 0 with at least one > 0, got {self.mix}")
        return self

    def limits(self) -> SandboxLimits:
        return SandboxLimits(
            wall_s=self.wall_s,
            cpu_s=self.cpu_s,
            memory_mb=self.memory_mb,
            output_bytes=self.output_bytes,
            file_mb=self.file_mb,
            disk_mb=self.disk_mb,
        )

    def sandbox_settings(self) -> dict:
        """What the environment reads (saved by prepare as sandbox.json)."""
        return {"limits": asdict(self.limits()), "workers": self.workers, "allow_weaker": self.allow_weaker}

    def turns_needed(self) -> int | None:
        # a weaker demonstration: the failing call, the fixed call, the answer
        return 3 if self.weak_per_question > 0 else 2


def make_splits(
    p: CodeParams,
    *,
    seed: int,
    n_train: int,
    n_val: int,
    n_test: int,
    root: Path,
    data_dir: Path | None = None,
) -> dict[str, pl.DataFrame]:
    """The generated splits; the sandbox settings go to ``data_dir/sandbox.json`` for make_env."""
    if data_dir is not None:
        data_dir.mkdir(parents=True, exist_ok=True)
        (data_dir / SANDBOX_FILE).write_text(json.dumps(p.sandbox_settings(), indent=2))
    return generate_splits(
        seed=seed,
        n_train=n_train,
        n_val=n_val,
        n_test=n_test,
        mix=dict(p.mix),
        max_number=p.max_number,
        weak_per_question=p.weak_per_question,
    )
