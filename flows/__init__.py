"""Prefect flows: one per DVC stage (`python -m flows.<stage>`). Thin orchestration over components/.

Importing this package sets the process defaults every stage needs before Prefect, vLLM or
DeepSpeed are imported: Prefect's home under the repo (so the Prefect UI of `make serve` sees runs
made without a server), the in-process vLLM engine, and DeepSpeed's CPU accelerator when there is no GPU.

Logging: every stage flow has ``log_prints=True``, so what it prints goes through Prefect's loggers:
to the console (Prefect's console handler, stderr: what `dvc repro` shows) and into the flow run's
logs (the Prefect UI). The library's stdlib loggers (``components.*``) are Prefect "extra loggers":
their INFO records reach the same two places while a flow runs.
"""

import logging
import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Seconds a stage (or `make repro`) waits for the Prefect server it starts to answer.
PREFECT_STARTUP_TIMEOUT_S = 600

# Where each stage writes where its time went (timing/<stage>.json, flows._stage.write_stage_timing;
# not a DVC output); `make repro` prints the stages it ran from there.
TIMING_DIR = REPO / "timing"


def processed(task: str) -> Path:
    """data/processed/<task>: the prepare stage's output (the split tables and the task's files)."""
    return REPO / "data" / "processed" / task


os.environ.setdefault("PREFECT_HOME", str(REPO / ".prefect"))
# Without PREFECT_API_URL each stage starts a temporary Prefect server and waits for it: on a busy
# machine (a fresh .prefect/ database, both cores taken) that took over 2 minutes, so the wait is long
# enough for a busy machine to slow a stage down instead of failing it.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", str(PREFECT_STARTUP_TIMEOUT_S))
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "INFO")
os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "components")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
if not os.environ.get("CUDA_VISIBLE_DEVICES") and not Path("/dev/nvidia0").exists():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
if logging.getLogger("components").level == logging.NOTSET:  # else the root's WARNING hides INFO
    logging.getLogger("components").setLevel(logging.INFO)
