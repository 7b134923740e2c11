"""steprl's sokoban task as a verifiers environment: ``vf-eval steprl-sokoban``.

verifiers resolves the id ``steprl-sokoban`` to this package (``steprl_sokoban``) and takes its
Taskset, Env and Harness from ``__all__``: steprl's generated levels, one episode stepped by steprl's
sokoban environment with its reward, played by verifiers' chat program (components/envs/
verifiers_export.py). ``--env.taskset.params`` is the ``tasks.sokoban`` section of params.yaml.
"""

from components.envs.verifiers_export import LocalChatHarness, StepRLEnv, StepRLTaskset


class SokobanTaskset(StepRLTaskset):
    TASK = "sokoban"


class SokobanEnv(StepRLEnv):
    pass


class SokobanHarness(LocalChatHarness):
    pass


__all__ = ["SokobanEnv", "SokobanHarness", "SokobanTaskset"]
