"""run_episodes on the real calc environment with a scripted engine: exact token continuity, every way an
episode ends, one generate call per turn, batch-independent seeds, and episode_metrics by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest
from agent_helpers import ScriptedEngine, answer, call, logprobs_for, row

from components.agent.loop import Episode, episode_metrics, episode_seed, run_episodes, sampled_metrics
from components.envs import get_task
from components.model.tokenizer import EOS_TOKEN

Q1, Q2, Q3 = "What is 60 + 37?", "What is 12 * 12?", "What is 5 - 9 + 100?"
LOOSE = dict(max_steps=4, max_prompt_len=2048, max_response_len=128, temperature=1.0, seed=7)


@pytest.fixture(scope="module")
def eos(tok):
    return tok.convert_tokens_to_ids(EOS_TOKEN)


def episodes(*rows_, sample: int = 0, malformed_penalty: float = 0.0) -> list[Episode]:
    calc = get_task("calc")
    return [
        Episode(f"{r['id']}-{sample}", r["id"], calc.make_env(r, malformed_penalty=malformed_penalty), r)
        for r in rows_
    ]


def enc(tok, text: str, eos: int) -> list[int]:
    return tok.encode(text, add_special_tokens=False) + [eos]


def tool(content: str, name: str = "calculator") -> dict:
    return {"role": "tool", "name": name, "content": content}


def first_prompt(renderer, r: dict) -> list[int]:
    return renderer.prompt(get_task("calc").initial_messages(r))


# --- continuity and a final answer -------------------------------------------------------------


def test_two_calls_then_answer_continue_token_for_token(tok, renderer, eos):
    r = row("a", Q3, "96")
    engine = ScriptedEngine(tok, {Q3: [call("5 - 9"), call("-4 + 100"), answer("96")]})
    steps = run_episodes(engine, renderer, episodes(r), **LOOSE)

    assert [s["step"] for s in steps] == [0, 1, 2]
    assert steps[0]["prompt_ids"] == first_prompt(renderer, r)
    responses = [enc(tok, call("5 - 9"), eos), enc(tok, call("-4 + 100"), eos), enc(tok, answer("96"), eos)]
    observations = [renderer.observation([tool("-4")]), renderer.observation([tool("96")])]
    for t, s in enumerate(steps):
        assert s["response_ids"] == responses[t]
        assert s["response_logprobs"] == pytest.approx(logprobs_for(responses[t]))
    for t in (0, 1):
        assert (
            steps[t + 1]["prompt_ids"] == steps[t]["prompt_ids"] + steps[t]["response_ids"] + observations[t]
        )
    # the observation between the two responses is the tool turn, nothing else
    p1, start = steps[1]["prompt_ids"], len(steps[0]["prompt_ids"]) + len(steps[0]["response_ids"])
    assert tok.decode(p1[start:], skip_special_tokens=False) == (
        "\n<|im_start|>user\n<tool_response>\n-4\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )

    assert [s["action"] for s in steps] == [call("5 - 9"), call("-4 + 100"), answer("96")]
    assert [s["feedback"] for s in steps] == ["-4", "96", ""]
    assert [s["reward"] for s in steps] == [0.0, 0.0, 1.0]
    assert [s["done"] for s in steps] == [False, False, True]
    assert [s["truncated"] for s in steps] == [False, False, False]
    assert [s["correct"] for s in steps] == [False, False, True]
    assert [(s["n_calls"], s["n_valid_calls"], s["format_error"]) for s in steps] == [
        (1, 1, False),
        (1, 1, False),
        (0, 0, False),
    ]
    assert {s["traj_id"] for s in steps} == {"a-0"} and {s["group_id"] for s in steps} == {"a"}


def test_response_ids_are_never_reencoded(tok, renderer, eos):
    """The engine samples a non-canonical tokenisation (one id per character); the context keeps it."""

    class CharEngine(ScriptedEngine):
        def generate(self, prompts, sampling, seeds=None):
            out = super().generate(prompts, sampling, seeds)
            fixed = []
            for (g,) in out:
                text = self.tok.decode(g.token_ids[:-1], skip_special_tokens=False)
                ids = [i for ch in text for i in self.tok.encode(ch, add_special_tokens=False)] + [
                    self.eos_id
                ]
                fixed.append([type(g)(token_ids=ids, logprobs=logprobs_for(ids), finish_reason="stop")])
            return fixed

    action = call("60 + 37")
    engine = CharEngine(tok, {Q1: [action, answer("97")]})
    steps = run_episodes(engine, renderer, episodes(row("a", Q1, "97")), **LOOSE)
    chars = [i for ch in action for i in tok.encode(ch, add_special_tokens=False)] + [eos]
    assert chars != enc(tok, action, eos)  # the tokenisation really differs from a re-encoding
    assert steps[0]["response_ids"] == chars
    p0 = steps[0]["prompt_ids"]
    assert steps[1]["prompt_ids"][len(p0) : len(p0) + len(chars)] == chars
    assert steps[0]["action"] == action and steps[1]["reward"] == 1.0


def test_wrong_and_malformed_final_answers(tok, renderer):
    engine = ScriptedEngine(tok, {Q1: [answer("96")], Q2: ["It is 144."], Q3: [answer("9 6")]})
    steps = run_episodes(
        engine, renderer, episodes(row("a", Q1, "97"), row("b", Q2, "144"), row("c", Q3, "96")), **LOOSE
    )
    assert [(s["reward"], s["done"], s["truncated"], s["correct"], s["format_error"]) for s in steps] == [
        (0.0, True, False, False, False),  # well formed, wrong
        (0.0, True, False, False, True),  # no <answer> tags
        (1.0, True, False, True, False),  # "9 6" -> 96 (spaces are dropped by the calc parser)
    ]


# --- every way an episode ends -------------------------------------------------------------------


def test_a_cut_response_is_parsed_by_the_environment_and_the_episode_goes_on(tok, renderer, eos):
    """A response cut at max_response_len is the environment's to judge, as any model output: a cut tool
    call (its tag left open) gets the calc tool's error as feedback and the episode goes on; a cut text
    is calc's final answer without tags. Each is a format error; the stop token that closes a cut turn
    belongs to the next observation."""
    n = len(enc(tok, answer("97"), eos))
    long_call = call("60 + 37 + 0 + 0 + 0 + 0 + 0 + 0 + 0 + 0 + 0 + 0")
    long_text = "Let me think. " * 30 + answer("144")
    assert len(enc(tok, long_call, eos)) > n and len(enc(tok, long_text, eos)) > n
    envs = episodes(row("a", Q1, "97"), row("b", Q2, "144"))
    engine = ScriptedEngine(tok, {Q1: [long_call, answer("97")], Q2: [long_text]})
    steps = run_episodes(engine, renderer, envs, **{**LOOSE, "max_response_len": n})

    a, b = [s for s in steps if s["traj_id"] == "a-0"], [s for s in steps if s["traj_id"] == "b-0"]
    assert len(a) == 2 and len(b) == 1
    for cut, text in ((a[0], long_call), (b[0], long_text)):
        assert cut["response_ids"] == tok.encode(text, add_special_tokens=False)[:n]  # no stop token
        assert len(cut["response_logprobs"]) == n
        assert cut["format_error"] and cut["feedback"].startswith(f"[response cut at {n} tokens]")
        assert not cut["truncated"]
    # a: the cut call is malformed: calc's error message, nothing computed, no reward; the episode goes on
    assert (a[0]["reward"], a[0]["done"], a[0]["n_calls"], a[0]["n_valid_calls"]) == (0.0, False, 1, 0)
    assert "error" in a[0]["feedback"]
    assert (a[1]["reward"], a[1]["done"], a[1]["correct"]) == (1.0, True, True)
    # exact continuity: prompt + cut response + the stop token + the environment's reply
    error = next(m for m in envs[0].env.history if m["role"] == "tool")
    assert a[1]["prompt_ids"] == a[0]["prompt_ids"] + a[0]["response_ids"] + [eos] + renderer.observation(
        [error]
    )
    # b: a cut text is a final answer without <answer> tags: wrong, done
    assert (b[0]["reward"], b[0]["done"], b[0]["correct"]) == (0.0, True, False)
    assert [m["role"] for m in envs[1].env.history] == ["system", "user", "assistant"]


def test_max_steps_without_answer_truncates_the_last_step(tok, renderer):
    engine = ScriptedEngine(tok, {Q1: [call("1 + 1"), call("2 + 2"), call("3 + 3")]})
    steps = run_episodes(engine, renderer, episodes(row("a", Q1, "97")), **{**LOOSE, "max_steps": 2})
    assert [(s["step"], s["done"], s["truncated"], s["reward"]) for s in steps] == [
        (0, False, False, 0.0),
        (1, True, True, 0.0),
    ]
    assert steps[1]["feedback"] == "4" and steps[1]["n_valid_calls"] == 1  # the last call still ran
    assert len(engine.calls) == 2


def test_answer_on_the_last_allowed_turn_is_not_truncated(tok, renderer):
    engine = ScriptedEngine(tok, {Q1: [call("60 + 37"), answer("97")]})
    steps = run_episodes(engine, renderer, episodes(row("a", Q1, "97")), **{**LOOSE, "max_steps": 2})
    assert [(s["done"], s["truncated"], s["reward"]) for s in steps] == [
        (False, False, 0.0),
        (True, False, 1.0),
    ]


def _second_context_len(tok, renderer, eos, r, action) -> int:
    return (
        len(first_prompt(renderer, r)) + len(enc(tok, action, eos)) + len(renderer.observation([tool("97")]))
    )


def test_overlong_context_ends_the_episode_and_truncates_the_last_step(tok, renderer, eos):
    r, action = row("a", Q1, "97"), call("60 + 37")
    limit = _second_context_len(tok, renderer, eos, r, action)
    engine = ScriptedEngine(tok, {Q1: [action, answer("97")]})
    steps = run_episodes(engine, renderer, episodes(r), **{**LOOSE, "max_prompt_len": limit - 1})
    assert len(steps) == 1 and len(engine.calls) == 1
    assert (steps[0]["done"], steps[0]["truncated"], steps[0]["reward"]) == (True, True, 0.0)
    assert steps[0]["response_ids"] == enc(tok, action, eos)  # the step itself is kept as sampled


def test_context_of_exactly_max_prompt_len_is_allowed(tok, renderer, eos):
    r, action = row("a", Q1, "97"), call("60 + 37")
    limit = _second_context_len(tok, renderer, eos, r, action)
    engine = ScriptedEngine(tok, {Q1: [action, answer("97")]})
    steps = run_episodes(engine, renderer, episodes(r), **{**LOOSE, "max_prompt_len": limit})
    assert len(steps) == 2 and len(steps[1]["prompt_ids"]) == limit
    assert (steps[1]["done"], steps[1]["truncated"], steps[1]["reward"]) == (True, False, 1.0)


def test_first_prompt_too_long_gives_one_empty_truncated_step(tok, renderer):
    short, long_ = row("a", Q1, "97"), row("b", "What is 1 + 1? " + "Think about it carefully. " * 20, "2")
    limit = len(first_prompt(renderer, long_)) - 1
    assert len(first_prompt(renderer, short)) <= limit
    engine = ScriptedEngine(tok, {Q1: [answer("97")], long_["question"]: [answer("2")]})
    steps = run_episodes(engine, renderer, episodes(short, long_), **{**LOOSE, "max_prompt_len": limit})
    b = [s for s in steps if s["traj_id"] == "b-0"]
    assert len(b) == 1
    assert b[0]["prompt_ids"] == first_prompt(renderer, long_)
    assert (b[0]["response_ids"], b[0]["response_logprobs"], b[0]["action"]) == ([], [], "")
    assert (b[0]["step"], b[0]["done"], b[0]["truncated"], b[0]["reward"]) == (0, True, True, 0.0)
    # the long prompt never reached the engine; the short one did, once
    assert len(engine.calls) == 1 and engine.calls[0]["prompts"] == [first_prompt(renderer, short)]


# --- malformed tool calls ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad, error, name",
    [
        ("<tool_call>\nnot json\n</tool_call>", "error: tool call is not valid JSON", "invalid_call"),
        (
            '<tool_call>\n{"name": "search", "arguments": {"q": "x"}}\n</tool_call>',
            "error: unknown tool 'search'",
            "search",
        ),
        (
            '<tool_call>\n{"name": "calculator", "arguments": {"expr": "1"}}\n</tool_call>',
            "error: invalid arguments",
            "calculator",
        ),
        (
            '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1 +',
            "error: <tool_call> is missing",
            "invalid_call",
        ),
    ],
)
def test_malformed_call_gives_feedback_and_format_error(tok, renderer, eos, bad, error, name):
    engine = ScriptedEngine(tok, {Q1: [bad, answer("97")]})
    steps = run_episodes(engine, renderer, episodes(row("a", Q1, "97"), malformed_penalty=0.5), **LOOSE)
    s0, s1 = steps
    assert s0["feedback"].startswith(error), s0["feedback"]
    assert (s0["format_error"], s0["n_calls"], s0["n_valid_calls"], s0["done"]) == (True, 1, 0, False)
    assert s0["reward"] == -0.5  # the env's malformed penalty lands on the step
    obs = renderer.observation([tool(s0["feedback"], name=name)])
    assert s1["prompt_ids"] == s0["prompt_ids"] + s0["response_ids"] + obs
    assert s0["feedback"] in tok.decode(obs, skip_special_tokens=False)
    assert (s1["reward"], s1["correct"], s1["done"]) == (1.0, True, True)


def test_one_bad_and_one_good_call_in_one_turn(tok, renderer):
    action = call("6 * 7") + "\n<tool_call>\n{oops}\n</tool_call>"
    engine = ScriptedEngine(tok, {Q1: [action, answer("97")]})
    s0, _ = run_episodes(engine, renderer, episodes(row("a", Q1, "97")), **LOOSE)
    assert (s0["n_calls"], s0["n_valid_calls"], s0["format_error"]) == (2, 1, True)
    assert s0["feedback"].split("\n")[0] == "42" and s0["feedback"].split("\n")[1].startswith("error:")


# --- batching and seeds ------------------------------------------------------------------------------


def test_one_generate_call_per_turn_for_the_active_episodes_only(tok, renderer):
    scripts = {
        Q1: [answer("97")],  # 1 turn
        Q2: [call("12 * 12"), answer("144")],  # 2 turns
        Q3: [call("5 - 9"), call("-4 + 100"), call("96 + 0"), answer("96")],  # 4 turns
    }
    engine = ScriptedEngine(tok, scripts)
    eps = episodes(row("a", Q1, "97"), row("b", Q2, "144"), row("c", Q3, "96"))
    steps = run_episodes(engine, renderer, eps, **LOOSE)
    assert [len(c["prompts"]) for c in engine.calls] == [3, 2, 1, 1]
    # each call carries exactly the contexts of the still-active episodes, in episode order
    by = {(s["traj_id"], s["step"]): s for s in steps}
    expected = [["a-0", "b-0", "c-0"], ["b-0", "c-0"], ["c-0"], ["c-0"]]
    for turn, (c, ids) in enumerate(zip(engine.calls, expected)):
        assert c["prompts"] == [by[(t, turn)]["prompt_ids"] for t in ids]
        assert c["seeds"] == [episode_seed(7, t, turn) for t in ids]
        assert (c["sampling"].max_tokens, c["sampling"].temperature, c["sampling"].top_p) == (128, 1.0, 1.0)
    # records come back grouped by episode, in episode order, steps in order
    assert [(s["traj_id"], s["step"]) for s in steps] == [
        ("a-0", 0),
        ("b-0", 0),
        ("b-0", 1),
        ("c-0", 0),
        ("c-0", 1),
        ("c-0", 2),
        ("c-0", 3),
    ]
    assert all(ep.done for ep in eps)
    assert [s["reward"] for s in steps if s["done"]] == [1.0, 1.0, 1.0]


def test_seeds_do_not_depend_on_batch_composition(tok, renderer):
    scripts = {
        Q1: [call("60 + 37"), answer("97")],
        Q2: [answer("144")],
        Q3: [call("1 + 1"), call("2 + 2"), answer("96")],
    }

    def seeds_of(traj: str, eps: list[Episode]) -> tuple[list[int], list[dict]]:
        engine = ScriptedEngine(tok, scripts)
        steps = run_episodes(engine, renderer, eps, **LOOSE)
        mine = [s for s in steps if s["traj_id"] == traj]
        seen = []
        for c in engine.calls:
            for prompt, seed in zip(c["prompts"], c["seeds"]):
                if any(prompt == s["prompt_ids"] for s in mine):
                    seen.append(seed)
        return seen, mine

    alone, steps_alone = seeds_of("a-0", episodes(row("a", Q1, "97")))
    mixed, steps_mixed = seeds_of(
        "a-0", episodes(row("c", Q3, "96"), row("b", Q2, "144"), row("a", Q1, "97"))
    )
    assert alone == mixed == [episode_seed(7, "a-0", 0), episode_seed(7, "a-0", 1)]
    assert steps_alone == steps_mixed
    # seeds differ across turns, trajectories (samples of one prompt) and the global seed
    assert len({episode_seed(7, "a-0", t) for t in range(8)}) == 8
    assert len({episode_seed(7, f"a-{j}", 0) for j in range(16)}) == 16
    assert episode_seed(7, "a-0", 0) != episode_seed(8, "a-0", 0)
    assert all(0 <= episode_seed(s, "x" * 1000, t) < 2**31 - 1 for s in (0, 10**12) for t in (0, 63))


# --- metrics -------------------------------------------------------------------------------------------


def _rec(
    traj: str, step: int, *, calls=0, valid=0, fmt=False, correct=False, truncated=False, done=None
) -> dict:
    """A step record; ``done`` defaults to: ends the episode when truncated or it is a final turn
    without calls (as run_episodes records them)."""
    if done is None:
        done = truncated or calls == 0
    return {
        "traj_id": traj,
        "step": step,
        "n_calls": calls,
        "n_valid_calls": valid,
        "format_error": fmt,
        "correct": correct,
        "truncated": truncated,
        "done": done,
    }


def test_episode_metrics_by_hand():
    steps = [
        _rec("a", 0, calls=1, valid=1),
        _rec("a", 1, correct=True),
        _rec("b", 0, calls=2, valid=1, fmt=True),
        _rec("b", 1, fmt=True),  # final text without <answer>
        _rec("c", 0, fmt=True, truncated=True),  # cut response
    ]
    m = episode_metrics(steps)
    assert m["accuracy"] == pytest.approx(1 / 3)
    assert m["mean_turns"] == pytest.approx(5 / 3)
    assert m["valid_tool_call_rate"] == pytest.approx(2 / 3)  # (1 + 1) valid of (1 + 2) calls
    assert m["format_error_rate"] == pytest.approx(3 / 5)  # per step
    assert m["truncated_rate"] == pytest.approx(1 / 3)
    assert m["n_episodes"] == 3.0
    assert m["tool_calls_per_step"] == pytest.approx(3 / 5)
    assert m["tool_calls_per_episode"] == pytest.approx(3 / 3)
    assert m["answer_without_tool_rate"] == 0.0  # a and b called a tool, c was cut
    # order of records does not matter
    assert episode_metrics(steps[::-1]) == m


def test_tool_use_metrics_by_hand():
    """2 calls then an answer; an answer at step 0; a response cut at step 1 after a call; an episode
    stopped at max_steps with its last call still run; an untagged final text at step 0."""
    two_calls = [_rec("a", 0, calls=1, valid=1), _rec("a", 1, calls=1, valid=1), _rec("a", 2, correct=True)]
    direct = [_rec("b", 0, correct=True)]
    cut = [_rec("c", 0, calls=1, valid=1), _rec("c", 1, fmt=True, truncated=True)]
    m = episode_metrics(two_calls + direct + cut)
    assert m["tool_calls_per_step"] == pytest.approx(3 / 6)  # 1 + 1 + 0 | 0 | 1 + 0 calls over 6 steps
    assert m["tool_calls_per_episode"] == pytest.approx(3 / 3)
    assert m["answer_without_tool_rate"] == pytest.approx(1 / 3)  # b only
    assert m["mean_turns"] == pytest.approx(6 / 3)
    assert m["format_error_rate"] == pytest.approx(1 / 6)

    # each episode alone
    assert episode_metrics(two_calls)["answer_without_tool_rate"] == 0.0
    assert episode_metrics(two_calls)["tool_calls_per_step"] == pytest.approx(2 / 3)
    assert episode_metrics(direct)["answer_without_tool_rate"] == 1.0
    assert episode_metrics(direct)["tool_calls_per_step"] == 0.0
    assert episode_metrics(cut)["answer_without_tool_rate"] == 0.0
    # truncated without any call (response cut at step 0, or a prompt too long): not an answer
    assert episode_metrics([_rec("d", 0, fmt=True, truncated=True)])["answer_without_tool_rate"] == 0.0
    # stopped at max_steps: the last step is done + truncated and its call ran
    capped = [_rec("e", 0, calls=2, valid=2), _rec("e", 1, calls=1, valid=1, truncated=True, done=True)]
    assert episode_metrics(capped)["tool_calls_per_step"] == pytest.approx(3 / 2)
    assert episode_metrics(capped)["answer_without_tool_rate"] == 0.0
    # an untagged final text is an answer given without a tool (and a format error)
    untagged = [_rec("f", 0, fmt=True)]
    assert episode_metrics(untagged)["answer_without_tool_rate"] == 1.0
    both = episode_metrics(two_calls + direct + cut + capped + untagged)
    assert both["answer_without_tool_rate"] == pytest.approx(2 / 5)
    assert both["tool_calls_per_step"] == pytest.approx(6 / 9)
    assert both["tool_calls_per_episode"] == pytest.approx(6 / 5)


def test_sampled_metrics_by_hand():
    def rec(group, traj, correct):
        return {**_rec(traj, 0, correct=correct), "group_id": group}

    steps = [
        rec("p", "p#0", False),
        rec("p", "p#0", True),  # a correct last step makes the episode correct
        rec("p", "p#1", False),
        rec("q", "q#0", False),
        rec("q", "q#1", False),
        rec("r", "r#0", True),
        rec("r", "r#1", True),
        rec("r", "r#2", False),
    ]
    m = sampled_metrics(steps)
    assert m["sampled_accuracy"] == pytest.approx((1 / 2 + 0 + 2 / 3) / 3)  # mean over prompts, not episodes
    assert m["pass_at_k"] == pytest.approx(2 / 3)
    assert m["samples_per_prompt"] == 2.0  # the smallest group
    assert sampled_metrics(steps[::-1]) == m
    assert sampled_metrics([]) == {"sampled_accuracy": 0.0, "pass_at_k": 0.0, "samples_per_prompt": 0.0}


def test_episode_metrics_without_calls_or_steps():
    assert episode_metrics([_rec("a", 0, correct=True)])["valid_tool_call_rate"] == 0.0
    assert episode_metrics([]) == {
        "accuracy": 0.0,
        "mean_turns": 0.0,
        "tool_calls_per_step": 0.0,
        "tool_calls_per_episode": 0.0,
        "answer_without_tool_rate": 0.0,
        "valid_tool_call_rate": 0.0,
        "format_error_rate": 0.0,
        "truncated_rate": 0.0,
        "n_episodes": 0.0,
    }


def test_episode_metrics_of_a_real_run(tok, renderer, eos):
    scripts = {
        Q1: [call("60 + 37"), "<tool_call>\n[1]\n</tool_call>", answer("97")],  # 3 turns, correct
        Q2: [call("12 * 12"), "Thinking. " * 40],  # 2 turns, the second cut (a final text, no tags)
        Q3: ["the answer is 96"],  # 1 turn, no tags
    }
    n = max(len(enc(tok, a, eos)) for a in scripts[Q1] + scripts[Q2][:1] + scripts[Q3])
    engine = ScriptedEngine(tok, scripts)
    steps = run_episodes(
        engine,
        renderer,
        episodes(row("a", Q1, "97"), row("b", Q2, "144"), row("c", Q3, "96")),
        **{**LOOSE, "max_response_len": n},
    )
    m = episode_metrics(steps)
    assert m["accuracy"] == pytest.approx(1 / 3)
    assert m["mean_turns"] == pytest.approx(6 / 3)
    assert m["valid_tool_call_rate"] == pytest.approx(2 / 3)  # a: 1 good + 1 bad, b: 1 good
    assert m["format_error_rate"] == pytest.approx(3 / 6)  # a's bad call, b's cut, c's untagged answer
    assert m["truncated_rate"] == 0.0  # every episode ended on its own final turn
    assert [s["n_calls"] for s in steps] == [1, 1, 0, 1, 0, 0]  # a's bad call counts as a call
    assert m["tool_calls_per_step"] == pytest.approx(3 / 6)
    assert m["tool_calls_per_episode"] == pytest.approx(3 / 3)
    assert m["answer_without_tool_rate"] == pytest.approx(1 / 3)  # c's untagged final text


# --- policy versions stamped by an in-flight engine -------------------------------------------


class VersionedScriptedEngine(ScriptedEngine):
    """Stamps every generation with the version it holds, one more after each generate call (as an
    in-flight engine whose weights were pushed between two turns)."""

    version = 3

    def generate(self, prompts, sampling, seeds=None):
        out = [
            [replace(g, policy_version=self.version) for g in gens]
            for gens in super().generate(prompts, sampling, seeds)
        ]
        self.version += 1
        return out


def test_the_version_an_engine_stamps_is_each_steps_and_a_step_without_generation_has_none(tok, renderer):
    short, long_ = row("a", Q3, "96"), row("b", "What is 1 + 1? " + "Think about it carefully. " * 20, "2")
    limit = len(first_prompt(renderer, long_)) - 1
    engine = VersionedScriptedEngine(
        tok, {Q3: [call("5 - 9"), answer("96")], long_["question"]: [answer("2")]}
    )
    steps = run_episodes(engine, renderer, episodes(short, long_), **{**LOOSE, "max_prompt_len": limit})
    by_traj = {t: [s["policy_version"] for s in steps if s["traj_id"] == t] for t in ("a-0", "b-0")}
    assert by_traj == {"a-0": [3, 4], "b-0": [None]}  # b's overlong first prompt was never generated


def test_rows_have_no_policy_version_when_the_engine_stamps_none(tok, renderer, eos):
    engine = ScriptedEngine(tok, {Q3: [call("5 - 9"), answer("96")]})
    steps = run_episodes(engine, renderer, episodes(row("a", Q3, "96")), **LOOSE)
    assert len(steps) == 2 and not any("policy_version" in s for s in steps)
