"""ChatAgent's turn logic against a scripted OpenAI client: calls run by the real calculator, the
server's tool calls and the tool results sent back, malformed calls answered as training answers them."""

from __future__ import annotations

import json
from types import SimpleNamespace as NS

import httpx
import openai
import pytest

from components.chat import ChatAgent, ChatError, action_text
from components.envs import parse_tool_calls
from components.tasks.calc import make_env, tools


def _call(name: str, args: dict | str, call_id: str = "call-1") -> NS:
    arguments = args if isinstance(args, str) else json.dumps(args)
    return NS(id=call_id, type="function", function=NS(name=name, arguments=arguments))


def _reply(content: str | None = None, calls: list | None = None, finish: str = "stop") -> NS:
    return NS(choices=[NS(message=NS(content=content, tool_calls=calls or None), finish_reason=finish)])


class Script:
    """``client.chat.completions.create``: returns the scripted replies in order, records the requests."""

    def __init__(self, *replies) -> None:
        self.replies, self.requests = list(replies), []
        self.chat = NS(completions=NS(create=self.create))

    def create(self, **kw):
        self.requests.append(json.loads(json.dumps(kw)))
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply


def _agent(client, **kw) -> ChatAgent:
    return ChatAgent(client, "m", tools=tools(), make_env=make_env, url="http://127.0.0.1:1", **kw)


def test_tool_call_turn_runs_the_real_calculator_and_sends_the_result_back():
    client = Script(
        _reply(calls=[_call("calculator", {"expression": "12 * 35"}, "call-a")], finish="tool_calls"),
        _reply("<answer>420</answer>"),
    )
    events = []
    traj = _agent(client).ask("Ava has 12 bags of 35 apples.", answer="420", on_event=events.append)
    assert [(e.kind, e.text) for e in events] == [
        ("call", '{"expression": "12 * 35"}'),
        ("result", "420"),  # computed by the calculator: the script never says 420 before it is sent
        ("answer", "<answer>420</answer>"),
    ]
    first, second = client.requests
    assert first["tools"] == tools() and first["tool_choice"] == "auto" and first["temperature"] == 0.0
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    assert first["messages"][0]["content"].startswith("Solve the problem.")  # the task's system prompt
    assistant, tool = second["messages"][2:]
    assert assistant["tool_calls"][0]["id"] == "call-a"
    assert assistant["tool_calls"][0]["function"] == {
        "name": "calculator",
        "arguments": '{"expression": "12 * 35"}',
    }
    assert tool == {"role": "tool", "tool_call_id": "call-a", "name": "calculator", "content": "420"}
    assert traj["stop"] == "answer" and traj["final_answer"] == "420"
    assert traj["correct"] is True and traj["reward"] == 1.0
    assert traj["turns"][0]["results"] == [{"name": "calculator", "content": "420", "is_error": False}]
    json.dumps(traj)  # the batch mode writes it as JSON


def test_wrong_final_answer_is_scored_and_no_answer_means_unscored():
    client = Script(_reply("<answer>7</answer>"), _reply("<answer>7</answer>"))
    assert _agent(client).ask("q", answer="8")["correct"] is False
    traj = _agent(client).ask("q")
    assert traj["correct"] is None and traj["reward"] is None and traj["final_answer"] == "7"


def test_markup_the_server_could_not_parse_gets_the_training_env_feedback():
    bad = '<tool_call>\n{"name": "calculator", "arguments": {"expression": \n</tool_call>'
    client = Script(_reply(bad), _reply("<answer>1</answer>"))
    events = []
    traj = _agent(client).ask("q", on_event=events.append)
    assert events[0].kind == "call" and events[0].is_error and events[0].text == bad
    assert events[1].kind == "result" and events[1].is_error
    assert events[1].text.startswith("error: tool call is not valid JSON")
    sent = client.requests[1]["messages"]
    assert sent[2] == {"role": "assistant", "content": bad}  # the raw text goes back as the model wrote it
    assert sent[3]["role"] == "tool" and sent[3]["content"] == events[1].text
    assert traj["stop"] == "answer"


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (_call("search", {"query": "x"}), "unknown tool 'search'"),
        (_call("calculator", {"expr": "1 + 1"}), "invalid arguments for calculator"),
        (_call("calculator", '"1 + 1"'), "'arguments' of calculator is a string that is not a JSON object"),
        (_call("calculator", {"expression": "2 ** 99999"}), "error: "),  # the tool's own bound
    ],
)
def test_bad_calls_the_server_parsed_are_answered_with_errors(call, error):
    client = Script(_reply(calls=[call], finish="tool_calls"), _reply("<answer>1</answer>"))
    events = []
    _agent(client).ask("q", on_event=events.append)
    result = next(e for e in events if e.kind == "result")
    assert result.is_error and error in result.text


def test_turn_limit_ends_the_episode():
    calls = [
        _reply(calls=[_call("calculator", {"expression": "1 + 1"})], finish="tool_calls") for _ in range(3)
    ]
    events = []
    traj = _agent(Script(*calls), max_turns=3).ask("q", answer="2", on_event=events.append)
    assert traj["stop"] == "max_turns" and len(traj["turns"]) == 3 and traj["correct"] is False
    assert events[-1].kind == "stop" and "3 turns" in events[-1].text


def test_a_cut_response_is_not_executed():
    client = Script(_reply(calls=[_call("calculator", {"expression": "1 + 1"})], finish="length"))
    events = []
    traj = _agent(client).ask("q", on_event=events.append)
    assert traj["stop"] == "cut" and not [e for e in events if e.kind == "result"]
    assert "cut at 64 tokens" in events[-1].text


def test_a_refused_request_ends_the_question_without_a_crash():
    response = httpx.Response(400, request=httpx.Request("POST", "http://127.0.0.1:1/v1/chat/completions"))
    refusal = openai.BadRequestError("maximum context length is 576 tokens", response=response, body=None)
    traj = _agent(Script(refusal)).ask("q")
    assert traj["stop"] == "refused" and "576" in traj["error"]


def test_a_server_that_stops_answering_is_a_chat_error_naming_the_url():
    gone = openai.APIConnectionError(request=httpx.Request("POST", "http://127.0.0.1:1/v1/chat/completions"))
    with pytest.raises(ChatError, match=r"http://127.0.0.1:1 stopped answering"):
        _agent(Script(gone)).ask("q")


def test_action_text_is_what_the_parser_reads_back():
    message = NS(content="Let me compute.", tool_calls=[_call("calculator", {"expression": "5 * 12"})])
    text = action_text(message)
    assert (
        text
        == 'Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "5 * 12"}}\n</tool_call>'
    )
    parsed = parse_tool_calls(text, tools())
    assert [(c.name, c.arguments) for c in parsed.valid_calls] == [("calculator", {"expression": "5 * 12"})]
    assert action_text(NS(content="<answer>3</answer>", tool_calls=None)) == "<answer>3</answer>"
