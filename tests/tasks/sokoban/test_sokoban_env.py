"""The sokoban environment through GymTextEnv: rewards, invalid actions, hostile replies, demonstrations."""

from __future__ import annotations

import json

import pytest

from components.tasks.sokoban import initial_messages, make_env, parse_action
from components.tasks.sokoban.generator import make_splits, weak_play
from components.tasks.sokoban.metrics import episode_metrics
from components.tasks.sokoban.params import SokobanParams

ROW = {"id": "r0", "question": "P X _ O", "level": "#######\n#@$ .##\n#######", "answer": "right right"}


def act(name: str) -> str:
    return f"<action>{name}</action>"


def test_rewards_follow_ragen():
    env = make_env()
    env.reset(ROW)
    out = env.step(act("right"))  # box one step closer: just the step penalty
    assert out.reward == pytest.approx(-0.1) and not out.done and not out.info["correct"]
    assert out.messages == [{"role": "user", "content": "_ P X O\nbox: right 1; target: right 1 from box"}]
    out = env.step(act("right"))  # box on target, all boxes placed: -0.1 + 1 + 10
    assert out.reward == pytest.approx(10.9) and out.done and out.info["correct"] and not out.truncated
    assert json.loads(out.info["task_metrics"]) == {
        "boxes_on_target": 1.0,
        "success": 1.0,
        "invalid_action": 0.0,
    }


def test_box_off_target_is_penalised():
    env = make_env()
    env.reset({**ROW, "level": "#######\n#@*  #\n#######"})
    out = env.step(act("right"))
    assert out.reward == pytest.approx(-0.1 - 1.0) and not out.done


def test_invalid_action_is_feedback_without_a_move():
    env = make_env(malformed_penalty=-0.5)
    env.reset(ROW)
    key = env.state_key()
    out = env.step("I will go right")
    assert not out.done and out.info["invalid_action"] and out.info["format_error"]
    assert out.reward == pytest.approx(-0.1 - 0.5)
    assert out.messages[0]["content"].startswith("Invalid action: reply with one of <action>up</action>")
    assert out.messages[0]["content"].endswith("\nP X _ O\nbox: right 1; target: right 2 from box")
    assert env.state_key() == key  # nothing moved


def test_a_move_that_changes_nothing_says_so():
    """Into a wall (up from the top row) and a box pushed into a wall: the grid is unchanged and the
    observation starts with "Nothing moved."; the next real move has no note; reset has none."""
    env = make_env(blocked_note=True)
    first = env.reset(ROW)[-1]["content"]
    assert "Nothing moved." not in first
    out = env.step(act("up"))
    assert out.reward == pytest.approx(-0.1) and not out.info.get("invalid_action")
    assert out.messages == [
        {"role": "user", "content": "Nothing moved.\nP X _ O\nbox: right 1; target: right 2 from box"}
    ]
    assert env.step(act("right")).messages[0]["content"] == "_ P X O\nbox: right 1; target: right 1 from box"
    grid = env.reset({**ROW, "level": "######\n#@$#.#\n######"})[-1]["content"]  # box against a wall
    start = grid[grid.index("P X # O") :]
    assert env.step(act("right")).messages[0]["content"] == "Nothing moved.\n" + start


def test_the_note_is_off_by_default_and_old_data_has_none(tmp_path):
    env = make_env()
    env.reset(ROW)
    assert env.step(act("up")).messages[0]["content"] == "P X _ O\nbox: right 1; target: right 2 from box"
    for saved in ({"blocked_note": False}, {}):  # {}: an env.json written before the note existed
        (tmp_path / "env.json").write_text(json.dumps(saved))
        env = make_env(data_dir=tmp_path)
        env.reset(ROW)
        assert env.step(act("up")).messages[0]["content"] == "P X _ O\nbox: right 1; target: right 2 from box"


def test_demonstrations_carry_the_note_after_a_bump():
    from components.tasks.sokoban.generator import demonstration
    from components.tasks.sokoban.level import parse_xsb

    level, start = parse_xsb(ROW["level"])
    messages = demonstration(level, start, ["up", "right", "right"], blocked_note=True)
    assert [m["role"] for m in messages] == ["assistant", "user", "assistant", "user", "assistant"]
    assert messages[1]["content"].startswith("Nothing moved.\n") and "Nothing" not in messages[3]["content"]
    plain = demonstration(level, start, ["up", "right", "right"])
    assert plain[1]["content"] == "P X _ O\nbox: right 1; target: right 2 from box"


def test_offsets_can_be_turned_off(tmp_path):
    (tmp_path / "env.json").write_text(json.dumps({"offsets": False}))
    env = make_env(data_dir=tmp_path)
    env.reset(ROW)
    assert env.step(act("right")).messages == [{"role": "user", "content": "_ P X O"}]


def test_state_key_follows_the_state():
    env = make_env()
    env.reset(ROW)
    k0 = env.state_key()
    env.step(act("left"))  # into the wall: no move, same state
    assert env.state_key() == k0
    env.step(act("right"))
    assert env.state_key() != k0


HOSTILE = [
    "",
    " ",
    "<action></action>",
    "<action>UP</action><action>down</action>",
    "<action>jump</action>",
    "<action>" + "u" * 10_000 + "</action>",
    "<action>up",
    "up</action>",
    "<ACTION>up</ACTION>",
    "\x00\ud800<action>\u202eup</action>",
    "<action>__import__('os').system('echo pwned')</action>",
    "{" * 5000,
    "<action>" * 3000,
    "x" * 1_000_000,
]


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_replies_never_raise(text):
    env = make_env()
    env.reset(ROW)
    out = env.step(text)
    assert not out.done and out.info["invalid_action"]
    assert out.messages[0]["content"].startswith("Invalid action:") and len(out.messages[0]["content"]) < 400


@pytest.mark.parametrize(
    ("text", "index"), [(act("up"), 0), (act(" Down "), 1), ("go <action>left</action>", 2)]
)
def test_parse_action_accepts_one_tagged_move(text, index):
    assert parse_action(text) == index


def test_step_before_reset_and_after_done_raise_for_the_caller():
    env = make_env()
    with pytest.raises(RuntimeError, match="before reset"):
        env.step(act("up"))
    env.reset(ROW)
    env.step(act("right"))
    env.step(act("right"))
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step(act("up"))


def test_demonstrations_replay_in_the_environment(tmp_path):
    p = SokobanParams(weak_per_question=2.0)
    splits = make_splits(p, seed=1, n_train=30, n_val=5, n_test=5, data_dir=tmp_path)
    assert json.loads((tmp_path / "env.json").read_text())["success_reward"] == 10.0
    ids = [r for s in splits.values() for r in s["level"].to_list()]
    assert len(ids) == len(set(ids)) == 40  # no level in two splits
    n_weak = 0
    for row in splits["train"].to_dicts():
        demos = [json.loads(row["expert"]), *json.loads(row["weak"] or "[]")]
        n_weak += len(demos) - 1
        assert len(demos[0]) == 2 * row["n_calls"] - 1
        for demo in demos:
            env = make_env(data_dir=tmp_path)
            assert env.reset(row) == initial_messages(row)
            for i, m in enumerate(demo):
                if m["role"] != "assistant":
                    continue
                out = env.step(m["content"])
                if i + 1 < len(demo):
                    assert out.messages[0]["content"] == demo[i + 1]["content"] and not out.done
            assert out.done and out.info["correct"]
    assert n_weak >= 40  # two per level on average, nearly all of them solved


def test_weak_player_with_epsilon_zero_is_the_expert():
    import random

    from components.tasks.sokoban.level import parse_xsb, solve

    level, start = parse_xsb("#######\n#@$ . #\n#     #\n#######")
    assert weak_play(random.Random(0), level, start, epsilon=0.0, limit=10) == (solve(level, start), [])
    assert weak_play(random.Random(0), level, start, epsilon=0.0, limit=1) is None  # out of moves


def test_episode_metrics_by_hand():
    def step(traj, k, reward, correct=False, boxes=0.0, invalid=0.0):
        tm = json.dumps({"boxes_on_target": boxes, "success": float(correct), "invalid_action": invalid})
        return {"traj_id": traj, "step": k, "reward": reward, "correct": correct, "task_metrics": tm}

    steps = [
        step("a", 0, -0.1),
        step("a", 1, 10.9, correct=True, boxes=1.0),
        step("b", 0, -0.1, invalid=1.0),
        step("b", 1, -0.1),
        step("b", 2, -1.1),
    ]
    m = episode_metrics(steps)
    assert m == pytest.approx(
        {
            "success_rate": 0.5,
            "steps_to_solve": 2.0,
            "invalid_action_rate": 0.2,
            "boxes_on_target": 0.5,
            "return": (10.8 + -1.3) / 2,
        }
    )


def test_the_prepare_outputs_settings_replace_the_arguments(tmp_path):
    assert make_env(step_penalty=-0.5).invalid_reward == pytest.approx(-0.5)  # no env.json: the arguments
    (tmp_path / "env.json").write_text(json.dumps({"step_penalty": -0.2, "blocked_note": True}))
    env = make_env(data_dir=tmp_path, step_penalty=-0.5, blocked_note=False)
    assert env.invalid_reward == pytest.approx(-0.2)  # the data were made with env.json's settings
    env.reset({**ROW, "level": "######\n#@$#.#\n######"})
    assert env.step(act("right")).messages[0]["content"].startswith("Nothing moved.\n")


def test_noop_penalty_lands_on_a_blocked_move_only():
    """noop_penalty (a valid move that changed nothing) is not invalid_penalty (an unparseable reply):
    into the wall and a box pushed into a wall pay it; a real move and an invalid reply do not."""
    env = make_env(noop_penalty=-0.5)
    env.reset(ROW)
    assert env.step(act("up")).reward == pytest.approx(-0.1 - 0.5)  # the top wall
    assert env.step("no move here").reward == pytest.approx(-0.1)  # invalid: invalid_penalty (0)
    assert env.step(act("right")).reward == pytest.approx(-0.1)  # the box moves
    env.reset({**ROW, "level": "######\n#.@$##\n######"})
    assert env.step(act("right")).reward == pytest.approx(-0.1 - 0.5)  # the box cannot move
    off = make_env()
    off.reset(ROW)
    assert off.step(act("up")).reward == pytest.approx(-0.1)  # off by default


def test_repeat_hint_ends_the_system_prompt_only_when_on(tmp_path):
    from components.tasks.prompts import REPEAT_HINT

    assert REPEAT_HINT == (
        "It doesn't make sense to repeat the same action over and over if the observation doesn't change."
    )
    system = make_env().reset(ROW)[0]["content"]
    assert REPEAT_HINT not in system
    assert make_env(repeat_hint=True).reset(ROW)[0]["content"] == f"{system} {REPEAT_HINT}"
    # through the prepare output, as a stage makes the env: both remedies from tasks.sokoban
    settings = SokobanParams(repeat_hint=True, noop_penalty=-0.25).env_settings()
    (tmp_path / "env.json").write_text(json.dumps(settings))
    env = make_env(data_dir=tmp_path)
    assert env.reset(ROW)[0]["content"].endswith(REPEAT_HINT)
    assert env.step(act("up")).reward == pytest.approx(-0.1 - 0.25)
    # data prepared before the remedies: neither
    old = {k: v for k, v in settings.items() if k not in ("repeat_hint", "noop_penalty")}
    (tmp_path / "env.json").write_text(json.dumps(old))
    env = make_env(data_dir=tmp_path)
    assert REPEAT_HINT not in env.reset(ROW)[0]["content"]
    assert env.step(act("up")).reward == pytest.approx(-0.1)


def test_detours_as_context_only_change_the_labels_not_the_moves():
    """weak_play names the random moves that were not the solver's next move; the demonstration gives
    exactly those weight 0, and the same moves with the same grids otherwise."""
    import random

    from components.tasks.sokoban.generator import demonstration
    from components.tasks.sokoban.level import apply, parse_xsb, solve

    level, start = parse_xsb("#######\n#@$ . #\n#     #\n#######")
    plan = solve(level, start)
    played = None
    for seed in range(50):  # a seed whose careless player detours and still solves
        played = weak_play(random.Random(seed), level, start, epsilon=0.5, limit=12)
        if played is not None and played[1]:
            break
    assert played is not None and played[1]
    moves, detours = played
    assert weak_play(random.Random(seed), level, start, epsilon=0.5, limit=12) == played  # seeded
    # replay: a detour is a move other than the solver's next move from where the player stood
    state = start
    for i, move in enumerate(moves):
        if i in detours:
            assert move != solve(level, state)[0]
        state, _ = apply(level, state, move)
    plain = demonstration(level, start, moves)
    marked = demonstration(level, start, moves, context_only=detours)
    assert [{k: v for k, v in m.items() if k != "weight"} for m in marked] == plain
    weights = [m.get("weight", 1) for m in marked if m["role"] == "assistant"]
    assert weights == [0 if i in detours else 1 for i in range(len(moves))]
    assert weak_play(random.Random(0), level, start, epsilon=0.0, limit=10) == (plan, [])


def test_splits_with_detours_as_context_only(tmp_path):
    """imitate_detours=False: the same train split but for weight 0 on some weak replies."""
    imitated = make_splits(SokobanParams(weak_per_question=2.0), seed=1, n_train=30, n_val=5, n_test=5)
    marked = make_splits(
        SokobanParams(weak_per_question=2.0, imitate_detours=False), seed=1, n_train=30, n_val=5, n_test=5
    )

    def weak(split, strip):
        demos = [d for w in split["train"]["weak"].to_list() for d in json.loads(w or "[]")]
        return [[{k: v for k, v in m.items() if not (strip and k == "weight")} for m in d] for d in demos]

    assert weak(marked, strip=True) == weak(imitated, strip=False)
    weights = [m.get("weight") for d in weak(marked, strip=False) for m in d if m["role"] == "assistant"]
    assert weights.count(0) > 0 and weights.count(None) > weights.count(0)
    assert marked["train"]["expert"].to_list() == imitated["train"]["expert"].to_list()
