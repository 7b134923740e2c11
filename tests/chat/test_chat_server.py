"""VLLMServer's life cycle with stand-in commands (no vLLM): the vLLM argv and environment, an early
exit and a timeout as one-line ServerErrors, and stop() ending the whole process group."""

from __future__ import annotations

import os
import socket
import sys
import textwrap
import time

import pytest

from components.chat import ServerError, VLLMServer, vllm_command
from components.chat.server import free_port, server_env
from components.rollout import EngineSettings
from tests.chat.chat_helpers import live_group_members


def test_the_vllm_command_turns_tool_calling_on_and_binds_localhost():
    argv = vllm_command(
        "/m", EngineSettings(dtype="float32", max_model_len=576, seed=3), port=8123, served_name="grpo-s0"
    )
    joined = " ".join(argv)
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    for flag in (
        "--model /m",
        "--served-model-name grpo-s0",
        "--host 127.0.0.1",
        "--port 8123",
        "--dtype float32",
        "--max-model-len 576",
        "--enforce-eager",
        "--seed 3",
        "--enable-auto-tool-choice",
        "--tool-call-parser hermes",
    ):
        assert flag in joined


def test_the_server_environment_sets_the_kv_cache_and_drops_the_in_process_switch():
    env = server_env(
        EngineSettings(kv_cache_gib=2.4),
        {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "X": "y"},
    )
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2" and "VLLM_ENABLE_V1_MULTIPROCESSING" not in env
    assert env["X"] == "y"


def test_the_server_environment_preloads_one_openmp_runtime(monkeypatch, tmp_path):
    """libiomp5 replaces a libgomp an in-process vLLM engine put in LD_PRELOAD (vLLM refuses both)."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libiomp5.so").write_bytes(b"")
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    base = {"LD_PRELOAD": "/v/libs/libtcmalloc_minimal.so.4:/v/torch.libs/libgomp-a34b3233.so.1"}
    preload = server_env(EngineSettings(), base)["LD_PRELOAD"].split(":")
    assert preload == [str(tmp_path / "lib" / "libiomp5.so"), "/v/libs/libtcmalloc_minimal.so.4"]
    assert server_env(EngineSettings(), {})["LD_PRELOAD"] == str(tmp_path / "lib" / "libiomp5.so")


def test_a_server_that_exits_while_starting_names_its_log(tmp_path):
    argv = [sys.executable, "-c", "print('no such model'); raise SystemExit(3)"]
    server = VLLMServer(argv, port=free_port(), timeout=30, log_path=tmp_path / "log")
    with (
        pytest.raises(ServerError, match=r"exited with code 3 before answering \(log .*: no such model\)"),
        server,
    ):
        pass


def test_a_server_that_never_answers_times_out_and_is_stopped(tmp_path):
    port = free_port()
    server = VLLMServer([sys.executable, "-c", "import time; time.sleep(60)"], port=port, timeout=1.5)
    with (
        pytest.raises(ServerError, match=rf"the server at http://127.0.0.1:{port} did not answer within 2 s"),
        server,
    ):
        pass
    assert server.proc is None  # stopped


def test_a_port_in_use_is_refused_before_starting(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with (
            pytest.raises(ServerError, match=f"port {port} on 127.0.0.1 is in use"),
            VLLMServer([sys.executable, "-c", "pass"], port=port),
        ):
            pass


def test_stop_ends_the_whole_process_group(tmp_path):
    """A stand-in server that answers /health and has a child (as vLLM's API server has its engine)."""
    script = tmp_path / "srv.py"
    script.write_text(
        textwrap.dedent(
            """
            import subprocess, sys
            from http.server import BaseHTTPRequestHandler, HTTPServer
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
            class H(BaseHTTPRequestHandler):
                def do_GET(self):
                    self.send_response(200); self.end_headers()
                def log_message(self, *a): pass
            HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
            """
        )
    )
    port = free_port()
    progress = []
    with VLLMServer(
        [sys.executable, str(script), str(port)], port=port, timeout=30, progress=progress.append
    ) as s:
        pgid = s.proc.pid
        os.killpg(pgid, 0)  # alive
    assert progress[0].startswith(f"starting vLLM server on http://127.0.0.1:{port}")
    assert progress[-1].startswith("server is up after")
    time.sleep(0.5)
    assert live_group_members(pgid) == []  # the server and its child are gone
