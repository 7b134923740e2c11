"""Task recipes: one folder per task (data, environment, tools, reward, prompts), registered by name.

``components.envs.get_task(name)`` imports ``components.tasks.<name>`` on first use.
"""
