"""A stage's entry module imports what the stage needs at its start, not the heavy libraries it uses
later or never (docs/performance.md): transformers' model classes, scikit-learn (which transformers'
generation code imports when it is installed), matplotlib, scipy.stats, vLLM, DeepSpeed and MLflow are
imported by the functions that use them. Checked in a fresh interpreter: the imports of this test
session do not count."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# imported when a model is built or loaded, a chart drawn, an interval computed, an engine started
LATE = (
    "transformers.modeling_utils",
    "sklearn",
    "matplotlib",
    "scipy.stats",
    "vllm",
    "deepspeed",
    "mlflow",
)


def stage_modules() -> list[str]:
    """The ``python -m <module>`` of every ``cmd`` of dvc.yaml, each once."""
    found = re.findall(r"^\s*cmd:\s*python -m ([\w.]+)", (REPO / "dvc.yaml").read_text(), flags=re.M)
    return list(dict.fromkeys(found))


def loaded_after_import(modules: list[str], watched: tuple[str, ...]) -> dict[str, list[str]]:
    """{module: the watched modules in sys.modules after importing it}, each module imported in turn
    in one fresh interpreter (a watched module that an earlier one loaded is blamed on the earlier)."""
    code = (
        "import importlib, json, sys\n"
        f"watched, out = {list(watched)!r}, {{}}\n"
        f"for m in {modules!r}:\n"
        "    importlib.import_module(m)\n"
        "    out[m] = [w for w in watched if w in sys.modules and not any(w in v for v in out.values())]\n"
        "print(json.dumps(out))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def test_dvc_yaml_names_the_stage_modules():
    assert {"flows.prepare", "flows.train", "flows.evaluate", "flows.compare"} <= set(stage_modules())


def test_no_stage_imports_the_late_libraries_at_its_start():
    loaded = loaded_after_import(stage_modules(), LATE)
    assert {m: found for m, found in loaded.items() if found} == {}
