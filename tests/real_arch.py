"""Random-weight models of real families (Qwen3, Llama 3.x, Mistral) in HF format, for tests: no download.

``write_family(name, out_dir)`` writes a model of about 2M parameters built from transformers' own config
class of the family (``Qwen3Config``, ``LlamaConfig``, ``MistralConfig``) and a byte-level BPE tokenizer
(the embedded trainer, :func:`components.model.tokenizer.build_tokenizer`) that holds the family's special
tokens and a chat template written here in the family's shape:

- qwen3: ChatML; tools as ``<tools>`` JSON in the system turn, hermes ``<tool_call>`` calls, tool
  results as ``<tool_response>`` inside a user turn; the assistant turns after the last real user query
  get a ``<think>`` block (an empty one on the last turn), the earlier ones lose it (Qwen3's rule).
- llama: Llama 3.1; ``<|begin_of_text|>``, ``<|start_header_id|>role<|end_header_id|>``, a system turn
  the template always writes (knowledge cut-off and date), tools as JSON in the first user message,
  ``{"name": ..., "parameters": ...}`` calls, tool results in the ``ipython`` role (JSON-quoted, as the
  real template does to a string), assistant text trimmed, ``<|eot_id|>`` ending every turn.
- mistral: Mistral's v7+/v11 layout (mistral-common's order); ``[SYSTEM_PROMPT]`` (a default one the
  template injects when the conversation has none), ``[AVAILABLE_TOOLS]`` just before the LAST user
  message, ``[INST]...[/INST]``, ``[TOOL_CALLS]name[ARGS]{...}`` calls, ``[TOOL_RESULTS]...[/TOOL_RESULTS]``,
  no generation prompt.

These are the families' shapes, not their byte-exact templates (no model is downloaded to copy them
from); each keeps the rule that matters to token continuity named above.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import torch

from components.model.tokenizer import build_tokenizer

QWEN3_TEMPLATE = r"""
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}{{- "\n" }}{{- tool | tojson }}{%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not (message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set content = message.content if message.content is string else '' %}
    {%- if message.role == "user" or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}
            {{- '<|im_start|>assistant\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
        {%- else %}
            {{- '<|im_start|>assistant\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}{{- '\n' }}{%- endif %}
                {%- if tool_call.function %}{%- set tool_call = tool_call.function %}{%- endif %}
                {{- '<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' }}
                {%- if tool_call.arguments is string %}{{- tool_call.arguments }}{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or messages[loop.index0 - 1].role != "tool" %}{{- '<|im_start|>user' }}{%- endif %}
        {{- '\n<tool_response>\n' + content + '\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != "tool" %}{{- '<|im_end|>\n' }}{%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}
{%- endif %}
""".strip()

LLAMA3_TEMPLATE = r"""
{{- bos_token }}
{%- if not date_string is defined %}{%- set date_string = "26 Jul 2024" %}{%- endif %}
{%- if not tools is defined %}{%- set tools = none %}{%- endif %}
{%- if messages[0].role == 'system' %}
    {%- set system_message = messages[0].content | trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is not none %}{{- "Environment: ipython\n" }}{%- endif %}
{{- "Cutting Knowledge Date: December 2023\nToday Date: " + date_string + "\n\n" }}
{{- system_message + "<|eot_id|>" }}
{%- if tools is not none %}
    {%- if messages | length == 0 %}{{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}{%- endif %}
    {%- set first_user_message = messages[0].content | trim %}
    {%- set messages = messages[1:] %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' }}
    {{- "Given the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}. Do not use variables.\n\n' }}
    {%- for t in tools %}{{- t | tojson(indent=4) + "\n\n" }}{%- endfor %}
    {{- first_user_message + "<|eot_id|>" }}
{%- endif %}
{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or message.tool_calls) %}
        {{- '<|start_header_id|>' + message.role + '<|end_header_id|>\n\n' + message.content | trim + '<|eot_id|>' }}
    {%- elif message.tool_calls %}
        {%- if not message.tool_calls | length == 1 %}{{- raise_exception("This model only supports single tool-calls at once!") }}{%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "' + tool_call.name + '", "parameters": ' }}
        {%- if tool_call.arguments is string %}{{- tool_call.arguments }}{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}
        {{- "}<|eot_id|>" }}
    {%- else %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}{{- message.content | tojson }}{%- else %}{{- message.content }}{%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}
""".strip()

MISTRAL_DEFAULT_SYSTEM = "You are a helpful assistant."
MISTRAL_TEMPLATE = r"""
{{- bos_token }}
{%- if messages[0].role == 'system' %}
    {%- set system_message = messages[0].content %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set system_message = 'DEFAULT' %}
    {%- set loop_messages = messages %}
{%- endif %}
{{- '[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]' }}
{%- set user_messages = loop_messages | selectattr('role', 'equalto', 'user') | list %}
{%- for message in loop_messages %}
    {%- if message.role == 'user' %}
        {%- if tools and message == user_messages[-1] %}{{- '[AVAILABLE_TOOLS]' + tools | tojson + '[/AVAILABLE_TOOLS]' }}{%- endif %}
        {{- '[INST]' + message.content + '[/INST]' }}
    {%- elif message.role == 'assistant' %}
        {%- if message.content %}{{- message.content }}{%- endif %}
        {%- for tool in message.tool_calls or [] %}
            {%- set arguments = tool.function.arguments %}
            {%- if arguments is not string %}{%- set arguments = arguments | tojson %}{%- endif %}
            {{- '[TOOL_CALLS]' + tool.function.name + '[ARGS]' + arguments }}
        {%- endfor %}
        {{- eos_token }}
    {%- elif message.role == 'tool' %}
        {{- '[TOOL_RESULTS]' + message.content | string + '[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception('Only user, system, assistant and tool roles are supported!') }}
    {%- endif %}
{%- endfor %}
""".strip().replace("'DEFAULT'", repr(MISTRAL_DEFAULT_SYSTEM))


@dataclass(frozen=True)
class Family:
    name: str
    template: str
    tool_parser: str  # rollout.tool_parser for the family
    eos: str  # the end-of-turn token (tokenizer.eos_token, the agent loop's stop token)
    bos: str | None
    special: tuple[str, ...]  # control tokens the template writes, each a single id
    config: str  # the transformers config class


FAMILIES = {
    "qwen3": Family(
        "qwen3",
        QWEN3_TEMPLATE,
        "hermes",
        "<|im_end|>",
        None,
        ("<|im_start|>", "<|im_end|>", "<think>", "</think>"),
        "Qwen3Config",
    ),
    "llama": Family(
        "llama",
        LLAMA3_TEMPLATE,
        "llama3_json",
        "<|eot_id|>",
        "<|begin_of_text|>",
        ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>"),
        "LlamaConfig",
    ),
    "mistral": Family(
        "mistral",
        MISTRAL_TEMPLATE,
        "mistral",
        "</s>",
        "<s>",
        (
            "<s>",
            "</s>",
            "[INST]",
            "[/INST]",
            "[SYSTEM_PROMPT]",
            "[/SYSTEM_PROMPT]",
            "[AVAILABLE_TOOLS]",
            "[/AVAILABLE_TOOLS]",
            "[TOOL_RESULTS]",
            "[/TOOL_RESULTS]",
        ),
        "MistralConfig",
    ),
}


def _corpus(n: int = 300) -> list[str]:
    """Calculator-task texts, so the BPE learns the merges of the problems and the JSON calls."""
    rng = random.Random(0)
    out = []
    for _ in range(n):
        a, b = rng.randint(2, 999), rng.randint(2, 99)
        out.append(f"What is {a} * {b}? Use the calculator tool. The answer is <answer>{a * b}</answer>.")
        out.append(f'{{"name": "calculator", "arguments": {{"expression": "{a} * {b}"}}}} {a * b}')
        out.append(f'{{"name": "calculator", "parameters": {{"expression": "{a} + {b}"}}}}')
    return out


def _rendered(name: str) -> list[str]:
    """Calculator conversations rendered with family ``name``'s template, so the BPE learns the merges of
    its tool listing and headers (as base_model trains the embedded tokenizer on rendered conversations)."""
    from components.envs import get_task

    calc = get_task("calc")
    fam = FAMILIES[name]
    bootstrap = build_tokenizer([], vocab_size=300, tool_parser=fam.tool_parser)  # bytes: renders only
    bootstrap.add_special_tokens({"additional_special_tokens": list(fam.special)})
    bootstrap.eos_token, bootstrap.chat_template = fam.eos, fam.template
    if fam.bos is not None:
        bootstrap.bos_token = fam.bos
    rng = random.Random(1)
    out = []
    for _ in range(40):
        a, b = rng.randint(2, 999), rng.randint(2, 99)
        call = {
            "type": "function",
            "function": {"name": "calculator", "arguments": {"expression": f"{a} * {b}"}},
        }
        messages = [
            {"role": "system", "content": "Solve the problem. Use the calculator tool."},
            {"role": "user", "content": f"What is {a} * {b}?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "name": "calculator", "content": str(a * b)},
            {"role": "assistant", "content": f"<answer>{a * b}</answer>"},
        ]
        out.append(bootstrap.apply_chat_template(messages, tools=calc.tools(), tokenize=False))
    return out


def family_tokenizer(name: str, vocab_size: int = 1024):
    """The embedded BPE trainer's tokenizer with family ``name``'s special tokens, EOS and chat template."""
    fam = FAMILIES[name]
    corpus = _corpus() + _rendered(name)
    tok = build_tokenizer(corpus, vocab_size=vocab_size, tool_parser=fam.tool_parser)
    tok.add_special_tokens({"additional_special_tokens": list(fam.special)})
    tok.eos_token = fam.eos
    if fam.bos is not None:
        tok.bos_token = fam.bos
    tok.chat_template = fam.template
    return tok


def write_family(
    name: str,
    out_dir: str | Path,
    *,
    hidden_size: int = 256,
    num_layers: int = 2,
    seed: int = 0,
) -> Path:
    """Write family ``name``'s random model (about 2M parameters) and tokenizer to ``out_dir``."""
    import transformers
    from transformers import AutoModelForCausalLM, GenerationConfig

    fam = FAMILIES[name]
    tok = family_tokenizer(name)
    eos_id = tok.convert_tokens_to_ids(fam.eos)
    bos_id = tok.convert_tokens_to_ids(fam.bos) if fam.bos else tok.pad_token_id
    config = getattr(transformers, fam.config)(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=3 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden_size // 4,
        max_position_embeddings=2048,
        tie_word_embeddings=name == "qwen3",  # Qwen3's small models tie; Llama 8B and Mistral 7B do not
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=tok.pad_token_id,
        dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
        with torch.no_grad():  # a fresh init is near-uniform and repeats one token; vary it
            for p in model.parameters():
                p.add_(torch.randn(p.shape) * 0.02)
    model.generation_config = GenerationConfig(
        bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=tok.pad_token_id, do_sample=False
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
