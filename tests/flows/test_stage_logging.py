"""Stage output goes through Prefect's logging: on the console (what `dvc repro` shows) and into the
flow run's logs (what the Prefect UI shows); the library (components/) logs with the stdlib and never
prints."""

from __future__ import annotations

import ast
import importlib
import json
import textwrap

import pytest
from prefect import Flow

from tests.flows.workspace import BIN, REPO, make_workspace, run

STAGES = ["prepare", "base_model", "sft", "evaluate", "train", "compare"]


@pytest.mark.parametrize("stage", STAGES)
def test_every_stage_flow_logs_its_prints(stage):
    module = importlib.import_module(f"flows.{stage}")
    flows = [v for v in vars(module).values() if isinstance(v, Flow) and v.__module__ == module.__name__]
    assert [f.name for f in flows] == [stage]
    assert flows[0].log_prints is True, f"flows/{stage}.py: @flow(..., log_prints=True)"


def test_the_library_never_prints():
    found = []
    for f in sorted((REPO / "components").rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                found.append(f"{f.relative_to(REPO)}:{node.lineno}")
    assert found == [], "components/ logs with logging.getLogger(__name__), it does not print"


READ_BACK = textwrap.dedent(
    """
    import json
    import logging

    import flows  # PREFECT_HOME = this workspace's .prefect, components.* as Prefect extra loggers
    from prefect import flow, get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName, LogFilter
    from prefect.client.schemas.filters import LogFilterFlowRunId

    @flow(name="library_logs")
    def library_logs():
        logging.getLogger("components.some.module").info("a library record")


    library_logs()
    for handler in logging.getLogger("components").handlers:  # Prefect's APILogHandler sends in batches
        handler.flush()
    out = {}
    with get_client(sync_client=True) as client:
        for name in ("prepare", "library_logs"):
            runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=[name])))
            logs = client.read_logs(
                log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[r.id for r in runs]))
            )
            out[name] = {"runs": len(runs), "messages": [log.message for log in logs]}
    print("RESULT" + json.dumps(out))
    """
)


def test_a_stage_logs_to_the_console_and_to_its_prefect_flow_run(tmp_path):
    """A real stage (prepare, tiny params) in a throwaway workspace: its lines are on the console,
    and the Prefect API (the workspace's own .prefect database) returns them as the flow run's logs,
    with a components.* logger's record from another flow."""
    ws = make_workspace(tmp_path / "ws")
    python = str(BIN / "python")
    stage = run([python, "-m", "flows.prepare"], cwd=ws, timeout=600)
    console = stage.stdout + stage.stderr
    line = "train: 64 rows -> "
    assert line in console
    assert "| INFO    | Flow run" in console  # printed by Prefect's console handler, not bare print
    back = run([python, "-c", READ_BACK], cwd=ws, timeout=600)
    result = json.loads(back.stdout.split("RESULT", 1)[1])
    assert result["prepare"]["runs"] == 1, (
        result,
        sorted(p.name for p in (ws / ".prefect").iterdir()),
        back.stderr,
    )
    assert any(m.startswith(line) for m in result["prepare"]["messages"]), result["prepare"]
    assert "a library record" in result["library_logs"]["messages"], result["library_logs"]
    assert "| INFO    | components.some.module - a library record" in back.stderr
