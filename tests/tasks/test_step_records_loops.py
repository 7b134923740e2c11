"""The loop metrics of components/tasks/step_records.py on hand-made episodes with known counts, and on
a sokoban episode played on the real environment (through its metrics hook)."""

from __future__ import annotations

import pytest

from components.tasks.sokoban import make_env
from components.tasks.sokoban.metrics import episode_metrics
from components.tasks.step_records import episode_loops, loop_metrics, loop_steps


def episode(traj_id: str, keys: list[str], actions: list[str]) -> list[dict]:
    return [
        {"traj_id": traj_id, "step": t, "obs_key": k, "action": a}
        for t, (k, a) in enumerate(zip(keys, actions))
    ]


def test_a_noop_sent_again_is_a_loop_a_new_action_is_not():
    # A: up bumps (A again), up again (loop), up again (loop), right moves to B, left back to A (revisit)
    traj = episode("e", ["A", "A", "A", "A", "B", "A"], ["up", "up", " UP ", "right", "left", "left"])
    repeats, revisits = loop_steps(traj)
    assert repeats == [False, True, True, False, False, False]  # case and outer white space ignored
    assert revisits == [False, True, True, True, False, True]
    assert episode_loops(traj) == {"e": {"loop_rate": 2 / 6, "revisit_rate": 4 / 6}}


def test_the_same_action_that_moved_is_no_loop():
    # walking right along a corridor: the same reply every turn, a new state every turn
    traj = episode("w", ["A", "B", "C", "D"], ["right"] * 4)
    assert loop_steps(traj) == ([False] * 4, [False] * 4)


def test_metrics_average_over_episodes_in_any_record_order():
    looping = episode("a", ["A", "A", "A"], ["up"] * 3)  # 2 loops of 3 steps
    clean = episode("b", ["A", "B"], ["left", "up"])
    records = list(reversed(looping + clean))
    assert loop_metrics(records) == pytest.approx(
        {"loop_rate": (2 / 3 + 0) / 2, "revisit_rate": (2 / 3 + 0) / 2, "looping_episodes": 0.5}
    )


def test_episodes_without_state_keys_have_no_loop_metrics():
    assert loop_metrics(episode("c", ["", ""], ["x", "x"])) == {}
    with pytest.raises(ValueError, match="step record 0 has no 'traj_id' or 'step'"):
        episode_loops([{"obs_key": "A"}])


def test_sokoban_episode_into_a_wall():
    """Up into the top wall three times, then right (pushes the box): 2 loops and 3 revisits in 4 turns."""
    env = make_env()
    env.reset({"id": "r", "level": "#######\n#@$ .##\n#######"})
    records = []
    for t, action in enumerate(["up", "up", "up", "right"]):
        key = env.state_key()
        reply = f"<action>{action}</action>"
        out = env.step(reply)
        records.append({"traj_id": "r", "step": t, "obs_key": key, "action": reply, "reward": out.reward,
                        "correct": out.info["correct"], "task_metrics": out.info["task_metrics"]})  # fmt: skip
    m = episode_metrics(records)
    assert m["loop_rate"] == pytest.approx(2 / 4) and m["revisit_rate"] == pytest.approx(3 / 4)
    assert m["looping_episodes"] == 1.0
