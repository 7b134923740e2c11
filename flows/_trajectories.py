"""Readable Markdown of sampled trajectories (prompt, actions, tool feedback, rewards) for MLflow."""

from __future__ import annotations


def render_samples(steps: list[dict], limit: int = 20, question_key: str = "question") -> str:
    by_traj: dict[str, list[dict]] = {}
    for s in steps:
        by_traj.setdefault(s["traj_id"], []).append(s)
    out = []
    for traj_id, traj in list(by_traj.items())[:limit]:
        ret = sum(s["reward"] for s in traj)
        status = "correct" if any(s.get("correct") for s in traj) else "wrong"
        out.append(f"## {traj_id}: return {ret:.2f}, {len(traj)} steps, {status}\n")
        for s in sorted(traj, key=lambda s: s["step"]):
            flags = " (truncated)" if s["truncated"] else ""
            out.append(f"**step {s['step']}** reward {s['reward']:.2f}{flags}\n")
            out.append(f"```\n{s.get('action', '')}\n```\n")
            if s.get("feedback"):
                out.append(f"feedback:\n```\n{s['feedback']}\n```\n")
    return "\n".join(out)
