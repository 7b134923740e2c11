"""The chat against a real `vllm` OpenAI-compatible server on CPU (tool calling on, hermes parser).

The served model is a tiny model that memorised two conversations (tests/chat/chat_helpers.py), so
this proves the mechanics with real vLLM output, not a model's skill: the server starts from the
command flows.chat builds and answers /health; the model's ``<tool_call>`` is parsed BY THE SERVER
into ``tool_calls``; the real calculator runs it; its result goes back as a tool message the server's
chat template renders (the model's next turn, ``<answer>42</answer>``, only follows that exact
context); a broken ``<tool_call>`` comes back unparsed and gets the training env's error message;
the server is stopped at the end (its process group is gone).
"""

from __future__ import annotations

import time

import openai
import pytest

from components.chat import ChatAgent, VLLMServer, vllm_command
from components.chat.server import free_port, server_env
from components.rollout import EngineSettings
from components.tasks.calc import make_env, tools
from tests.chat.chat_helpers import (
    BAD_Q,
    BAD_TEXT,
    GOOD_CALL,
    GOOD_Q,
    build_memorising_model,
    live_group_members,
)

# In the default run (about 100 s on 2 shared cores): the only test of the chat against a real server.
pytestmark = pytest.mark.vllm


def _bad_feedback() -> str:
    env = make_env()
    env.reset({"question": BAD_Q, "answer": ""})
    return env.step(BAD_TEXT).messages[0]["content"]


def test_a_served_model_s_tool_call_is_parsed_by_the_server_and_answered_by_the_calculator(tmp_path):
    model_dir, steps = build_memorising_model(tmp_path / "m", _bad_feedback())
    port = free_port()
    argv = vllm_command(model_dir, EngineSettings(max_model_len=512), port=port, served_name="mem")
    server = VLLMServer(
        argv,
        port=port,
        env=server_env(EngineSettings(kv_cache_gib=1.0)),
        timeout=400,
        log_path=tmp_path / "vllm.log",
    )
    with server:
        pid = server.proc.pid
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="EMPTY", max_retries=0, timeout=120)
        agent = ChatAgent(client, "mem", tools=tools(), make_env=make_env, max_turns=3, url=server.url)
        good = agent.ask(GOOD_Q, answer="42")
        bad = agent.ask(BAD_Q)
    print(f"memorised in {steps} steps; good: {good['turns']}; bad: {bad['turns']}")

    first = good["turns"][0]
    assert first["finish_reason"] == "tool_calls"
    assert first["server_tool_calls"] == [{"name": "calculator", "arguments": GOOD_CALL}]
    assert first["results"] == [{"name": "calculator", "content": "42", "is_error": False}]
    assert good["stop"] == "answer" and good["final_answer"] == "42" and good["correct"] is True

    turn = bad["turns"][0]
    assert turn["server_tool_calls"] == [] and "<tool_call>" in turn["text"]
    assert turn["results"][0]["is_error"] and turn["results"][0]["content"].startswith(
        "error: tool call is not valid JSON"
    )
    assert bad["stop"] == "answer" and bad["final_answer"] == "0"

    time.sleep(0.5)
    assert live_group_members(pid) == []  # the server's whole process group is gone
