"""rollout.context_window in the agent loop, and what depends on it: windowed prompts are the first
observation + the exact segments of the last k turns; obs_key records the env's state before each
action; the RL update's packed log-probs of windowed rows equal plain per-row forwards; SFT examples
in window mode are the loop's own contexts, token for token."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from agent_helpers import ScriptedEngine, answer, call, row
from transformers import Qwen3Config, Qwen3ForCausalLM

from components.agent.loop import Episode, run_episodes
from components.envs import get_task
from components.envs.base import AgentEnv, StepOutcome
from components.model.sft_data import IGNORE_INDEX, encode_conversation, encode_turns
from components.model.tokenizer import EOS_TOKEN
from components.tasks.demonstrations import answer_message, tool_call_message, tool_message
from components.train.policy import response_logprobs
from components.train.rl_update import step_tensors

Q1, Q3 = "What is 60 + 37?", "What is 5 - 9 + 100?"
Q3_SCRIPT = [call("5 - 9"), call("-4 + 100"), call("96 * 1"), answer("96")]  # 4 turns
LOOSE = dict(max_steps=6, max_prompt_len=4096, max_response_len=128, temperature=1.0, seed=7)


def calc_episodes(*rows_, samples: int = 1) -> list[Episode]:
    calc = get_task("calc")
    return [Episode(f"{r['id']}-{j}", r["id"], calc.make_env(r), r) for r in rows_ for j in range(samples)]


def play(tok, renderer, window, scripts=None, rows_=None, samples: int = 1, **kw) -> list[dict]:
    engine = ScriptedEngine(tok, scripts or {Q3: Q3_SCRIPT}, turn_by_calls=True)
    eps = calc_episodes(*(rows_ or [row("c", Q3, "96")]), samples=samples)
    return run_episodes(engine, renderer, eps, **{**LOOSE, **kw}, context_window=window)


def tool(content: str) -> dict:
    return {"role": "tool", "name": "calculator", "content": content}


# --- the windowed prompt ----------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 3])
def test_windowed_prompt_is_first_observation_plus_last_k_segments(tok, renderer, k):
    steps = play(tok, renderer, k)
    assert [s["feedback"] for s in steps] == ["-4", "96", "96", ""] and steps[-1]["correct"]
    first = renderer.prompt(get_task("calc").initial_messages(row("c", Q3, "96")))
    segments = [s["response_ids"] + renderer.observation([tool(s["feedback"])]) for s in steps[:-1]]
    for t, s in enumerate(steps):
        want = first + [x for seg in segments[max(0, t - k) : t] for x in seg]
        assert s["prompt_ids"] == want, f"step {t}"
    lengths = [len(s["prompt_ids"]) for s in steps]
    if k < 3:  # the window drops turns: the last prompt is shorter than the whole history
        assert lengths[3] < len(first) + sum(map(len, segments))


def test_window_at_least_the_episode_length_is_the_whole_history_bit_for_bit(tok, renderer):
    full = play(tok, renderer, None)
    assert play(tok, renderer, 4) == full and play(tok, renderer, 64) == full
    assert play(tok, renderer, 2) != full


def test_max_prompt_len_still_ends_a_windowed_episode(tok, renderer):
    steps = play(tok, renderer, 1)
    longest = max(len(s["prompt_ids"]) for s in steps)
    assert play(tok, renderer, 1, max_prompt_len=longest) == steps
    cut = play(tok, renderer, 1, max_prompt_len=longest - 1)
    over = next(t for t, s in enumerate(steps) if len(s["prompt_ids"]) == longest)
    assert len(cut) == over and cut[-1]["truncated"] and cut[-1]["done"]
    with pytest.raises(ValueError, match="context_window must be >= 1"):
        play(tok, renderer, 0)


# --- obs_key ------------------------------------------------------------------------------------


class WalkEnv(AgentEnv):
    """A walk on the integers from 0 to the goal 2: "+" and "-" move; the state key is the position."""

    tools: list[dict[str, Any]] = []

    def reset(self, row):
        self.pos = 0
        return [{"role": "system", "content": "Walk."}, {"role": "user", "content": row["question"]}]

    def step(self, action_text):
        self.pos += {"+": 1, "-": -1}.get(action_text.strip(), 0)
        done = self.pos == 2
        messages = [] if done else [{"role": "user", "content": f"at {self.pos}"}]
        return StepOutcome(messages=messages, reward=float(done), done=done)

    def state_key(self):
        return f"pos={self.pos}"


def test_obs_key_is_the_state_before_each_action_and_empty_without_keys(tok, renderer):
    walk = row("w", "Walk to two.", "")
    engine = ScriptedEngine(tok, {"Walk to two.": ["+", "-", "+", "+"]})
    steps = run_episodes(engine, renderer, [Episode("w-0", "w", WalkEnv(), walk)], **LOOSE)
    assert [s["obs_key"] for s in steps] == ["pos=0", "pos=1", "pos=0", "pos=1"]
    assert [s["reward"] for s in steps] == [0.0, 0.0, 0.0, 1.0]
    calc = play(tok, renderer, None)  # ToolEnv keeps AgentEnv's default state_key (None)
    assert [s["obs_key"] for s in calc] == ["", "", "", ""]


# --- the update's log-probs of windowed rows ----------------------------------------------------


def tiny_qwen3(vocab: int) -> Qwen3ForCausalLM:
    config = Qwen3Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=2048,
        initializer_range=0.2, tie_word_embeddings=True,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return Qwen3ForCausalLM(config).eval()


def plain_logprobs(model, prompt: list[int], response: list[int]) -> torch.Tensor:
    """log pi(response token j | prompt + response[:j]) from one unpacked forward of this row alone."""
    ids = torch.tensor([prompt + response])
    logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)  # (T, V)
    pos = torch.arange(len(prompt) - 1, len(prompt) - 1 + len(response))
    return logp[pos, torch.tensor(response)]


def as_update_rows(steps: list[dict]) -> list[dict]:
    """The fields ``step_tensors`` reads besides the ids (their values do not enter the log-probs)."""
    return [
        {**s, "advantages": [0.0] * len(s["response_ids"]), "returns": [0.0] * len(s["response_ids"]),
         "old_logprobs": s["response_logprobs"]}
        for s in steps
    ]  # fmt: skip


def test_update_logprobs_of_windowed_rows_equal_plain_per_row_forwards(tok, renderer):
    scripts = {Q3: Q3_SCRIPT, Q1: [call("60 + 37"), answer("97")]}
    rows_ = [row("c", Q3, "96"), row("a", Q1, "97")]
    windowed = play(tok, renderer, 1, scripts=scripts, rows_=rows_, samples=2)
    full = play(tok, renderer, None, scripts=scripts, rows_=rows_, samples=2)
    assert len(windowed) == 12 and [s["response_ids"] for s in windowed] == [s["response_ids"] for s in full]
    model = tiny_qwen3(len(tok))
    # the batch exactly as actor_update builds it: pack=True (make_token_batch's default), share_prefix=True
    st = step_tensors(as_update_rows(windowed), tok.pad_token_id, per_step_values=False, share_prefix=True)
    batch = st.batch
    # identical samples read one sequence; steps 0 and 1 of an episode still chain (step 0's prompt +
    # response is a prefix of step 1's prompt), windowed steps 2 and 3 do not: Q3 forwards 3 sequences
    # ({0, 1}, {2}, {3}), Q1 one ({0, 1}); the whole history would forward one per question
    assert batch.input_ids.size(0) == 4 and batch.prefix is not None  # + the shared system prompt
    rows_full = step_tensors(as_update_rows(full), tok.pad_token_id, per_step_values=False, share_prefix=True)
    assert rows_full.batch.input_ids.size(0) == 2
    with torch.no_grad():
        logp, _ = response_logprobs(model, batch)
        worst = 0.0
        for i, s in enumerate(windowed):
            n = len(s["response_ids"])
            want = plain_logprobs(model, s["prompt_ids"], s["response_ids"])
            worst = max(worst, float((logp[i, :n] - want).abs().max()))
        assert worst < 1e-5
        # negative control: the same responses scored on the whole history differ where the window
        # dropped turns (steps 2 and 3 of the 4-turn episodes), so a batch that read a row's log-probs
        # from its trajectory's full-history sequence would fail the comparison above
        assert sum(w["prompt_ids"] != f["prompt_ids"] for w, f in zip(windowed, full)) == 4
        for i, (w, f) in enumerate(zip(windowed, full)):
            n = len(w["response_ids"])
            gap = float((logp[i, :n] - plain_logprobs(model, f["prompt_ids"], f["response_ids"])).abs().max())
            if w["prompt_ids"] == f["prompt_ids"]:
                assert gap < 1e-5, i
            else:
                assert w["step"] >= 2 and gap > 1e-3, (i, gap)


# --- SFT in window mode -----------------------------------------------------------------------


def q3_demo() -> list[dict]:
    calc = "calculator"
    return [
        tool_call_message(calc, {"expression": "5 - 9"}),
        tool_message(calc, "-4"),
        tool_call_message(calc, {"expression": "-4 + 100"}),
        tool_message(calc, "96"),
        tool_call_message(calc, {"expression": "96 * 1"}),
        tool_message(calc, "96"),
        answer_message("96"),
    ]


@pytest.mark.parametrize("k", [1, 2, 5])
def test_windowed_sft_examples_are_the_loop_contexts_token_for_token(tok, renderer, k):
    r = row("c", Q3, "96")
    messages = get_task("calc").initial_messages(r) + q3_demo()
    tools = get_task("calc").tools()
    examples = encode_turns(tok, messages, tools, 4096, context_window=k)
    steps = play(tok, renderer, k)  # the loop, scripted with the same actions, on the real calc env
    assert len(examples) == len(steps) == 4
    for t, (ex, s) in enumerate(zip(examples, steps)):
        ids, labels = ex
        n = len(s["prompt_ids"])
        assert ids == s["prompt_ids"] + s["response_ids"], f"turn {t}"
        assert labels == [IGNORE_INDEX] * n + s["response_ids"], f"turn {t}: labels on this turn only"
    # each labelled turn is the assistant's rendering (up to and with its end-of-turn token)
    assert tok.decode(examples[3][0][len(steps[3]["prompt_ids"]) :]).endswith(
        "<answer>96</answer>" + EOS_TOKEN
    )
    # the whole-history conversation's labels are the union of the turns' (the same tokens)
    ids, labels = encode_conversation(tok, messages, tools, 4096)
    labelled = [x for x in labels if x != IGNORE_INDEX]
    assert labelled == [x for s in steps for x in s["response_ids"]]
    # too long -> None, per turn
    short = encode_turns(tok, messages, tools, len(examples[0][0]), context_window=k)
    assert short[0] == examples[0] and all(
        (e is None) == (len(full_ex[0]) > len(examples[0][0])) for e, full_ex in zip(short, examples)
    )
    with pytest.raises(ValueError, match="context_window"):
        encode_turns(tok, messages, tools, 4096, context_window=0)


@pytest.mark.parametrize("k", [1, 2])
def test_a_reply_of_weight_0_is_context_and_never_a_label(tok, k):
    """A detour reply (``"weight": 0``): no example of its own, the same token context for the turns
    after it, and no label in the whole-conversation encoding; the other turns are unchanged."""
    calc = get_task("calc")
    messages = calc.initial_messages(row("c", Q3, "96")) + q3_demo()
    weighted = copy.deepcopy(messages)
    detour = [i for i, m in enumerate(weighted) if m["role"] == "assistant"][1]  # the second call
    weighted[detour]["weight"] = 0
    plain = encode_turns(tok, messages, calc.tools(), 4096, context_window=k)
    got = encode_turns(tok, weighted, calc.tools(), 4096, context_window=k)
    assert len(plain) == 4 and got == [plain[0], plain[2], plain[3]]
    # whole history: the detour's tokens lose their labels, nothing else changes
    ids, labels = encode_conversation(tok, messages, calc.tools(), 4096)
    w_ids, w_labels = encode_conversation(tok, weighted, calc.tools(), 4096)
    changed = [i for i, (a, b) in enumerate(zip(labels, w_labels)) if a != b]
    assert w_ids == ids and changed and all(w_labels[i] == IGNORE_INDEX for i in changed)
    second_call = tok.decode([ids[i] for i in changed])
    assert '"-4 + 100"' in second_call and "5 - 9" not in second_call and "96 * 1" not in second_call


def test_bad_weights_name_the_message(tok):
    calc = get_task("calc")
    base = calc.initial_messages(row("c", Q3, "96")) + q3_demo()
    first = len(calc.initial_messages(row("c", Q3, "96")))  # index of the first assistant message
    for bad in (2, 0.5, True, "0"):
        messages = copy.deepcopy(base)
        messages[first]["weight"] = bad
        with pytest.raises(ValueError, match=rf"messages\[{first}\]: 'weight' must be 0 or 1"):
            encode_turns(tok, messages, calc.tools(), 4096, context_window=1)
    messages = copy.deepcopy(base)
    messages[first + 1]["weight"] = 1  # a tool message cannot carry one
    with pytest.raises(ValueError, match=rf"messages\[{first + 1}\]: 'weight' .* on a 'tool' message"):
        encode_conversation(tok, messages, calc.tools(), 4096)
    messages = copy.deepcopy(base)
    for m in messages:
        if m["role"] == "assistant":
            m["weight"] = 0
    with pytest.raises(ValueError, match="every assistant message has weight 0"):
        encode_conversation(tok, messages, calc.tools(), 4096)
    assert encode_turns(tok, messages, calc.tools(), 4096, context_window=1) == []
