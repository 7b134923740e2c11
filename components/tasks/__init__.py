"""Task recipes: one folder per built-in task (data, environment, tools, reward, prompts, params
section), registered by name (see ``components.tasks.recipe``).

``components.envs.get_task(name)`` imports ``components.tasks.<name>`` on first use; tasks outside
this package register themselves when imported (params ``plugins``).
"""
