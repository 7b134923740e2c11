"""A tiny model that has memorised two calc conversations, so a real server makes real tool calls.

An untrained tiny model never writes a tool call. This one is trained (full-sequence next-token loss,
a few hundred Adam steps on CPU) on exactly the texts the chat template renders for:

- ``GOOD_Q``: a well-formed calculator call, then (after the tool's "42") ``<answer>42</answer>``;
- ``BAD_Q``: a ``<tool_call>`` whose JSON is broken, then ``<answer>0</answer>`` after the error.

So the test proves the mechanics (server-side hermes parsing, the real calculator, the round trip of
the tool result, the malformed-call path), not that a model learnt to use tools.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from components.model.tiny import build_tiny_model, save_hf
from components.model.tokenizer import build_tokenizer
from components.tasks.calc import SYSTEM_PROMPT, calculate, tools

GOOD_Q = "What is 6 times 7?"
GOOD_CALL = '{"expression": "6 * 7"}'
BAD_Q = "Break the calculator."
BAD_TEXT = '<tool_call>\n{"name": "calculator", "arguments": {"expression": \n</tool_call>'
BAD_ERROR = "error: tool call is not valid JSON"  # the start of what ToolEnv answers


def conversations() -> list[list[dict]]:
    good_result = calculate("6 * 7").text
    sys = {"role": "system", "content": SYSTEM_PROMPT}
    call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "6 * 7"}}}
    return [
        [
            sys,
            {"role": "user", "content": GOOD_Q},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "name": "calculator", "content": good_result},
            {"role": "assistant", "content": f"<answer>{good_result}</answer>"},
        ],
        [
            sys,
            {"role": "user", "content": BAD_Q},
            {"role": "assistant", "content": BAD_TEXT},
            {"role": "tool", "name": "invalid_call", "content": "__ERROR__"},
            {"role": "assistant", "content": "<answer>0</answer>"},
        ],
    ]


def build_memorising_model(out_dir: Path, bad_feedback: str, max_steps: int = 300) -> tuple[Path, int]:
    """Train and save the model; ``bad_feedback``: the env's exact message for ``BAD_TEXT``. Training
    stops once greedy decoding reproduces every token of both texts (and the loss is below 0.05, for
    a margin that survives vLLM's different kernels). Returns the checkpoint and the steps taken."""
    convs = conversations()
    convs[1][3]["content"] = bad_feedback
    plain = build_tokenizer(["x"], vocab_size=300)
    texts = [plain.apply_chat_template(c, tools=tools(), tokenize=False) for c in convs]
    tok = build_tokenizer(texts * 20, vocab_size=700)  # merges of these very texts: short sequences
    seqs = [torch.tensor([tok.encode(t, add_special_tokens=False)]) for t in texts]
    # greedy decoding must reproduce every token the model writes: from the first generation prompt on
    starts = [
        len(tok.apply_chat_template(c[:2], tools=tools(), tokenize=False, add_generation_prompt=True))
        for c in convs
    ]
    starts = [len(tok.encode(texts[i][: starts[i]], add_special_tokens=False)) for i in range(len(texts))]
    model = build_tiny_model(
        tok,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        head_dim=32,
        max_position_embeddings=512,
        seed=0,
    )
    torch.manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-2, weight_decay=0.0)
    model.train()
    step = 0
    while step < max_steps:
        step += 1
        losses, exact = [], True
        for x, start in zip(seqs, starts):
            out = model(input_ids=x, labels=x)
            out.loss.backward()
            losses.append(out.loss.item())
            exact = exact and bool((out.logits[0, start - 1 : -1].argmax(-1) == x[0, start:]).all())
        opt.step()
        opt.zero_grad()
        if exact and max(losses) < 0.05:
            break
    if not (exact and max(losses) < 0.05):
        raise AssertionError(
            f"the test model did not memorise its texts in {max_steps} steps (loss {losses})"
        )
    model.eval()
    return save_hf(model, tok, out_dir), step


def live_group_members(pgid: int) -> list[int]:
    """Pids of the processes of group ``pgid`` that are still running (zombies waiting for a reaper
    that is not us do not count: they hold no memory and run nothing)."""
    import psutil

    out = []
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    return out
