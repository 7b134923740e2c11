"""Readable Markdown of sampled trajectories (prompt, actions, tool feedback, rewards) for MLflow."""

from __future__ import annotations

from typing import Any


def render_samples(steps: list[dict], limit: int = 20, tokenizer: Any = None, prompt_chars: int = 240) -> str:
    """Markdown of the first ``limit`` trajectories; with a tokenizer, the end of each first prompt."""
    by_traj: dict[str, list[dict]] = {}
    for s in steps:
        by_traj.setdefault(s["traj_id"], []).append(s)
    out = []
    for traj_id, traj in list(by_traj.items())[:limit]:
        ret = sum(s["reward"] for s in traj)
        status = "correct" if any(s.get("correct") for s in traj) else "wrong"
        out.append(f"## {traj_id}: return {ret:.2f}, {len(traj)} steps, {status}\n")
        if tokenizer is not None:
            first = min(traj, key=lambda s: s["step"])
            out.append(
                f"prompt (end):\n```\n...{tokenizer.decode(first['prompt_ids'])[-prompt_chars:]}\n```\n"
            )
        for s in sorted(traj, key=lambda s: s["step"]):
            flags = " (truncated)" if s["truncated"] else ""
            out.append(f"**step {s['step']}** reward {s['reward']:.2f}{flags}\n")
            out.append(f"```\n{s.get('action', '')}\n```\n")
            if s.get("feedback"):
                out.append(f"feedback:\n```\n{s['feedback']}\n```\n")
    return "\n".join(out)
