"""steprl's sokoban task as a verifiers environment (environments/steprl-sokoban), loaded through
verifiers' own loader (the id ``steprl-sokoban``, as ``vf-eval`` resolves it) and played for one
episode by a scripted model behind an OpenAI-compatible endpoint: a bad move first (the model's next
request carries the task's feedback), then the solver's moves, which reach steprl's reward."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import verifiers.v1 as vf
from verifiers.v1.utils.loaders import harness_class

from components.envs.registry import get_task

ROOT = Path(__file__).resolve().parents[3]
SHORT = {"min_moves": 1, "max_moves": 1}  # tasks.sokoban params of the levels played here


@contextmanager
def scripted_model(policy: Callable[[list[dict]], str]) -> Iterator[tuple[str, list[list[dict]]]]:
    """An OpenAI-compatible chat endpoint whose reply is ``policy(messages)`` (streamed when asked);
    yields its base URL and the messages of every request it got."""
    seen: list[list[dict]] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            seen.append(body["messages"])
            text = policy(body["messages"])
            usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
            head = {"id": f"c{len(seen)}", "created": 0, "model": body.get("model", "scripted")}
            if body.get("stream"):
                chunks = [
                    {"choices": [{"index": 0, "delta": {"role": "assistant", "content": text}}]},
                    {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
                    {"choices": [], "usage": usage},
                ]
                data = "".join(
                    f"data: {json.dumps({**head, 'object': 'chat.completion.chunk', **c})}\n\n"
                    for c in chunks
                )
                payload, kind = (data + "data: [DONE]\n\n").encode(), "text/event-stream"
            else:
                message = {"role": "assistant", "content": text}
                reply = {**head, "object": "chat.completion", "usage": usage,
                         "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}  # fmt: skip
                payload, kind = json.dumps(reply).encode(), "application/json"
            self.send_response(200)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/v1", seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def env():
    # what `uv pip install -e environments/steprl-sokoban` makes importable
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(ROOT / "environments" / "steprl-sokoban"))
        mp.setenv("STEPRL_TEST_KEY", "not-a-secret")
        # one-move levels: verifiers' chat program starts once per model turn (seconds each)
        taskset = {"id": "steprl-sokoban", "size": 3, "seed": 0, "params": SHORT}
        config = vf.resolve_env_config({"taskset": taskset})
        yield vf.load_environment(config)


def test_loaded_by_verifiers_loader(env):
    # verifiers found the package's classes by the id (module steprl_sokoban, its __all__)
    assert (type(env).__module__, type(env).__name__) == ("steprl_sokoban", "SokobanEnv")
    assert type(env.taskset).__name__ == "SokobanTaskset"
    # the seat's default harness is the package's own
    assert env.config.agent_harnesses()["player"].id == "steprl-sokoban"
    assert harness_class("steprl-sokoban").__name__ == "SokobanHarness"
    tasks = list(env.taskset)
    assert len(tasks) == 3
    # the prompt is what steprl's environment shows at reset; the rows are steprl's generated split
    splits = get_task("sokoban").prepare(SHORT, seed=0, n_train=1, n_val=1, n_test=3)
    assert [t.data.row["level"] for t in tasks] == list(splits["test"]["level"])
    assert tasks[0].data.prompt == splits["test"]["question"][0]


def test_a_scripted_episode_reaches_the_reward_and_a_bad_move_gets_feedback(env):
    task = next(iter(env.taskset))
    moves = task.data.row["answer"].split()

    def policy(messages: list[dict]) -> str:
        turn = sum(m["role"] == "assistant" for m in messages)
        return (
            "I push the box with <action>jump</action>"
            if turn == 0
            else f"<action>{moves[turn - 1]}</action>"
        )

    with scripted_model(policy) as (url, seen):
        client = {"base_url": url, "api_key_var": "STEPRL_TEST_KEY"}
        ctx = vf.ModelContext(model="scripted", client=vf.EvalClientConfig(**client))

        async def play():
            async with env.serving():
                return await env.run_episode(task, ctx)

        episode = asyncio.run(play())
    assert not episode.errors, episode.errors
    (trace,) = episode.traces
    # steprl's own environment on the same replies gives the return the trace was rewarded
    steprl_env = env.taskset.make_env()
    steprl_env.reset(task.data.row)
    replies = [policy([{"role": "assistant"}] * k) for k in range(len(moves) + 1)]
    expected = sum(steprl_env.step(r).reward for r in replies)
    assert trace.rewards["return"].score == pytest.approx(expected)
    assert expected > 10 - 0.1 * (len(moves) + 1) - 1e-9  # the success bonus is in it
    assert trace.metrics["success"] == 1.0
    assert trace.metrics["steps"] == len(moves) + 1 and trace.metrics["invalid_actions"] == 1
    # the model's second request ends with the task's feedback on the bad move, then the grid
    assert len(seen) == len(moves) + 1
    feedback = seen[1][-1]
    assert feedback["role"] == "user" and feedback["content"].startswith(
        "Invalid action: unknown action 'jump'"
    )
    assert seen[0][0]["role"] == "system" and "Sokoban" in seen[0][0]["content"]
