"""Token continuity of the agent loop under real families' chat templates (tests/real_arch.py).

For Qwen3, Llama 3.1 and Mistral, a calculator episode of two tool turns and an answer runs through
``run_episodes`` with a scripted engine that writes the family's calls: step t's prompt + response must
be a prefix of step t+1's prompt, and the last context is compared with a fresh rendering of the whole
conversation by the same template (what a chat server re-rendering it would feed). Where they differ,
the difference is the departure ``ChatRenderer`` names (its docstring), and nothing else.
"""

from __future__ import annotations

import itertools

import pytest

from components.agent.loop import Episode, run_episodes
from components.agent.render import ChatRenderer
from components.envs import get_task
from components.envs.tool_formats import get_format
from components.model.sft_data import encode_conversation
from components.rollout.base import Generation
from tests.real_arch import FAMILIES, family_tokenizer

ROW = {"id": "q1", "question": "What is 12 * 7 + 5?", "answer": "89"}
CALLS = ["12 * 7", "84 + 5"]


class Scripted:
    """Test double of a rollout engine: the k-th generate call answers with ``responses[k]`` + stop."""

    def __init__(self, tok, responses: list[str]):
        self.tok, self.responses, self.prompts = tok, responses, []
        self.stop = tok.convert_tokens_to_ids(tok.eos_token)

    def generate(self, prompts, sampling, seeds=None):
        out = []
        for p in prompts:
            ids = self.tok.encode(self.responses[len(self.prompts)], add_special_tokens=False) + [self.stop]
            self.prompts.append(list(p))
            out.append([Generation(token_ids=ids, logprobs=[-0.1] * len(ids), finish_reason="stop")])
        return out


def _episode(name: str, think: str = ""):
    fam = FAMILIES[name]
    tok = family_tokenizer(name)
    fmt = get_format(fam.tool_parser)
    calc = get_task("calc")
    responses = [think + fmt.format_call("calculator", {"expression": e}) for e in CALLS]
    responses.append(think + "<answer>89</answer>")
    renderer = ChatRenderer(tok, calc.tools(), tok.eos_token)
    env = calc.make_env(tool_parser=fam.tool_parser)
    engine = Scripted(tok, responses)
    steps = run_episodes(
        engine,
        renderer,
        [Episode("t0", "q1", env, ROW)],
        max_steps=5,
        max_prompt_len=4096,
        max_response_len=256,
        temperature=0.0,
    )
    # the conversation as a chat server stores it: parsed calls, tool results
    messages = env.reset(ROW)
    for e, value in zip(CALLS, ("84", "89")):
        call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": e}}}
        messages += [
            {"role": "assistant", "content": think, "tool_calls": [call]},
            {"role": "tool", "name": "calculator", "content": value},
        ]
    fresh = tok.apply_chat_template(messages, tools=calc.tools(), tokenize=False, add_generation_prompt=True)
    return tok, renderer, steps, fresh, messages


def _check_continuity(steps):
    assert [s["step"] for s in steps] == [0, 1, 2] and steps[-1]["correct"], [s["feedback"] for s in steps]
    for a, b in itertools.pairwise(steps):
        head = a["prompt_ids"] + a["response_ids"]
        assert b["prompt_ids"][: len(head)] == head, (
            "a step's prompt + response is not the next prompt's start"
        )


@pytest.mark.parametrize("name", ["llama", "mistral", "qwen3"])
def test_tool_episode_is_continuous_and_equals_a_fresh_rendering(name):
    tok, renderer, steps, fresh, _ = _episode(name)
    _check_continuity(steps)
    last = tok.decode(steps[-1]["prompt_ids"], skip_special_tokens=False)
    if name == "qwen3":
        # Qwen3 writes an empty think block into the LAST assistant turn only: the anchor shows it, the
        # renderer names it, and a tool episode whose responses carry none renders like the loop's context
        assert "<think>" in renderer.departure
    else:
        assert renderer.departure is None
    assert last == fresh
    assert tok.decode(steps[1]["prompt_ids"], skip_special_tokens=False).count(tok.eos_token) >= 1


def test_qwen3_think_blocks_are_kept_where_a_fresh_rendering_drops_them():
    """A Qwen3 model that thinks before each call: the loop keeps every think block it sampled (the
    prefix property holds); the template keeps them too while the turns follow the last real user
    query. An empty think block (what SFT on the template teaches before a call) is dropped by a fresh
    rendering: the loop's context then departs from it by exactly those blocks, as named."""
    _, _, steps, fresh, _ = _episode("qwen3", think="<think>\n12 times 7 first\n</think>\n\n")
    _check_continuity(steps)
    tok = family_tokenizer("qwen3")
    assert tok.decode(steps[-1]["prompt_ids"], skip_special_tokens=False) == fresh
    empty = "<think>\n\n</think>\n\n"
    tok, _, steps, fresh, _ = _episode("qwen3", think=empty)
    _check_continuity(steps)
    last = tok.decode(steps[-1]["prompt_ids"], skip_special_tokens=False)
    assert last.count(empty) == 2 and fresh.count(empty) == 0
    assert last.replace(empty, "") == fresh


def test_mistral_user_observation_relists_the_tools_and_is_named():
    """Mistral writes [AVAILABLE_TOOLS] before the last user message: a user-role observation (a text
    environment's) would move it. The loop keeps the first prompt's listing and the observation lists
    them again before the new message; the renderer names the departure."""
    tok = family_tokenizer("mistral")
    renderer = ChatRenderer(tok, get_task("calc").tools(), tok.eos_token)
    obs = tok.decode(renderer.observation([{"role": "user", "content": "go on"}]), skip_special_tokens=False)
    assert obs.startswith("[AVAILABLE_TOOLS]") and obs.endswith("[INST]go on[/INST]")
    assert "[AVAILABLE_TOOLS]" in renderer.departure


@pytest.mark.parametrize("name", ["llama", "mistral", "qwen3"])
def test_sft_example_is_what_the_loop_would_build(name):
    """SFT's example of a demonstration is the token sequence the loop builds when the policy writes
    the demonstrated responses (the last step's prompt + response), for every family."""
    tok, _, steps, _, messages = _episode(name)
    demo = messages + [{"role": "assistant", "content": "<answer>89</answer>"}]
    ids, labels = encode_conversation(tok, demo, get_task("calc").tools(), max_len=4096)
    loop = steps[-1]["prompt_ids"] + steps[-1]["response_ids"]
    if name == "qwen3":  # SFT writes the empty think block the template gives a last turn, to every turn
        text = tok.decode(ids, skip_special_tokens=False)
        assert text.count("<think>\n\n</think>\n\n") == 3
        assert text.replace("<think>\n\n</think>\n\n", "") == tok.decode(loop, skip_special_tokens=False)
    else:
        assert ids == loop
    learnt = [t for t, lab in zip(ids, labels) if lab != -100]
    assert learnt[-1] == tok.convert_tokens_to_ids(tok.eos_token)
