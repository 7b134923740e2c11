"""The agent loop: drives environments with a rollout engine and emits one record per agent step."""
