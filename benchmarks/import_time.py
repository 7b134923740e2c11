"""How long each stage's entry module takes to import, against ``import torch`` alone, in fresh processes.

    python benchmarks/import_time.py                      # every stage of dvc.yaml, 3 repeats
    python benchmarks/import_time.py --repeats 5 --top 12 --modules flows.train
    python benchmarks/import_time.py --source             # also without bytecode (see below)
    python benchmarks/import_time.py --before /tmp/old    # also an older checkout of the repo, alternately

For each repeat, every module (``torch`` first, then the ``python -m flows.<stage>`` modules of
dvc.yaml's ``cmd`` lines) is imported by ``python -X importtime -c "import <module>"`` in a fresh
process, in turn, so a neighbour's load falls on all of them alike. Prints per module the median wall
time of the process (interpreter start included), its spread (min-max), the ratio to ``import torch``
and, from the repeat with the median wall time, the imports with the largest cumulative time
(``-X importtime``'s figures; nested imports are counted in their parents too).

``--before DIR`` adds a row per module for the code at DIR (e.g. ``git worktree add /tmp/old main``),
imported by the same interpreter in turn with this checkout's: a before/after figure from one run.
``--source`` adds a row per module, imported as an environment without compiled bytecode does
it when ``PYTHONDONTWRITEBYTECODE=1`` is set (many Docker images): every module compiled from source in
every process. It sets ``PYTHONPYCACHEPREFIX`` to an empty folder, so the ``__pycache__`` beside the
sources is neither read nor written. The load average before each repeat is printed: on a shared
machine, read the ratios rather than the seconds.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_IMPORTTIME = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)")


def stage_modules(dvc_yaml: Path = ROOT / "dvc.yaml") -> list[str]:
    """The ``python -m <module>`` of every ``cmd`` line of dvc.yaml, in order, each once."""
    found = re.findall(r"^\s*cmd:\s*python -m ([\w.]+)", dvc_yaml.read_text(), flags=re.M)
    return list(dict.fromkeys(found))


def parse_importtime(stderr: str) -> list[tuple[str, int, float]]:
    """``-X importtime`` lines as (module, nesting depth, cumulative seconds)."""
    out = []
    for line in stderr.splitlines():
        if m := _IMPORTTIME.match(line):
            out.append((m[4], len(m[3]) // 2, int(m[2]) / 1e6))
    return out


def import_once(module: str, env: dict[str, str]) -> tuple[float, list[tuple[str, int, float]]]:
    """(wall seconds of the process, its -X importtime lines) for one fresh ``import module``, run in
    the checkout on the environment's PYTHONPATH (``-c`` puts the working directory first on sys.path)."""
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", f"import {module}"],
        cwd=env["PYTHONPATH"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - t0
    if done.returncode:
        raise SystemExit(f"import {module} failed:\n{done.stderr[-2000:]}")
    return wall, parse_importtime(done.stderr)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--top", type=int, default=8, help="cumulative imports listed per module")
    ap.add_argument("--modules", nargs="*", help="default: the stage modules of dvc.yaml")
    ap.add_argument("--source", action="store_true", help="also time imports without bytecode")
    ap.add_argument("--before", help="another checkout of the repo, timed in turn with this one")
    args = ap.parse_args(argv)
    modules = ["torch", *(args.modules or stage_modules())]
    trees = {"now": ROOT} | ({"before": Path(args.before).resolve()} if args.before else {})
    with tempfile.TemporaryDirectory(prefix="steprl-nopyc-") as empty:
        modes: dict[str, dict[str, str]] = {}
        for label, tree in trees.items():
            env = {**os.environ, "PYTHONPATH": str(tree)}
            env.pop("PYTHONPYCACHEPREFIX", None)
            modes[label] = env
            if args.source:
                modes[f"{label}/src"] = {**env, "PYTHONPYCACHEPREFIX": empty, "PYTHONDONTWRITEBYTECODE": "1"}
        runs: dict[tuple[str, str], list[tuple[float, list]]] = {}
        for r in range(args.repeats):
            print(f"repeat {r + 1}/{args.repeats}: load average {os.getloadavg()[0]:.2f}", flush=True)
            for module in modules:
                for mode, env in modes.items():
                    runs.setdefault((module, mode), []).append(import_once(module, env))
    print(f"\n{sys.executable}, {os.cpu_count()} CPUs, {args.repeats} repeats")
    print(
        f"load average now {os.getloadavg()[0]:.2f}; modes: "
        + ", ".join(f"{k}={v}" for k, v in trees.items())
    )
    print("(a mode ending /src: without bytecode, every module compiled from source)\n")
    print(f"{'module':<24} {'mode':<11} {'median s':>9} {'min-max s':>13} {'x torch':>8}")
    torch_median = {mode: statistics.median(w for w, _ in runs[("torch", mode)]) for mode in modes}
    for module in modules:
        for mode in modes:
            walls = [w for w, _ in runs[(module, mode)]]
            med = statistics.median(walls)
            spread = f"{min(walls):.1f}-{max(walls):.1f}"
            print(f"{module:<24} {mode:<11} {med:>9.1f} {spread:>13} {med / torch_median[mode]:>8.1f}")
    for module, mode in ((m, mode) for m in modules[1:] for mode in modes if "/" not in mode):
        walls = sorted(runs[(module, mode)], key=lambda run: run[0])
        wall, lines = walls[len(walls) // 2]
        print(f"\nimport {module} ({mode}, the median repeat: {wall:.1f} s wall), top cumulative imports:")
        for name, depth, cum in sorted(lines, key=lambda x: -x[2])[: args.top]:
            print(f"  {cum:7.2f} s  {'  ' * depth}{name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
