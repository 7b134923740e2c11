"""A throwaway copy of the repo for end-to-end tests: the developer's workspace is never touched."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

# A very small but complete configuration of every stage (seconds per stage, not minutes).
TINY = {
    "prepare": {"n_train": 64, "n_val": 8, "n_test": 8},
    "model": {
        "vocab_size": 400,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_layers": 1,
        "num_heads": 2,
        "num_kv_heads": 1,
    },
    "sft": {"steps": 4, "batch_size": 8, "micro_batch_size": 4, "warmup_steps": 1, "rows": 32},
    "rollout": {"max_steps": 3, "max_response_len": 48},
    # both sampled protocols (params.yaml plays T=0.4 only since issue 72): the T=1 one also fills the
    # flat sampled_accuracy / pass_at_k of the eval files and MLflow
    "evaluate": {"max_samples": 8, "temperatures": [0.4, 1.0]},
    "train": {
        "iterations": 2,
        "trajectories_per_iteration": 8,
        # every step row (8 trajectories x rollout.max_steps 3) in one optimizer step: on-policy, as the
        # default old_logprobs: detached needs
        "mini_batch_size": 24,
        "micro_batch_size": 4,
        "val_samples": 4,
        "val_every": 1,
    },
    "algorithms": {
        "grpo": {"preset": "grpo", "samples_per_prompt": 2},
        "ppo": {"preset": "ppo", "samples_per_prompt": 1},
        "steppo": {"preset": "steppo", "samples_per_prompt": 1, "clip_low": 0.0003, "clip_high": 0.0004},
    },
    # The train matrix: two algorithms (one without a critic, one with) x two RL seeds.
    "compare": {"algorithms": ["grpo", "steppo"], "seeds": [0, 1]},
    # The critic warm-up stage on: 8 SFT episodes, a short fit that the steppo runs start from.
    "critic_warmup": {"episodes": 8, "batch_size": 8, "max_steps": 4, "eval_every": 2, "patience": 2},
}


def _source_files() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    return [f for f in out if f and (REPO / f).is_file()]


def make_workspace(root: Path, overrides: dict | None = None) -> Path:
    """Copy the repo's source files into ``root`` as a fresh git + DVC repo with tiny params."""
    for rel in _source_files():
        dst = root / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, dst)
    for junk in ("dvc.lock", "metrics", "plots", "reports"):  # results committed from a real run
        p = root / junk
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    params = yaml.safe_load((root / "params.yaml").read_text())
    for section, values in {**TINY, **(overrides or {})}.items():
        if isinstance(values, dict) and section != "algorithms":
            params.setdefault(section, {}).update(values)
        else:
            params[section] = values
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    git = ["git", "-c", "user.name=test", "-c", "user.email=test@example.com"]
    subprocess.run(git + ["init", "-q"], cwd=root, check=True)
    subprocess.run(git + ["add", "-A"], cwd=root, check=True)
    subprocess.run(git + ["commit", "-qm", "workspace"], cwd=root, check=True)
    return root


def sft_workspace(root: Path, overrides: dict | None = None, timeout: float = 900) -> Path:
    """:func:`make_workspace`, then its prepare, base_model and sft stages: a workspace ready to train."""
    ws = make_workspace(root, overrides)
    for stage in ("prepare", "base_model", "sft"):
        run(["python", "-m", f"flows.{stage}"], ws, timeout=timeout)
    return ws


def one_grpo_run(iterations: int, rollout: dict | None = None, correction: str = "none", **top) -> dict:
    """Overrides for one GRPO run (RL seed 0) of ``iterations`` iterations with ``rollout`` over TINY's
    and ``algorithms.grpo.correction``, validated after the last iteration only; ``top``: more
    top-level keys (``task``). The tiny SFT model scores 0 everywhere, so an entropy bonus makes every
    update move the weights."""
    return {
        **top,
        "rollout": {**TINY["rollout"], **(rollout or {})},
        "train": {**TINY["train"], "iterations": iterations, "val_every": 10, "entropy_coef": 0.01},
        "algorithms": {
            **TINY["algorithms"],
            "grpo": {**TINY["algorithms"]["grpo"], "correction": correction},
        },
        "compare": {"algorithms": ["grpo"], "seeds": [0]},
    }


def _workspace_env(cwd: Path) -> dict[str, str]:
    """This process's environment without its Prefect, MLflow and DVC settings, the venv first on PATH
    and the workspace's code (not the developer's editable install) on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "DVC_"))}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(cwd)
    return env


def run(cmd: list[str], cwd: Path, timeout: float = 900, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        cmd, cwd=cwd, env=_workspace_env(cwd), capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{cmd} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        )
    return proc


def kill_when_written(
    cmd: list[str], cwd: Path, target: Path, timeout: float = 900, poll: float = 0.05
) -> bool:
    """Start ``cmd`` in ``cwd`` (as :func:`run` would, in a session of its own) and SIGKILL its whole
    process group as soon as ``target`` exists (or when it ends by itself, or after ``timeout``
    seconds). True when ``target`` was written: the kill then fell after that point."""
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=_workspace_env(cwd),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.time() + timeout
    while not target.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(poll)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return target.exists()


@contextlib.contextmanager
def watch_listeners(interval: float = 0.2) -> Iterator[dict]:
    """While the block runs, poll every descendant process of this one for listening TCP sockets.

    Yields ``{"listening": {(stage, ip, port)}, "stages": {stage}}``, filled in as it goes: ``stage``
    is the ``flows.<name>`` module a process runs (``python -m flows.sft`` ...), or its process name
    for anything else (a Prefect server, vLLM's engine process); ``stages`` are the flows modules seen
    running at least once."""
    import psutil

    seen: dict = {"listening": set(), "stages": set()}
    stop = threading.Event()

    def label(proc: psutil.Process) -> str:
        cmd = proc.cmdline()
        module = cmd[cmd.index("-m") + 1] if "-m" in cmd[:-1] else ""
        return module if module.startswith("flows.") else proc.name()

    def poll() -> None:
        me = psutil.Process()
        while not stop.is_set():
            for proc in me.children(recursive=True):
                try:
                    name = label(proc)
                    conns = proc.net_connections(kind="tcp")
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue
                if name.startswith("flows."):
                    seen["stages"].add(name)
                for c in conns:
                    if c.status == psutil.CONN_LISTEN:
                        seen["listening"].add((name, c.laddr.ip, c.laddr.port))
            stop.wait(interval)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join()
