"""Token-level rendering of a conversation with the tokenizer's own chat template.

The first observation is the rendered prompt. Each later observation is the exact token run that the
chat template places between the end of the model's response (its stop token) and the next
generation prompt, found by rendering a fixed two-turn conversation with and without the new
messages and taking the difference. The model's response ids are never decoded and re-encoded.
This works for any HF chat template whose rendering of a prefix is a prefix of the whole.
"""

from __future__ import annotations

import logging
from typing import Any

_log = logging.getLogger(__name__)
_warned: set[str] = set()  # departures already logged in this process (SFT builds a renderer per row)
_ANCHOR = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]


class ChatRenderer:
    def __init__(self, tokenizer: Any, tools: list[dict] | None, stop_token: str) -> None:
        self.tokenizer = tokenizer
        self.tools = tools or None
        self.stop_token = stop_token
        self.stop_id = tokenizer.convert_tokens_to_ids(stop_token)
        self.departure: str | None = None  # where the template re-renders the past (docstring, 2)

    def _text(self, messages: list[dict], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=self.tools, tokenize=False, add_generation_prompt=generation_prompt
        )

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def prompt(self, messages: list[dict]) -> list[int]:
        """Token ids of the first observation, ending with the generation prompt."""
        return self._ids(self._text(messages, True))

    def observation(self, messages: list[dict]) -> list[int]:
        """Token ids to append after a response that ended with the stop token."""
        base = self._text(_ANCHOR, False)
        full = self._text(_ANCHOR + list(messages), True)
        n = base.count(self.stop_token)
        if n == 0:
            raise ValueError(f"chat template never emits the stop token {self.stop_token!r}")
        cut = -len(self.stop_token)
        for _ in range(n):
            cut = full.find(self.stop_token, cut + len(self.stop_token))
            if cut < 0:
                raise ValueError(
                    f"chat template writes fewer stop tokens {self.stop_token!r} once more messages follow "
                    "(it renders a conversation prefix without its end of turn)"
                )
        cut += len(self.stop_token)
        if messages and not full[cut:]:
            raise ValueError(
                "chat template renders nothing after the stop token for the new messages (it ends a "
                "conversation, not each turn, with the stop token)"
            )
        if not full.startswith(base):
            self._depart(base, full, cut)
        return self._ids(full[cut:])

    def _depart(self, base: str, full: str, cut: int) -> None:
        if self.departure is not None:
            return
        at = next((i for i, (a, b) in enumerate(zip(base, full)) if a != b), min(len(base), len(full)))
        self.departure = (
            f"the chat template renders earlier turns differently once more messages follow "
            f"(alone: {base[max(0, at - 20) : at + 40]!r}; followed: {full[max(0, at - 20) : min(at + 40, cut)]!r}); "
            "the agent loop keeps the tokens it has and appends what follows the stop token"
        )
        if self.departure not in _warned:
            _warned.add(self.departure)
            _log.warning("%s", self.departure)

    def decode(self, ids: list[int]) -> str:
        """The action text of a response (stop token removed), for the environment to parse."""
        if ids and ids[-1] == self.stop_id:
            ids = ids[:-1]
        return self.tokenizer.decode(ids, skip_special_tokens=False)
