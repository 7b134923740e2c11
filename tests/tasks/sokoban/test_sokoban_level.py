"""Sokoban levels: push rules pinned by hand, the generator's levels solved by the solver, text forms."""

from __future__ import annotations

import random

import pytest

from components.tasks.sokoban.level import (
    Level,
    State,
    apply,
    crop_walls,
    generate,
    offsets,
    parse_xsb,
    render,
    replay,
    solve,
    to_xsb,
)

# A 7x5 room: the player left of a box, a target two cells right of the box, a second box further down.
ROOM = "\n".join(
    [
        "#######",
        "#@$ . #",
        "#     #",
        "# $$  #",
        "#######",
    ]
)


def test_parse_and_xsb_round_trip():
    level, state = parse_xsb(ROOM.replace("# $$  #", "#     #"))
    assert (level.height, level.width) == (5, 7)
    assert state.player == (1, 1) and state.boxes == frozenset({(1, 2)})
    assert level.targets == frozenset({(1, 4)})
    assert to_xsb(level, state) == ROOM.replace("# $$  #", "#     #")


def test_push_box_onto_target():
    level, state = parse_xsb("#######\n#@$ .##\n#######")
    state, moved = apply(level, state, "right")
    assert moved and state.player == (1, 2) and state.boxes == {(1, 3)}
    state, moved = apply(level, state, "right")
    assert moved and state.boxes == {(1, 4)} and state.boxes <= level.targets


def test_push_into_wall_does_not_move():
    level, state = parse_xsb("#####\n# @$#\n#.  #\n#####")
    after, moved = apply(level, state, "right")
    assert not moved and after == state


def test_walk_into_wall_does_not_move():
    level, state = parse_xsb("####\n#@$#\n#. #\n####")
    after, moved = apply(level, state, "up")
    assert not moved and after == state


def test_push_box_into_box_does_not_move():
    level, state = parse_xsb("######\n#@$$ #\n#..  #\n######")
    after, moved = apply(level, state, "right")
    assert not moved and after == state


def test_box_off_target_then_back():
    level, state = parse_xsb("######\n#@*  #\n######")
    state, moved = apply(level, state, "right")
    assert moved and state.boxes == {(1, 3)} and not (state.boxes <= level.targets)


def test_solver_finds_shortest_solution():
    level, state = parse_xsb("#######\n#@$ .##\n#######")
    assert solve(level, state) == ["right", "right"]
    # Box in a corner that is not a target: unsolvable.
    level, state = parse_xsb("#####\n#$ .#\n# @ #\n#####")
    assert solve(level, state) is None
    # Already solved.
    level, state = parse_xsb("####\n#@*#\n####")
    assert solve(level, state) == []


@pytest.mark.parametrize(
    ("height", "width", "boxes", "min_moves", "max_moves"),
    [(6, 6, 1, 2, 10), (6, 6, 1, 6, 12), (7, 7, 2, 3, 14), (5, 8, 1, 1, 5)],
)
def test_every_generated_level_is_solved_by_the_solver(height, width, boxes, min_moves, max_moves):
    rng = random.Random(f"{height}{width}{boxes}")
    for _ in range(40):
        level, start, solution = generate(
            rng, height=height, width=width, boxes=boxes, min_moves=min_moves, max_moves=max_moves
        )
        assert (level.height, level.width) == (height, width) and len(start.boxes) == boxes
        assert min_moves <= len(solution) <= max_moves
        assert not start.boxes <= level.targets
        assert replay(level, start, solution).boxes <= level.targets
        assert solve(level, start) == solution  # the stored solution is the solver's (shortest)
        assert all(level.free(b) for b in start.boxes) and level.free(start.player)
        # The enclosing wall is intact.
        assert all((0, c) in level.walls and (height - 1, c) in level.walls for c in range(width))


def test_generate_rejects_impossible_bounds():
    with pytest.raises(ValueError, match="widen the bounds"):
        generate(random.Random(0), height=4, width=4, boxes=1, min_moves=30, max_moves=40, max_tries=50)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty level"),
        ("####\n#@$#\n####", "1 boxes and 0 targets"),
        ("####\n# $.#\n####", "0 players"),
        ("####\n#@$.#\n#@  #\n####", "2 players"),
        ("####\n#@$x#\n####", "row 1 column 3: unknown cell 'x'"),
    ],
)
def test_parse_errors_name_the_problem(text, message):
    with pytest.raises(ValueError, match=message):
        parse_xsb(text)


def test_offsets_name_each_unplaced_box_and_its_nearest_free_target():
    # Two boxes: one already on a target (no line), one whose nearest free target is two rows down.
    rows = [r.split() for r in ["P X _", "_ _ *", "O _ O"]]
    assert offsets(rows) == ["box: right 1; target: down 2 left 1 from box"]
    # The player standing on the only free target: that target still counts, seen from the box.
    assert offsets([["X", "_", "S"]]) == ["box: left 2; target: right 2 from box"]
    assert offsets([["P", "*"]]) == []


def test_render_crops_the_enclosing_wall_and_uses_one_symbol_per_cell():
    level, state = parse_xsb("######\n##@$.#\n#    #\n######")
    assert render(level, state, with_offsets=False) == "# P X O\n_ _ _ _"
    assert render(level, state) == "# P X O\n_ _ _ _\nbox: right 1; target: right 1 from box"
    assert crop_walls([["#", "#"], ["#", "#"]]) == []
    # A state key is the same for equal states and differs otherwise.
    moved, _ = apply(level, state, "right")
    assert state.key() == State(state.player, state.boxes).key() != moved.key()
    assert isinstance(level, Level)
