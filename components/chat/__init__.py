"""Talk to a trained agent: a checkpoint served by vLLM's OpenAI-compatible server, the task's real tools.

- ``checkpoint``: which directory ``--model`` names, and whether it is an HF checkpoint with a chat template.
- ``server``: start ``vllm``'s OpenAI-compatible server on 127.0.0.1 (tool calling on, the parser of `rollout.tool_parser`),
  wait for ``/health``, stop it (process group) on exit.
- ``agent``: one question = one episode: the task's system prompt and tool schemas go to
  ``/v1/chat/completions``, the server parses the tool calls, the task's own environment runs them
  (with its limits and its feedback for malformed calls) until the model answers or the turn limit.
- ``questions``: the batch mode's jsonl of questions, each line validated.

Nothing here imports Prefect or MLflow or reads params.yaml; ``flows/chat.py`` does the wiring.
"""

from components.chat.agent import ChatAgent, ChatError, Event, action_text
from components.chat.checkpoint import resolve_model
from components.chat.questions import read_questions
from components.chat.server import ServerError, VLLMServer, check_server, port_free, vllm_command

__all__ = [
    "ChatAgent",
    "ChatError",
    "Event",
    "ServerError",
    "VLLMServer",
    "action_text",
    "check_server",
    "port_free",
    "read_questions",
    "resolve_model",
    "vllm_command",
]
