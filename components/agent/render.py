"""Token-level rendering of a conversation with the tokenizer's own chat template.

The first observation is the rendered prompt. Each later observation is the exact token run that the
chat template places between the end of the model's response (its stop token) and the next
generation prompt, found by rendering a fixed two-turn conversation with and without the new
messages and taking the difference. The model's response ids are never decoded and re-encoded.
This works for any HF chat template whose rendering of a prefix is a prefix of the whole.
"""

from __future__ import annotations

from typing import Any

_ANCHOR = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]


class ChatRenderer:
    def __init__(self, tokenizer: Any, tools: list[dict] | None, stop_token: str) -> None:
        self.tokenizer = tokenizer
        self.tools = tools or None
        self.stop_token = stop_token
        self.stop_id = tokenizer.convert_tokens_to_ids(stop_token)

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
        if not full.startswith(base):
            raise ValueError("chat template does not render a conversation prefix as a prefix")
        end = base.rfind(self.stop_token)
        if end < 0:
            raise ValueError(f"chat template never emits the stop token {self.stop_token!r}")
        return self._ids(base[end + len(self.stop_token) :] + full[len(base) :])

    def decode(self, ids: list[int]) -> str:
        """The action text of a response (stop token removed), for the environment to parse."""
        if ids and ids[-1] == self.stop_id:
            ids = ids[:-1]
        return self.tokenizer.decode(ids, skip_special_tokens=False)
