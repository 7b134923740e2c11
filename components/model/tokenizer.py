"""Byte-level BPE tokenizer with a compact Qwen2.5/hermes-style chat template (the embedded default).

What it does: trains a byte-level BPE with the ``tokenizers`` library on the texts it is given, splits
every digit into its own token (so a small model can copy numbers digit by digit), registers the chat
special tokens and the tool-call markup as single ids, and attaches a Jinja chat template that renders

    <|im_start|>system\\n[system text\\n\\n]# Tools\\n- tool_name(argument: string): ...<|im_end|>\\n
    <|im_start|>user\\n...<|im_end|>\\n
    <|im_start|>assistant\\n<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call><|im_end|>\\n
    <|im_start|>user\\n<tool_response>\\n...\\n</tool_response><|im_end|>\\n      (consecutive tool results share one turn)
    <|im_start|>assistant\\n<answer>97</answer><|im_end|>\\n

What it does not do: load a pretrained tokenizer (any HF tokenizer directory is loaded by
``components.model.tiny.load_hf``), or decide what the corpus is (the caller passes the texts).

Departures from Qwen2.5's template (numbered, as the project asks):
1. The tool listing is one line per tool, ``- name(arg: type, opt?: type): description``, not the
   JSON schemas plus usage instructions, because every prompt token costs a tiny model; the model
   learns the call format from SFT instead.
2. No default system prompt: with no system message and no tools there is no system turn.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

__all__ = [
    "CHAT_TEMPLATE",
    "EOS_TOKEN",
    "IM_START",
    "MARKUP_TOKENS",
    "PAD_TOKEN",
    "SPECIAL_TOKENS",
    "build_tokenizer",
    "chat_template",
]

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
# Special tokens (control tokens; dropped by decode(skip_special_tokens=True)).
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, EOS_TOKEN)
# Tool-call markup: single ids, but ordinary text for decode (as in Qwen2.5's tokenizer).
MARKUP_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")

# Whitespace control (`{%-`/`-%}`) strips the template's own layout; every emitted newline is explicit.
CHAT_TEMPLATE = r"""
{%- set ns = namespace(sys='', start=0) -%}
{%- if messages and messages[0].role == 'system' -%}
    {%- set ns.sys = messages[0].content or '' -%}
    {%- set ns.start = 1 -%}
{%- endif -%}
{%- if tools -%}
    {{- '<|im_start|>system\n' -}}
    {%- if ns.sys -%}{{- ns.sys + '\n\n' -}}{%- endif -%}
    {{- '# Tools' -}}
    {%- for tool in tools -%}
        {%- set fn = tool.function if tool.function is defined else tool -%}
        {%- set params = fn.parameters if fn.parameters is defined and fn.parameters else {} -%}
        {%- set props = params.properties if params.properties is defined and params.properties else {} -%}
        {%- set req = params.required if params.required is defined and params.required else [] -%}
        {{- '\n- ' + fn.name + '(' -}}
        {%- for pname, p in props.items() -%}
            {{- pname + ('' if pname in req else '?') -}}
            {%- if p.type is defined -%}{{- ': ' + (p.type if p.type is string else p.type | join('|')) -}}{%- endif -%}
            {%- if not loop.last -%}{{- ', ' -}}{%- endif -%}
        {%- endfor -%}
        {{- ')' -}}
        {%- if fn.description is defined and fn.description -%}{{- ': ' + fn.description -}}{%- endif -%}
    {%- endfor -%}
    {{- '<|im_end|>\n' -}}
{%- elif ns.start == 1 -%}
    {{- '<|im_start|>system\n' + ns.sys + '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages[ns.start:] -%}
    {%- if message.role == 'tool' -%}
        {%- if loop.first or loop.previtem.role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
        {{- '\n<tool_response>\n' + (message.content or '') + '\n</tool_response>' -}}
        {%- if loop.last or loop.nextitem.role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
    {%- elif message.role == 'assistant' and message.tool_calls -%}
        {{- '<|im_start|>assistant' -}}
        {%- if message.content -%}{{- '\n' + message.content -}}{%- endif -%}
        {%- for call in message.tool_calls -%}
            {%- set fn = call.function if call.function is defined else call -%}
            {{- '\n<tool_call>\n{"name": ' + (fn.name | tojson) + ', "arguments": ' -}}
            {%- if fn.arguments is string -%}{{- fn.arguments -}}{%- else -%}{{- fn.arguments | tojson -}}{%- endif -%}
            {{- '}\n</tool_call>' -}}
        {%- endfor -%}
        {{- '<|im_end|>\n' -}}
    {%- else -%}
        {{- '<|im_start|>' + message.role + '\n' + (message.content or '') + '<|im_end|>\n' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
{%- endif -%}
""".strip()

# The hermes call inside CHAT_TEMPLATE; chat_template() puts another format's fragment in its place.
_HERMES_CALL = """
            {{- '\\n<tool_call>\\n{"name": ' + (fn.name | tojson) + ', "arguments": ' -}}
            {%- if fn.arguments is string -%}{{- fn.arguments -}}{%- else -%}{{- fn.arguments | tojson -}}{%- endif -%}
            {{- '}\\n</tool_call>' -}}
"""
assert _HERMES_CALL in CHAT_TEMPLATE


def chat_template(tool_parser: str = "hermes") -> str:
    """The embedded chat template with tool calls written in format ``tool_parser``
    (:data:`components.envs.tool_formats.TOOL_PARSERS`); ``hermes`` is :data:`CHAT_TEMPLATE` itself."""
    if tool_parser == "hermes":
        return CHAT_TEMPLATE
    from components.envs.tool_formats import get_format

    return CHAT_TEMPLATE.replace(_HERMES_CALL, "\n" + get_format(tool_parser).call_jinja + "\n")


def _markup_tokens(tool_parser: str) -> tuple[str, ...]:
    """The markup added as single tokens: hermes' four, then the markers of format ``tool_parser``."""
    if tool_parser == "hermes":
        return MARKUP_TOKENS
    from components.envs.tool_formats import get_format

    extra = get_format(tool_parser).added_tokens
    return MARKUP_TOKENS + tuple(t for t in extra if t not in MARKUP_TOKENS)


def _without_added_tokens(corpus: Iterable[str], added: tuple[str, ...]) -> Iterator[str]:
    """Cut the added tokens out of the training texts, so BPE spends no merges on their spelling."""
    added_re = re.compile("|".join(re.escape(t) for t in added))
    for i, text in enumerate(corpus):
        if not isinstance(text, str):
            raise TypeError(f"corpus item {i} is {type(text).__name__}, expected str")
        for piece in added_re.split(text):
            if piece:
                yield piece


def build_tokenizer(
    corpus: Iterable[str], vocab_size: int, *, tool_parser: str = "hermes"
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on ``corpus`` and wrap it as a HF fast tokenizer with the chat template.

    ``vocab_size`` counts everything: the 256 byte symbols, the added tokens (7 for hermes; a format's
    markers add theirs) and the learnt merges (fewer merges are learnt when the corpus runs out of
    pairs, so ``len(tokenizer)`` may be smaller). ``tool_parser``: the tool-call format the chat
    template writes (:func:`chat_template`).
    """
    markup = _markup_tokens(tool_parser)
    all_added = SPECIAL_TOKENS + markup
    n_fixed = 256 + len(all_added)
    if not isinstance(vocab_size, int) or vocab_size < n_fixed:
        raise ValueError(
            f"vocab_size={vocab_size!r} must be an int >= {n_fixed} (256 bytes + {len(all_added)} added tokens)"
        )

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = None  # any normalisation would break decode(encode(x)) == x
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(markup),  # the markup is added after training
        min_frequency=2,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_without_added_tokens(corpus, all_added), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in markup])

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        bos_token=None,
        unk_token=None,
        additional_special_tokens=[IM_START],
        clean_up_tokenization_spaces=False,  # " ." must stay " ."
        model_max_length=1 << 30,
        padding_side="right",
        chat_template=chat_template(tool_parser),
    )
