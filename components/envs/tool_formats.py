"""Tool-call formats by model family: how a model writes a call, and how steprl reads it back.

``TOOL_PARSERS`` maps a name (``rollout.tool_parser``; the name ``vllm serve --tool-call-parser`` takes)
to a :class:`ToolCallFormat`, and every entry has the same four parts:

- ``parse(text, tools, *, max_chars, max_calls) -> ParsedAction``: the calls in a model's response,
  each a ``ToolCall`` or a ``CallError`` whose message is feedback for the model; never raises;
- ``format_call(name, arguments) -> str``: the text a model of the family writes for one call (SFT
  demonstrations, the chat CLI's write-back); several calls in one turn are joined by ``"\\n"``;
- ``call_jinja``: the same call as a Jinja fragment of the embedded chat template
  (:func:`components.model.tokenizer.chat_template`), rendering ``fn.name`` and ``fn.arguments``;
- ``added_tokens``: markers the embedded tokenizer gets as single tokens (vLLM's parsers look them up
  in the tokenizer's vocabulary and refuse to start without them).

Formats:

============  ===============================================================  ======================
name          a call                                                           parser
============  ===============================================================  ======================
hermes        ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``  steprl's own (parsing)
llama3_json   ``{"name": ..., "parameters": {...}}`` (Llama 3.1-3.3, 4)          vLLM Llama3JsonToolParser
mistral       ``[TOOL_CALLS]name[ARGS]{...}`` (Mistral tokenizers v11+)          vLLM MistralToolParser
qwen3_xml     ``<tool_call>\\n<function=name>\\n<parameter=k>\\nv\\n</parameter>``  vLLM Qwen3EngineToolParser
qwen3_coder   the same format and class under vLLM's other name
============  ===============================================================  ======================

hermes keeps steprl's own parser because it is stricter than vLLM's Hermes2ProToolParser: vLLM's
reads a ``<tool_call>`` whose ``</tool_call>`` is missing and returns a call with malformed JSON as
plain content (a final answer); steprl's answers both with feedback, and it is the embedded default
that every result so far was measured with.

Around vLLM's parsers (the project's rules for model output):
1. The text is cut to ``max_chars`` before vLLM sees it, and at most ``max_calls`` calls are kept.
2. Anything a parser raises (they raise on missing marker tokens, partial JSON, regex timeouts, and
   gpt-oss's stub raises NotImplementedError) becomes a ``CallError``; a parse runs in a daemon thread
   bounded by ``PARSE_TIMEOUT_S`` (an overrun is reported and abandoned, as a tool's is).
3. Text without the format's call markup (``looks_like_call``: ``[TOOL_CALLS]``, ``<tool_call>`` or
   ``<function=``, or for llama3_json a response that starts with ``{`` or holds ``<|python_tag|>``)
   is a final answer and never reaches vLLM (vLLM's Llama parser would also read a JSON call in the
   middle of prose). vLLM answers a call it cannot read by returning the text as content; here text
   with the markup but no readable call is a ``CallError``, so a malformed call is feedback to the
   agent, as with hermes, not a final answer.
4. Each call's name and arguments pass :func:`components.envs.parsing.check_call` (JSON object,
   known tool, arguments valid against the tool's schema), as hermes calls do.
5. vLLM's parsers are built with a bytes-only tokenizer that holds the format's markers, so the
   dialect is fixed by the format (Mistral's v11 ``[ARGS]`` form), not by the policy's tokenizer;
   a model whose chat template writes another dialect is caught by :func:`check_chat_template`.

Refused: ``openai`` (gpt-oss, harmony): vLLM's GptOssToolParser is a stub whose ``extract_tool_calls``
raises NotImplementedError; harmony output is parsed from token ids of gpt-oss's own tokenizer, not
from text. Other vLLM names (``pythonic``, ``deepseek_v3``, ...) are not registered yet: each needs a
writer and a template fragment, and a round-trip test.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any

from components.envs.parsing import (
    CallError,
    ParsedAction,
    ToolCall,
    check_call,
    format_tool_call,
    short,
    tool_validators,
)
from components.envs.parsing import parse_tool_calls as parse_hermes
from components.registry import Registry

__all__ = ["PARSE_TIMEOUT_S", "TOOL_PARSERS", "ToolCallFormat", "check_chat_template", "get_format"]

# The longest one vLLM parse may take (s); a longer one is reported as an error and abandoned.
PARSE_TIMEOUT_S = 2.0
# The arguments expression every fragment renders: a JSON string as given, a mapping as JSON.
_ARGS_JINJA = "(fn.arguments if fn.arguments is string else fn.arguments | tojson)"


@dataclass(frozen=True)
class ToolCallFormat:
    name: str
    parse: Callable[..., ParsedAction]  # (text, tools=None, *, max_chars, max_calls) -> ParsedAction
    format_call: Callable[[str, dict[str, Any]], str]
    call_jinja: str
    added_tokens: tuple[str, ...] = ()
    example: str = ""  # one call in words, for feedback

    def prepare(self) -> None:
        """Load what ``parse`` needs (vLLM's parser: an import of seconds); a no-op for hermes."""
        getattr(self.parse, "prepare", lambda: None)()


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)  # what the chat template's tojson writes


# --- writers (each the Python twin of its call_jinja; tests/envs/test_tool_formats.py checks both) ---


def _llama3_call(name: str, arguments: dict[str, Any]) -> str:
    return _json({"name": name, "parameters": arguments})


def _mistral_call(name: str, arguments: dict[str, Any]) -> str:
    return f"[TOOL_CALLS]{name}[ARGS]{_json(arguments)}"


def _qwen3_xml_call(name: str, arguments: dict[str, Any]) -> str:
    params = "".join(
        f"<parameter={k}>\n{v if isinstance(v, str) else _json(v)}\n</parameter>\n"
        for k, v in arguments.items()
    )
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


_HERMES_JINJA = (
    "{{- '\\n<tool_call>\\n{\"name\": ' + (fn.name | tojson) + ', \"arguments\": ' -}}"
    "{%- if fn.arguments is string -%}{{- fn.arguments -}}{%- else -%}{{- fn.arguments | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
)
_LLAMA3_JINJA = (
    "{{- '\\n{\"name\": ' + (fn.name | tojson) + ', \"parameters\": ' + " + _ARGS_JINJA + " + '}' -}}"
)
_MISTRAL_JINJA = "{{- '\\n[TOOL_CALLS]' + fn.name + '[ARGS]' + " + _ARGS_JINJA + " -}}"
_QWEN3_XML_JINJA = (
    "{{- '\\n<tool_call>\\n<function=' + fn.name + '>\\n' -}}"
    "{%- if fn.arguments is mapping -%}{%- for key, value in fn.arguments.items() -%}"
    "{{- '<parameter=' + key + '>\\n' + (value if value is string else value | tojson) + '\\n</parameter>\\n' -}}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '</function>\\n</tool_call>' -}}"
)


# --- vLLM-backed readers ---


class _Overrun(Exception):
    pass


def _bounded(fn: Callable[[], Any], timeout_s: float) -> Any:
    """``fn()`` in a daemon thread; its result, or its exception re-raised, or _Overrun past timeout_s."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = fn()
        except BaseException as err:  # a parser's failure is the model's feedback
            box["error"] = err

    worker = threading.Thread(target=target, name="tool-parse", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise _Overrun(f"reading the tool call took more than {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box.get("result")


@cache
def _marker_tokenizer(name: str) -> Any:
    """A byte-level tokenizer holding format ``name``'s markers: vLLM's parsers read its vocabulary
    only (which markers exist: Mistral's ``[ARGS]`` selects its v11 dialect), never its merges."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(sorted(alphabet))}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in get_format(name).added_tokens])
    return PreTrainedTokenizerFast(tokenizer_object=tok)


@lru_cache(maxsize=64)
def _request(tools_json: str) -> Any:
    """A chat request carrying the tools (vLLM's parsers type the arguments by the tools' schemas)."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    tools = json.loads(tools_json)
    return ChatCompletionRequest(
        model="steprl", messages=[{"role": "user", "content": ""}], tools=tools or None
    )


@cache
def _parser_class(vllm_name: str) -> type:
    from vllm.tool_parsers import ToolParserManager

    for logger in ("vllm.tool_parsers", "vllm.parser"):
        # they log a traceback for every call they cannot read; here that call is the model's feedback
        logging.getLogger(logger).setLevel(logging.CRITICAL)
    return ToolParserManager.get_tool_parser(vllm_name)


@dataclass(frozen=True)
class _VllmReader:
    """Format ``name`` read by vLLM's parser class ``vllm_name`` (see the module docstring, 1-5)."""

    name: str
    vllm_name: str
    looks_like_call: Callable[[str], bool]  # the text carries this format's call markup
    example: str

    def _parser(self, tools: Sequence[dict] | None) -> tuple[Any, Any]:
        """A fresh vLLM parser (they keep streaming state) and its request; the first call imports
        vLLM (seconds), outside the parse's time bound."""
        request = _request(json.dumps(list(tools or []), sort_keys=True))
        return _parser_class(self.vllm_name)(_marker_tokenizer(self.name), request.tools), request

    def prepare(self) -> None:
        """Import vLLM and build the parser once (seconds), so no episode's first step waits for it."""
        self._parser(None)

    @staticmethod
    def _extract(parser: Any, request: Any, head: str) -> list[tuple[object, object]]:
        info = parser.extract_tool_calls(head, request)
        if not getattr(info, "tools_called", False):
            return []
        return [(c.function.name, c.function.arguments) for c in info.tool_calls]

    def __call__(
        self, text: str, tools: Sequence[dict] | None = None, *, max_chars: int = 16_384, max_calls: int = 8
    ) -> ParsedAction:
        text = "" if text is None else str(text)
        truncated = len(text) > max_chars
        head = text[:max_chars]
        if not self.looks_like_call(head):
            return ParsedAction(calls=(), is_final=True, truncated=truncated, text=head)
        validators = tool_validators(tools) if tools is not None else None  # a bad schema raises
        try:
            parser, request = self._parser(tools)
            found = _bounded(lambda: self._extract(parser, request, head), PARSE_TIMEOUT_S)
        except Exception as err:  # see the module docstring, 2
            calls: list[ToolCall | CallError] = [
                CallError(f"could not read the tool call: {type(err).__name__}: {short(err)}; {self.example}")
            ]
            return ParsedAction(calls=tuple(calls), is_final=False, truncated=truncated, text=head)
        if not found:
            cut = " (the response was cut)" if truncated else ""
            calls = [
                CallError(f"found {self.name} tool-call markup but no readable call{cut}; {self.example}")
            ]
            return ParsedAction(calls=tuple(calls), is_final=False, truncated=truncated, text=head)
        calls = [check_call(name, args, validators) for name, args in found[:max_calls]]
        if len(found) > max_calls:
            calls.append(
                CallError(f"too many tool calls in one turn (at most {max_calls}); the rest were ignored")
            )
        return ParsedAction(calls=tuple(calls), is_final=False, truncated=truncated, text=head)


def _llama3_marked(text: str) -> bool:
    return "<|python_tag|>" in text or text.lstrip().startswith("{")


TOOL_PARSERS: Registry[ToolCallFormat] = Registry("tool parser")


def _register(fmt: ToolCallFormat) -> None:
    TOOL_PARSERS.register(fmt.name, fmt)


_register(
    ToolCallFormat(
        "hermes",
        parse_hermes,
        format_tool_call,
        _HERMES_JINJA,
        example='write <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>',
    )
)
_LLAMA3_EXAMPLE = 'write {"name": ..., "parameters": {...}}'
_register(
    ToolCallFormat(
        "llama3_json",
        _VllmReader("llama3_json", "llama3_json", _llama3_marked, _LLAMA3_EXAMPLE),
        _llama3_call,
        _LLAMA3_JINJA,
        added_tokens=("<|python_tag|>",),
        example=_LLAMA3_EXAMPLE,
    )
)
_MISTRAL_EXAMPLE = "write [TOOL_CALLS]name[ARGS]{...arguments as JSON...}"
_register(
    ToolCallFormat(
        "mistral",
        _VllmReader("mistral", "mistral", lambda t: "[TOOL_CALLS]" in t, _MISTRAL_EXAMPLE),
        _mistral_call,
        _MISTRAL_JINJA,
        added_tokens=("[TOOL_CALLS]", "[ARGS]"),
        example=_MISTRAL_EXAMPLE,
    )
)
_QWEN3_EXAMPLE = (
    "write <tool_call>\n<function=name>\n<parameter=key>\nvalue\n</parameter>\n</function>\n</tool_call>"
)
for _name in ("qwen3_xml", "qwen3_coder"):
    _register(
        ToolCallFormat(
            _name,
            _VllmReader(_name, _name, lambda t: "<tool_call>" in t or "<function=" in t, _QWEN3_EXAMPLE),
            _qwen3_xml_call,
            _QWEN3_XML_JINJA,
            example=_QWEN3_EXAMPLE,
        )
    )


def get_format(name: str) -> ToolCallFormat:
    """The format registered as ``name``; an unknown name raises UnknownNameError listing the known ones."""
    return TOOL_PARSERS.get(name)


_PROBE_ARGS = {"expression": "12 * (3 + 4)", "n": 7}
_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "probe_tool",
        "description": "a probe",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}, "n": {"type": "integer"}},
            "required": ["expression"],
        },
    },
}


def check_chat_template(tokenizer: Any, name: str, *, tools: bool = True) -> None:
    """Raise ``ValueError`` unless ``tokenizer`` has a chat template that renders a conversation (every
    prompt and reply is rendered with it) and, with ``tools`` (the task has tools), shows the model
    the tool list and renders an assistant tool call as text parser ``name`` reads back as the same
    call (SFT writes demonstrations with the template; the rollout reads them with the parser). The
    message says which of these fails: no chat template, a template without tool support (it ignores
    ``tools=`` or drops the call), or a call in another family's format."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "the model's tokenizer has no chat template (tokenizer.chat_template is unset): steprl "
            "renders every prompt and reply with it; use a chat (instruct) model's directory, or add a "
            "chat_template to its tokenizer_config.json"
        )
    messages = [{"role": "user", "content": "probe"}]
    if not tools:
        try:
            tokenizer.apply_chat_template(
                messages + [{"role": "assistant", "content": "reply"}], tokenize=False
            )
        except Exception as err:
            raise ValueError(
                f"the model's chat template cannot render a user and an assistant turn "
                f"({type(err).__name__}: {short(err)})"
            ) from None
        return
    fmt = get_format(name)
    call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "probe_tool", "arguments": _PROBE_ARGS}}],
    }
    try:
        before = tokenizer.apply_chat_template(
            messages, tools=[_PROBE_TOOL], tokenize=False, add_generation_prompt=True
        )
        bare = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        after = tokenizer.apply_chat_template(messages + [call], tools=[_PROBE_TOOL], tokenize=False)
    except Exception as err:  # a template that cannot render a tool call at all
        raise ValueError(
            f"rollout.tool_parser={name!r}: the model's chat template cannot render an assistant tool "
            f"call ({type(err).__name__}: {short(err)})"
        ) from None
    if before == bare:
        raise ValueError(
            "the model's chat template has no tool support: it renders the prompt the same with and "
            "without tools=[...], so the model would never see the task's tools; use a model whose "
            "template lists tools (e.g. an instruct model of Qwen2.5/Qwen3, Llama 3.1+, Mistral v0.3+)"
        )
    rendered = after[len(before) :] if after.startswith(before) else after
    if "probe_tool" not in rendered:
        raise ValueError(
            "the model's chat template has no tool support: an assistant turn with a tool call "
            f"renders as {short(rendered, 160)!r}, without the call, so SFT could not write its "
            "demonstrations' calls"
        )
    got = fmt.parse(rendered, [_PROBE_TOOL]).valid_calls
    if got != [ToolCall("probe_tool", _PROBE_ARGS)]:
        raise ValueError(
            f"rollout.tool_parser={name!r} cannot read the tool calls this model's chat template writes "
            f"(it renders {short(rendered, 160)!r}, parsed as {short(got, 120)}); name the parser of the "
            f"model's family (known: {TOOL_PARSERS.names()})"
        )
