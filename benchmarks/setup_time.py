"""How long `make setup`'s install takes with pip and with uv, from an empty package cache and a warm one.

    python benchmarks/setup_time.py [--lock requirements/cpu.lock] [--only uv,pip]

For each installer a fresh virtualenv (python3.11 -m venv) in a temporary folder, then the lock's
exact versions installed with ``--no-deps`` as `make setup` does (uv through requirements/uv_pip.py,
so both read this machine's pip sources): once with an empty cache folder of its own (``cold``), once
more into another fresh virtualenv with the cache the first install filled (``warm``). Prints seconds
per install and the load average before each; the venv creation and the editable install of steprl
itself (about a second each) are left out. Shared machines are noisy: repeat on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
UV_VERSION = "0.13.9"  # as the Makefile's UV_VERSION


def _venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    return path / "bin"


def _install(tool: str, bin_dir: Path, lock: Path, cache: Path, uv: Path | None) -> None:
    env = dict(os.environ)
    if tool == "pip":
        env["PIP_CACHE_DIR"] = str(cache)
        cmd = [str(bin_dir / "pip"), "install", "--quiet", "--no-deps", "-r", str(lock)]
    else:
        env["UV_CACHE_DIR"] = str(cache)
        uv_pip = ROOT / "requirements" / "uv_pip.py"
        cmd = [
            str(bin_dir / "python"),
            str(uv_pip),
            str(uv),
            "install",
            "--quiet",
            "--no-deps",
            "-r",
            str(lock),
        ]
    subprocess.run(cmd, check=True, env=env, cwd=ROOT)


def _uv(tmp: Path) -> Path:
    bin_dir = _venv(tmp / "uv-tool")
    subprocess.run([str(bin_dir / "pip"), "install", "--quiet", f"uv=={UV_VERSION}"], check=True)
    return bin_dir / "uv"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lock", default=str(ROOT / "requirements" / "cpu.lock"))
    ap.add_argument("--only", default="uv,pip", help="installers to time, comma-separated")
    args = ap.parse_args()
    lock = Path(args.lock).resolve()
    with tempfile.TemporaryDirectory(prefix="steprl-setup-") as t:
        tmp = Path(t)
        uv = _uv(tmp)
        for tool in args.only.split(","):
            cache = tmp / f"{tool}-cache"
            cache.mkdir()
            for label in ("cold", "warm"):
                bin_dir = _venv(tmp / f"{tool}-{label}")
                load = os.getloadavg()[0]
                t0 = time.perf_counter()
                _install(tool, bin_dir, lock, cache, uv)
                secs = time.perf_counter() - t0
                print(f"{tool:>3} {label}: {secs:7.1f} s  (load average {load:.2f})", flush=True)
                shutil.rmtree(bin_dir.parent)


if __name__ == "__main__":
    main()
