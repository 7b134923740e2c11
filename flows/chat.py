"""`python -m flows.chat`: talk to a trained agent, with the task's real tools.

Serves a checkpoint with vLLM's OpenAI-compatible server (tool calling on, parser ``rollout.tool_parser``, bound to
127.0.0.1; ``components.chat.server``), or uses a running one (``--server URL``), and asks it
questions as the training rollout did (``components.chat.agent``): the task's system prompt and tool
schemas, each tool call run by the task's environment and printed as it happens, up to
``rollout.max_steps`` agent turns, greedy. Interactive by default (one question per line, each a fresh
episode, as in training); ``--questions q.jsonl --out t.jsonl`` answers a file and writes the
trajectories. Not a pipeline stage: no Prefect flow, no MLflow run.

The task is ``--task``, else params.yaml's ``task`` (checkpoints do not record the task they were
trained on). Bad input (a model directory that is not a checkpoint, an unknown task, missing task
data, a bad questions file, a port in use, a server that does not answer) is one ``error:`` line and
exit code 2. See docs/chat.md.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from components.chat import (
    ChatAgent,
    ChatError,
    Event,
    ServerError,
    VLLMServer,
    read_questions,
    resolve_model,
)
from components.chat.server import free_port, port_free, server_env, vllm_command
from components.config import ConfigError, load_params
from components.envs.registry import TASKS, UnknownNameError, get_task
from components.envs.tool_formats import check_chat_template
from flows import REPO, processed


class UsageError(Exception):
    """Bad input: one line for the user."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m flows.chat", description=__doc__.split("\n")[0])
    p.add_argument("--model", help="checkpoint directory or run name (grpo-s0 -> models/grpo-s0/final, sft)")
    p.add_argument("--server", help="URL of a running OpenAI-compatible server (then nothing is started)")
    p.add_argument("--task", help="task whose prompt and tools to use (default: params.yaml's task)")
    p.add_argument(
        "--params", default="params.yaml", help="params file for the defaults (default params.yaml)"
    )
    p.add_argument("--port", type=int, help="port for the started server on 127.0.0.1 (default: a free one)")
    p.add_argument("--max-turns", type=int, help="agent turns per question (default rollout.max_steps)")
    p.add_argument("--max-tokens", type=int, help="tokens per response (default rollout.max_response_len)")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    p.add_argument(
        "--timeout", type=float, default=300.0, help="seconds to wait for the server (default 300)"
    )
    p.add_argument("--questions", help='batch mode: jsonl of {"question": ...} (optional answer, id)')
    p.add_argument("--out", help="batch mode: jsonl file the trajectories are written to")
    p.add_argument("--quiet", action="store_true", help="batch mode: print only one line per question")
    return p.parse_args(argv)


def _positive(name: str, value: int | float | None) -> None:
    if value is not None and value <= 0:
        raise UsageError(f"{name} must be positive, got {value}")


def check_args(args: argparse.Namespace) -> None:
    """Argument combinations that cannot work, before anything is loaded."""
    if not args.model and not args.server:
        raise UsageError("give --model (a checkpoint directory or run name) or --server URL")
    if args.model and args.server:
        raise UsageError("give --model or --server, not both (--server uses the model that server serves)")
    if bool(args.questions) != bool(args.out):
        raise UsageError("batch mode needs both --questions and --out")
    for name in ("max_turns", "max_tokens", "timeout"):
        _positive(f"--{name.replace('_', '-')}", getattr(args, name))
    if args.temperature < 0:
        raise UsageError(f"--temperature must be >= 0, got {args.temperature}")
    if args.port is not None and not 1 <= args.port <= 65535:
        raise UsageError(f"--port must be in 1..65535, got {args.port}")


def task_recipe(name: str) -> Any:
    """The registered task ``name`` that has tools; UsageError listing the known ones."""
    try:
        recipe = get_task(name)
    except UnknownNameError:
        raise UsageError(f"unknown task {name!r}; known tasks: {', '.join(TASKS.names())}") from None
    if not recipe.tools():
        raise UsageError(f"task {name!r} has no tools (its actions are plain text); chat needs a tool task")
    return recipe


def env_factory(recipe: Any, data_dir: Path, tool_parser: str = "hermes"):
    """``make_env()`` of the task over its prepared data; built once here so missing data fails now."""

    def make_env():
        return recipe.make_env(data_dir=data_dir, tool_parser=tool_parser)

    try:
        make_env()
    except Exception as err:  # e.g. search's index missing: the task's own message
        raise UsageError(
            f"task {recipe.name!r} cannot build its environment from {data_dir}: {err} "
            f"(prepare it with `python -m flows.prepare` and task: {recipe.name} in params.yaml)"
        ) from None
    return make_env


def show(event: Event, out: TextIO | None = None) -> None:
    """One line per event: calls and results as they happen, then the answer."""
    flag = "  [error]" if event.is_error and event.kind == "result" else ""
    if event.kind == "text":
        line = f"  agent:  {event.text}"
    elif event.kind == "call":
        line = f"  call:   {event.name} {event.text}"
    elif event.kind == "result":
        line = f"  result: {event.text}{flag}"
    elif event.kind == "answer":
        line = f"agent> {event.text}" + (
            f"   (answer: {event.name})" if event.name else "   (no <answer> tag)"
        )
    else:
        line = f"agent> {event.text}"
    print(line, file=out or sys.stdout, flush=True)


def questions_from(stream: TextIO) -> Iterator[str]:
    """Lines typed (or piped) on ``stream``; piped ones are echoed so a transcript shows them."""
    tty = stream.isatty()
    while True:
        if tty:
            try:
                line = input("you> ")
            except EOFError:
                print()
                return
        else:
            line = stream.readline()
            if not line:
                return
            if line.strip():
                print(f"you> {line.strip()}", flush=True)
        line = line.strip()
        if line in ("/quit", "/exit", "exit", "quit"):
            return
        if line:
            yield line


def interactive(agent: ChatAgent) -> None:
    print("Ask a question (one line; each is a fresh episode). Ctrl-D or /quit ends.", flush=True)
    for question in questions_from(sys.stdin):
        agent.ask(question, on_event=show)


def batch(agent: ChatAgent, rows: list[dict], out_path: Path, quiet: bool) -> None:
    n_correct = n_scored = 0
    with open(out_path, "w", encoding="utf-8") as out:
        for i, row in enumerate(rows, 1):
            if not quiet:
                print(f"[{i}/{len(rows)}] you> {row['question']}", flush=True)
            traj = agent.ask(row["question"], answer=row["answer"], on_event=None if quiet else show)
            out.write(json.dumps({"id": row["id"], **traj}, ensure_ascii=False) + "\n")
            out.flush()
            if traj["correct"] is not None:
                n_scored, n_correct = n_scored + 1, n_correct + traj["correct"]
            if quiet:
                print(f"[{i}/{len(rows)}] {row['id']}: {traj['stop']} {traj['final_answer']!r}", flush=True)
    score = f"; {n_correct}/{n_scored} correct" if n_scored else ""
    print(f"wrote {len(rows)} trajectories to {out_path}{score}", flush=True)


def run(args: argparse.Namespace) -> int:
    check_args(args)
    params = load_params(args.params)
    recipe = task_recipe(args.task or params.task)
    make_env = env_factory(recipe, processed(recipe.name), params.rollout.tool_parser)
    rows = read_questions(args.questions) if args.questions else None
    out_path = Path(args.out) if args.out else None
    if out_path is not None and not out_path.parent.is_dir():
        raise UsageError(f"--out {out_path}: directory {out_path.parent} does not exist")
    r = params.rollout

    import openai

    def agent_for(url: str, model: str) -> ChatAgent:
        client = openai.OpenAI(base_url=f"{url.rstrip('/')}/v1", api_key="EMPTY", max_retries=0, timeout=120)
        return ChatAgent(
            client,
            model,
            tools=recipe.tools(),
            make_env=make_env,
            max_turns=args.max_turns or r.max_steps,
            max_tokens=args.max_tokens or r.max_response_len,
            temperature=args.temperature,
            url=url,
            tool_parser=r.tool_parser,
        )

    def go(agent: ChatAgent) -> int:
        print(
            f"task {recipe.name}, model {agent.model} at {agent.url}, up to {agent.max_turns} turns",
            flush=True,
        )
        if rows is not None:
            batch(agent, rows, out_path, args.quiet)
        else:
            interactive(agent)
        return 0

    if args.server:
        from components.chat import check_server

        names = check_server(args.server)
        return go(agent_for(args.server, names[0] if names else "default"))
    model_dir = resolve_model(args.model, REPO / "models")
    port = args.port or free_port()
    if not port_free(port):
        raise UsageError(f"port {port} on 127.0.0.1 is in use; choose another with --port")
    name = model_dir.parent.name if model_dir.name == "final" else model_dir.name
    from transformers import AutoTokenizer

    check_chat_template(AutoTokenizer.from_pretrained(model_dir), r.tool_parser)  # before the server starts
    settings = r.engine_settings(params.seed)
    argv = vllm_command(model_dir, settings, port=port, served_name=name, tool_parser=r.tool_parser)
    progress = lambda msg: print(msg, flush=True)  # noqa: E731
    with VLLMServer(argv, port=port, env=server_env(settings), timeout=args.timeout, progress=progress) as s:
        try:
            return go(agent_for(s.url, name))
        finally:
            print("stopping the server", flush=True)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds the server's `with`: it is stopped
    try:
        return run(parse_args(argv))
    except (UsageError, ConfigError, ServerError, ChatError, ValueError) as err:
        for line in str(err).splitlines() or [type(err).__name__]:  # a ConfigError: one line per problem
            print(f"error: {line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
