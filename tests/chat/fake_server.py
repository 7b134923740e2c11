"""A fake OpenAI-compatible server (stdlib http.server in a thread) for the chat's unit tests.

It answers ``/health``, ``/v1/models`` and ``/v1/chat/completions`` the way vLLM's server with the
hermes parser would for a model that, to any question, calls the calculator on the numbers of the
question joined by ``*`` (parsed into ``tool_calls``) and, once a tool message is last, answers with
that message's content in ``<answer>`` tags. Every request body is kept in ``requests``.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeServer:
    def __init__(self) -> None:
        self.requests: list[dict] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def _send(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path == "/health":
                    self._send(200, {})
                elif self.path == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": "fake", "object": "model"}]})
                else:
                    self._send(404, {})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.requests.append(body)
                self._send(200, owner.reply(body["messages"]))

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @staticmethod
    def reply(messages: list[dict]) -> dict:
        last = messages[-1]
        if last["role"] == "tool":
            message = {
                "role": "assistant",
                "content": f"<answer>{last['content']}</answer>",
                "tool_calls": [],
            }
            finish = "stop"
        else:
            expression = " * ".join(re.findall(r"\d+", last["content"])) or "1"
            call = {
                "id": f"chatcmpl-tool-{len(messages)}",
                "type": "function",
                "function": {"name": "calculator", "arguments": json.dumps({"expression": expression})},
            }
            message, finish = {"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls"
        return {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": "fake",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }

    def __enter__(self) -> FakeServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
