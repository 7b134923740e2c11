"""Shared by tests/agent: a small trained tokenizer, calc rows and actions, and a scripted rollout engine.

The engine is a test double of ``components.rollout.base.RolloutEngine``: it answers each prompt with
the next scripted action text of the problem the prompt is about (found by decoding the prompt),
encoded with the tokenizer and ended by the stop id, with made-up log-probs. It records every call.
"""

from __future__ import annotations

import functools
import json
import random

from components.model.tokenizer import EOS_TOKEN, IM_START, build_tokenizer
from components.rollout.base import Generation, SamplingConfig


def _corpus(n: int = 200) -> list[str]:
    rng = random.Random(0)
    texts = []
    for _ in range(n):
        a, b = rng.randint(2, 999), rng.randint(2, 99)
        texts.append(f"What is {a} * {b}? Use the calculator tool. The answer is {a * b}.")
        texts.append(
            f'<|im_start|>assistant\n<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{a} * {b}"}}}}'
            f"\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n{a * b}\n</tool_response><|im_end|>\n"
            f"<|im_start|>assistant\n<answer>{a * b}</answer><|im_end|>\n"
        )
    return texts


@functools.lru_cache(maxsize=1)
def tokenizer():
    return build_tokenizer(_corpus(), vocab_size=400)


def row(qid: str, question: str, answer: str) -> dict:
    return {"id": qid, "question": question, "answer": answer}


def call(expression: str) -> str:
    """A well-formed calculator call, as the model writes it."""
    return (
        "<tool_call>\n"
        + json.dumps({"name": "calculator", "arguments": {"expression": expression}})
        + "\n</tool_call>"
    )


def answer(value: str) -> str:
    return f"<answer>{value}</answer>"


def logprobs_for(ids: list[int]) -> list[float]:
    """Made-up, distinct, negative log-probs (one per id)."""
    return [-0.01 * (i + 1) - 0.001 * (t % 7) for i, t in enumerate(ids)]


class ScriptedEngine:
    """``generate`` answers a prompt with ``scripts[question][k]`` where k = assistant turns already in it.

    With ``turn_by_calls`` k is instead the number of earlier ``generate`` calls that held a prompt about
    the same question (the loop makes one call per turn), for prompts that drop old turns
    (``context_window``); the episodes of one question must then start together.
    A response longer than ``sampling.max_tokens`` (its stop id included) is cut there with
    finish_reason "length", as a real engine does. Every call's prompts and seeds are kept in ``calls``.
    """

    def __init__(self, tok, scripts: dict[str, list[str]], turn_by_calls: bool = False) -> None:
        self.tok = tok
        self.scripts = scripts
        self.eos_id = tok.convert_tokens_to_ids(EOS_TOKEN)
        self.calls: list[dict] = []
        self.turn_by_calls = turn_by_calls
        self._calls_with: dict[str, int] = {}  # question -> earlier calls that held it

    def _script(self, prompt: list[int]) -> tuple[str, int]:
        text = self.tok.decode(prompt, skip_special_tokens=False)
        found = [q for q in self.scripts if q in text]
        assert len(found) == 1, f"prompt matches {found} of the scripted questions"
        if self.turn_by_calls:
            return found[0], self._calls_with.get(found[0], 0)
        turn = text.count(f"{IM_START}assistant\n") - 1  # the generation prompt is the last one
        return found[0], turn

    def generate(self, prompts: list[list[int]], sampling: SamplingConfig, seeds: list[int] | None = None):
        assert seeds is not None and len(seeds) == len(prompts)
        self.calls.append({"prompts": [list(p) for p in prompts], "seeds": list(seeds), "sampling": sampling})
        out, asked = [], set()
        for prompt in prompts:
            question, turn = self._script(prompt)
            asked.add(question)
            script = self.scripts[question]
            assert turn < len(script), f"{question!r}: no scripted action for turn {turn}"
            ids = self.tok.encode(script[turn], add_special_tokens=False) + [self.eos_id]
            reason = "stop"
            if len(ids) > sampling.max_tokens:
                ids, reason = ids[: sampling.max_tokens], "length"
            out.append([Generation(token_ids=ids, logprobs=logprobs_for(ids), finish_reason=reason)])
        for question in asked:
            self._calls_with[question] = self._calls_with.get(question, 0) + 1
        return out

    def sync_weights(self, state_dict) -> None:  # pragma: no cover - not used by the loop
        raise AssertionError("the agent loop must not sync weights")

    def close(self) -> None:  # pragma: no cover
        pass
