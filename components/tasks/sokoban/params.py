"""The sokoban task's params section, ``tasks.sokoban`` in params.yaml."""

from __future__ import annotations

from pydantic import Field, model_validator

from components.tasks.recipe import TaskParams

__all__ = ["SokobanParams"]


class SokobanParams(TaskParams):
    # Room size (walls included) and boxes per level.
    height: int = Field(6, ge=4, le=12)
    width: int = Field(6, ge=4, le=12)
    boxes: int = Field(1, ge=1, le=3)
    # Difficulty: the length (moves) of a level's shortest solution, found by breadth-first search.
    min_moves: int = Field(2, ge=1, le=40)
    max_moves: int = Field(10, ge=1, le=40)
    # Rewards (RAGEN / gym-sokoban): every move, a box pushed onto / off a target, all boxes placed;
    # an invalid action (no move) costs step_penalty + invalid_penalty.
    step_penalty: float = Field(-0.1, le=0)
    box_on_target: float = Field(1.0, ge=0)
    box_off_target: float = Field(-1.0, le=0)
    success_reward: float = Field(10.0, ge=0)
    invalid_penalty: float = Field(0.0, le=0)
    # Below the grid, one line per unplaced box: its offset from the player and its nearest target's
    # offset from it ("box: down 1 right 2; target: up 2 from box"). Off = the grid alone (RAGEN).
    offsets: bool = True
    # After a move that changed nothing (into a wall, or a box that cannot move), the observation starts
    # with the line "Nothing moved." (text games' "Nothing happens."). Off (the default) = an unchanged
    # grid only, as RAGEN shows it.
    blocked_note: bool = False
    # Remedies for greedy agents that bump into a wall again and again (docs/evaluation.md), off by
    # default. repeat_hint: BALROG's line "It doesn't make sense to repeat the same action over and
    # over if the observation doesn't change." ends the system prompt of every episode (rollouts,
    # validation, evaluation; SFT's demonstrations keep the prompt without it). noop_penalty: added to
    # the reward of a valid move that changed nothing (into a wall, or a box that cannot move), besides
    # step_penalty; an unparseable reply costs invalid_penalty instead. 0 = off.
    repeat_hint: bool = False
    noop_penalty: float = Field(0.0, le=0, ge=-10)
    # Weaker demonstrations beside the expert's (train split): a player who at each turn makes a random
    # move with probability weak_epsilon and otherwise a shortest-solution move; only its episodes that
    # end solved within max_moves + weak_extra_moves moves are kept. weak_per_question per level on
    # average (0 = expert demonstrations only). imitate_detours: SFT imitates the random moves too
    # (true), or reads them as context only (false: the reply has weight 0, so SFT learns the way back
    # from a detour and not the detour; a random move that is the solver's next move stays a label).
    weak_per_question: float = Field(0.0, ge=0, le=16)
    weak_epsilon: float = Field(0.25, ge=0, le=1)
    weak_extra_moves: int = Field(4, ge=0, le=40)
    imitate_detours: bool = True

    @model_validator(mode="after")
    def _bounds(self) -> SokobanParams:
        if self.min_moves > self.max_moves:
            raise ValueError(f"min_moves={self.min_moves} > max_moves={self.max_moves}")
        inner = (self.height - 2) * (self.width - 2)
        if inner < self.boxes + 2:
            raise ValueError(
                f"a {self.height}x{self.width} room has {inner} inner cells, too few for {self.boxes} boxes"
            )
        return self

    def turns_needed(self) -> int | None:
        return self.max_moves  # one move per turn: the expert's longest episode

    def env_settings(self) -> dict[str, float | bool]:
        """The settings the environment reads (saved by prepare as env.json)."""
        return {
            "step_penalty": self.step_penalty,
            "box_on_target": self.box_on_target,
            "box_off_target": self.box_off_target,
            "success_reward": self.success_reward,
            "invalid_penalty": self.invalid_penalty,
            "offsets": self.offsets,
            "blocked_note": self.blocked_note,
            "repeat_hint": self.repeat_hint,
            "noop_penalty": self.noop_penalty,
        }
