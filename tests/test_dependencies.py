"""Every third-party package the code imports is declared in pyproject.toml, and the code uses no
private module of a dependency (except the pinned ones below, each with a test of what steprl needs).

A package installed in the developer's venv only because another package pulled it in would work
here and break on a user's fresh install after any upgrade; these tests catch it at the import.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PRODUCT = ("components", "flows")  # what `pip install steprl` ships
DEV = ("tests", "benchmarks")  # may also use the dev extra
LOCAL = {"components", "flows", "tests", "benchmarks"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _req_name(req: str) -> str:
    return _norm(re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req).group(1))


def declared() -> dict[str, set[str]]:
    """pyproject's distributions: ``dependencies`` and each optional extra, by normalised name."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    out = {"dependencies": {_req_name(r) for r in project["dependencies"]}}
    for extra, reqs in project.get("optional-dependencies", {}).items():
        out[extra] = {_req_name(r) for r in reqs}
    return out


def imports(roots: tuple[str, ...]) -> dict[str, list[str]]:
    """Absolute imports of the ``.py`` files under ``roots``: module path -> ["file:line", ...]."""
    out: dict[str, list[str]] = {}
    for root in roots:
        for f in sorted((REPO / root).rglob("*.py")):
            tree = ast.parse(f.read_text(), filename=str(f))
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    out.setdefault(name, []).append(f"{f.relative_to(REPO)}:{node.lineno}")
    return out


def third_party(modules: dict[str, list[str]]) -> dict[str, list[str]]:
    """Imports that are neither the standard library nor steprl's own modules (a test helper module
    such as tests/train/train_helpers.py is imported by its bare name: it is local too)."""
    local_files = {p.stem for d in DEV for p in (REPO / d).rglob("*.py")}
    out: dict[str, list[str]] = {}
    for name, where in modules.items():
        top = name.split(".")[0]
        if top in sys.stdlib_module_names or top in LOCAL or top in local_files or top == "__future__":
            continue
        out.setdefault(top, []).extend(where)
    return out


def undeclared(roots: tuple[str, ...], allowed: set[str]) -> list[str]:
    dists = md.packages_distributions()
    missing = []
    for top, where in sorted(third_party(imports(roots)).items()):
        provided = {_norm(d) for d in dists.get(top, [])}
        if not provided & allowed:
            missing.append(
                f"import {top} ({', '.join(where[:3])}): provided by {sorted(provided) or 'nothing installed'}, "
                "none of which pyproject.toml declares"
            )
    return missing


def test_product_imports_are_declared_dependencies():
    d = declared()
    # vLLM comes from the cpu or gpu extra (one of them is always installed: Makefile EXTRA)
    allowed = d["dependencies"] | d.get("cpu", set()) | d.get("gpu", set())
    assert undeclared(PRODUCT, allowed) == []


def test_test_and_benchmark_imports_are_declared():
    allowed = set().union(*declared().values())
    assert undeclared(DEV, allowed) == []


def test_the_check_fails_on_an_undeclared_import(tmp_path, monkeypatch):
    """The check itself can fail: a module importing a package pyproject does not declare."""
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    (tmp_path / "components").mkdir()
    (tmp_path / "components" / "x.py").write_text("import yaml\nimport psutil\nfrom components import y\n")
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\ndependencies = ["PyYAML>=6"]\n[project.optional-dependencies]\ndev = []\n'
    )
    missing = undeclared(("components",), declared()["dependencies"])
    assert len(missing) == 1 and missing[0].startswith("import psutil (components/x.py:2)")


# --- private APIs ----------------------------------------------------------------------------------
# Internal modules of a dependency that steprl still uses, each pinned by an exact version in
# pyproject.toml and by a test below of the behaviour steprl relies on. Anything else is refused.
PINNED_PRIVATE = {"dvc.utils.hydra": "dvc"}


def _private(module: str) -> bool:
    top = module.split(".")[0]
    if top in sys.stdlib_module_names or top in LOCAL:
        return False
    parts = module.split(".")
    return any(p.startswith("_") and not p.startswith("__") for p in parts) or module in PINNED_PRIVATE


def test_no_private_modules_of_dependencies():
    used = {m: w for m, w in third_party(imports(PRODUCT)).items()}  # top-level names only
    found = {
        name: where
        for name, where in imports(PRODUCT).items()
        if name.split(".")[0] in used and _private(name) and name not in PINNED_PRIVATE
    }
    assert found == {}


@pytest.mark.parametrize("module,dist", sorted(PINNED_PRIVATE.items()))
def test_pinned_private_modules_have_an_exact_version(module, dist):
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = [r for r in project["dependencies"] if _req_name(r) == dist]
    assert pins and "==" in pins[0], f"{module} is internal to {dist}: pin {dist} with == in pyproject.toml"


def test_dvc_apply_overrides_edits_params_as_dvc_exp_run_set_param(tmp_path):
    """What flows/_experiments.check_overrides needs of dvc.utils.hydra.apply_overrides: it rewrites
    params.yaml in place with hydra overrides (set, append with +, list values, null), keeps the other
    keys and their order, and raises dvc's InvalidArgumentError on a key that does not exist."""
    import yaml
    from dvc.exceptions import InvalidArgumentError
    from dvc.utils.hydra import apply_overrides

    path = tmp_path / "params.yaml"
    path.write_text("seed: 0\ntrain:\n  lr: 0.001\n  iterations: 20\nmodel:\n  path: null\n")
    apply_overrides(path, ["train.lr=0.0003"])
    apply_overrides(path, ["+compare.seeds=[0,1]"])
    apply_overrides(path, ["model.path=null"])
    got = yaml.safe_load(path.read_text())
    assert got == {
        "seed": 0,
        "train": {"lr": 0.0003, "iterations": 20},
        "model": {"path": None},
        "compare": {"seeds": [0, 1]},
    }
    assert list(got) == ["seed", "train", "model", "compare"]
    with pytest.raises(InvalidArgumentError):
        apply_overrides(path, ["train.no_such_key=1"])


# --- tabulate: reasoning-gym's pin ------------------------------------------------------------------
def test_every_installed_requirement_on_tabulate_is_met():
    """reasoning-gym pins tabulate==0.9.0 in every release; DVC (>=0.8.7) and gto (>=0.8.10) accept
    it, so the lock holds 0.9.0 and no override is needed: every installed distribution's requirement
    on tabulate (outside extras) is met by the installed version."""
    from packaging.requirements import Requirement

    installed = md.version("tabulate")
    wanted = {}
    for dist in md.distributions():
        for raw in dist.requires or []:
            req = Requirement(raw)
            if _norm(req.name) == "tabulate" and not (req.marker and "extra" in str(req.marker)):
                wanted[dist.metadata["Name"]] = str(req.specifier)
    assert {"reasoning-gym", "dvc"} <= {_norm(n) for n in wanted}
    unmet = {
        name: spec
        for name, spec in wanted.items()
        if not Requirement(f"t{spec}").specifier.contains(installed)
    }
    assert unmet == {}, f"tabulate {installed} does not meet {unmet}"


def test_reasoning_gym_and_dvc_tables_work_with_the_locked_tabulate():
    """reasoning-gym's one use of tabulate (zebra_puzzles' grid) and DVC's tables (``dvc metrics show
    --md``) with the lock's tabulate: each generated puzzle's own answer scores 1, the same seed gives
    the same puzzles, two generators that do not use tabulate work beside it, DVC renders a table."""
    import io

    import reasoning_gym
    from dvc.ui import Console
    from dvc.ui.table import plain_table

    for name in ("zebra_puzzles", "chain_sum", "mini_sudoku"):
        data = reasoning_gym.create_dataset(name, size=3, seed=7)
        for entry in data:
            assert data.score_answer(entry["answer"], entry) == 1.0, name
        again = reasoning_gym.create_dataset(name, size=3, seed=7)
        assert [e["question"] for e in again] == [e["question"] for e in data]
    out = io.StringIO()
    console = Console()
    console.write = lambda text, **_: out.write(text)  # dvc's Console writes to its own stdout
    plain_table(console, [["eval_test.json", "0.5"]], headers=["Path", "accuracy"], markdown=True)
    assert out.getvalue().splitlines()[:3] == [
        "| Path           | accuracy   |",
        "|----------------|------------|",
        "| eval_test.json | 0.5        |",
    ]
