"""flows.chat against a fake OpenAI-compatible server (--server): batch mode writes the trajectories,
interactive mode prints each call and result as it happens."""

from __future__ import annotations

import io
import json

import flows.chat as chat
from tests.chat.fake_server import FakeServer


def test_batch_mode_writes_one_trajectory_per_question(tmp_path, capsys):
    questions = tmp_path / "q.jsonl"
    questions.write_text(
        '{"question": "What is 6 times 7?", "answer": 42}\n{"question": "And 3 times 5?", "id": "b"}\n'
    )
    out = tmp_path / "t.jsonl"
    with FakeServer() as server:
        rc = chat.main(["--server", server.url, "--questions", str(questions), "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["1", "b"]
    first = rows[0]
    assert first["stop"] == "answer" and first["final_answer"] == "42" and first["correct"] is True
    assert first["turns"][0]["server_tool_calls"] == [
        {"name": "calculator", "arguments": '{"expression": "6 * 7"}'}
    ]
    assert first["turns"][0]["results"][0]["content"] == "42"
    assert [m["role"] for m in first["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert rows[1]["final_answer"] == "15" and rows[1]["correct"] is None
    printed = capsys.readouterr().out
    assert "wrote 2 trajectories" in printed and "1/1 correct" in printed
    # the server got the task's tools and the tool result under the call's id
    req = server.requests[1]
    assert req["tools"][0]["function"]["name"] == "calculator"
    assert req["messages"][3]["tool_call_id"] == req["messages"][2]["tool_calls"][0]["id"]


def test_interactive_mode_prints_calls_and_results(monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("What is 12 times 3?\n\n/quit\nnever asked\n"))
    with FakeServer() as server:
        assert chat.main(["--server", server.url]) == 0
    out = capsys.readouterr().out
    assert "you> What is 12 times 3?" in out
    assert '  call:   calculator {"expression": "12 * 3"}' in out
    assert "  result: 36" in out
    assert "agent> <answer>36</answer>   (answer: 36)" in out
    assert "never asked" not in out and len(server.requests) == 2
