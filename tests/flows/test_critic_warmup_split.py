"""flows/critic_warmup.py's episodes and their split: which prompts the warm-up plays (each once,
then again when there are more episodes than prompts), and train / selection / report splits of
whole prompts, none empty; the params accept at load exactly the settings whose split has no empty
part (counted in prompts, not episodes)."""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import yaml

from components.config import ConfigError, apply_overrides, parse_params
from flows import REPO
from flows.critic_warmup import pick_prompts, split_trajectories


def rows(n: int) -> list[dict]:
    return [{"traj_id": f"t{t}", "step": s} for t in range(n) for s in range(2)]


def test_three_disjoint_splits_of_whole_trajectories():
    train, select, report = split_trajectories(rows(10), held_out=0.2, seed=0)
    ids = [{r["traj_id"] for r in part} for part in (train, select, report)]
    assert [len(i) for i in ids] == [8, 1, 1]
    assert not (ids[0] & ids[1] or ids[0] & ids[2] or ids[1] & ids[2])
    assert len(train) + len(select) + len(report) == 20  # every step row, trajectories kept whole


def test_a_prompts_episodes_stay_in_one_split():
    # three episodes of each of 10 prompts: a held-out prompt's episodes are all held out, so no
    # start state the report measures was fitted
    rows3 = [
        {"traj_id": f"p{p}-{k}", "group_id": f"p{p}", "step": s}
        for p in range(10)
        for k in range(3)
        for s in range(2)
    ]
    parts = split_trajectories(rows3, held_out=0.2, seed=0)
    groups = [{r["group_id"] for r in part} for part in parts]
    assert [len(g) for g in groups] == [8, 1, 1]
    assert not (groups[0] & groups[1] or groups[0] & groups[2] or groups[1] & groups[2])
    assert [len(part) for part in parts] == [48, 6, 6]


@pytest.mark.parametrize(("n", "held_out"), [(1, 0.2), (3, 0.2), (4, 0.99)])
def test_an_empty_split_names_the_keys(n, held_out):
    with pytest.raises(ValueError, match=r"critic_warmup\.episodes.*critic_warmup\.held_out"):
        split_trajectories(rows(n), held_out=held_out, seed=0)


def prompts(n: int) -> list[dict]:
    return [{"id": i} for i in range(n)]


def test_no_more_episodes_than_prompts_plays_each_picked_prompt_once():
    picked = pick_prompts(prompts(10), 6, seed=0)
    assert len(picked) == 6
    assert all(k == 0 for _, k in picked)
    assert len({row["id"] for row, _ in picked}) == 6
    assert picked == pick_prompts(prompts(10), 6, seed=0)  # drawn with the seed
    assert picked != pick_prompts(prompts(10), 6, seed=1)


@pytest.mark.parametrize("episodes", [10, 23, 30])
def test_more_episodes_than_prompts_play_every_prompt_again_evenly(episodes):
    picked = pick_prompts(prompts(10), episodes, seed=0)
    assert len(picked) == episodes
    per_prompt = Counter(row["id"] for row, _ in picked)
    assert set(per_prompt) == set(range(10))
    assert max(per_prompt.values()) - min(per_prompt.values()) <= 1
    # (prompt, repeat) pairs are unique: each episode gets its own trajectory id
    assert len({(row["id"], k) for row, k in picked}) == episodes


def test_no_prompts_give_no_episodes():
    # a train split with no RL prompt left: nothing to play (the split then names the keys), no endless loop
    assert pick_prompts([], 10, seed=0) == []


RAW = yaml.safe_load((REPO / "params.yaml").read_text())


def _loads(episodes: int, held_out: float, rl_prompts: int) -> str | None:
    """The load-time error for these settings with ``rl_prompts`` RL prompts (calc generates
    prepare.n_train train rows; the first sft.rows train SFT), None when accepted."""
    try:
        parse_params(
            apply_overrides(
                copy.deepcopy(RAW),
                {
                    "task": "calc",
                    "prepare.n_train": 100,
                    "sft.rows": 100 - rl_prompts,
                    "critic_warmup.episodes": episodes,
                    "critic_warmup.held_out": held_out,
                },
                "params.yaml",
            )
        )
    except ConfigError as err:
        return str(err)
    return None


@pytest.mark.parametrize("held_out", [0.2, 0.5, 0.9])
@pytest.mark.parametrize("rl_prompts", [3, 5, 12])
def test_the_load_check_accepts_exactly_what_the_split_of_the_played_prompts_accepts(held_out, rl_prompts):
    # episodes beyond the RL prompts replay them: the split sees min(episodes, rl_prompts) prompts
    for episodes in range(1, 16):
        played = pick_prompts([{"id": i} for i in range(rl_prompts)], episodes, seed=0)
        steps = [{"traj_id": f"w-{row['id']}-{k}", "group_id": f"w-{row['id']}"} for row, k in played]
        try:
            split_trajectories(steps, held_out=held_out, seed=0)
            splits = True
        except ValueError:
            splits = False
        assert (_loads(episodes, held_out, rl_prompts) is None) == splits, (episodes, held_out, rl_prompts)


def test_more_episodes_than_prompts_are_refused_at_load_with_advice_that_helps():
    # 20 episodes over 5 RL prompts: held_out 0.2 holds out 1 prompt. The old check counted 20
    # episodes (4 held out) and let the stage fail after the whole rollout, advising more episodes.
    msg = _loads(20, 0.2, rl_prompts=5)
    assert msg is not None
    for words in (
        "critic_warmup.episodes=20",
        "critic_warmup.held_out=0.2",
        "play 5 prompt(s)",
        "= 1 of them",
    ):
        assert words in msg, (words, msg)
    assert "prepare.n_train=100 - sft.rows=95" in msg and "raise prepare.n_train or lower sft.rows" in msg
    assert "critic_warmup.held_out above 1/5 and at most 4/5" in msg
    assert "episodes=6 or more" not in msg and "more episodes only replay the same 5" in msg
    assert _loads(20, 0.4, rl_prompts=5) is None  # the advice taken: 2 of 5 held out
    # fewer episodes than prompts: more episodes do help, and the message says how many
    msg = _loads(4, 0.2, rl_prompts=12)
    assert msg is not None and "set critic_warmup.episodes=6 or more" in msg
    assert _loads(6, 0.2, rl_prompts=12) is None
