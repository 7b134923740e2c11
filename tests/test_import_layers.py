"""The import graph of components/ and flows/, read with ``ast`` (nothing is imported): no import cycle,
between modules or between the packages of :data:`LAYERS`, and no import that runs up the layers that
docs/design.md ("Layers") states. Every import counts, those inside functions included: a late import
breaks no cycle, it only hides it until the function runs.

:data:`LAYERS` is that layering as data, bottom first. A module belongs to the unit of its longest
matching prefix (``flows.pipeline`` before ``flows._stage``; ``components`` and ``flows`` themselves are
their packages' ``__init__`` only); it may import its own unit and the units of its
own layer or of any layer below (the cycle checks keep a layer's units from going round in a circle).
An import of ``a.b.c`` also runs the ``__init__`` of packages ``a`` and ``a.b``, so it counts as an
import of them too, except of the importer's own enclosing packages (Python has run those already).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ROOTS = ("components", "flows")

# Bottom first: (layer name, its units). Keep docs/design.md's "Layers" block the same (a test checks).
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "foundation",
        (
            "components",
            "components.registry",
            "components.io",
            "components.marker",
            "components.schemas",
            "components.device",
            "components.precision",
            "components.determinism",
            "components.gpu_memory",
            "components.dist_env",
            "components.environ",
            "components.ports",
            "components.process_tree",
            "components.sandbox",
        ),
    ),
    ("interfaces", ("components.envs", "components.rollout", "components.algos")),
    ("agent and tasks", ("components.agent", "components.tasks")),
    (
        "training",
        ("components.model", "components.train", "components.stats", "components.plots", "components.chat"),
    ),
    ("params", ("components.config",)),
    (
        "stage support",
        (
            "flows",
            "flows._stage",
            "flows._cache",
            "flows._gpu",
            "flows._trajectories",
            "flows._experiments",
            "flows._nodes",
            "flows.train_metrics",
            "flows.train_partial",
            "flows.train_settings",
        ),
    ),
    (
        "stages",
        (
            "flows.prepare",
            "flows.base_model",
            "flows.sft",
            "flows.evaluate",
            "flows.train",
            "flows.compare",
            "flows.chat",
            "flows.critic_warmup",
        ),
    ),
    ("pipeline", ("flows.pipeline",)),
    ("deployments", ("flows.pool",)),
    ("service", ("flows.serve", "flows.repro", "flows.sweep")),
]


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under ``root``'s components/ and flows/."""
    out = {}
    for top in ROOTS:
        for f in sorted((root / top).rglob("*.py")):
            parts = f.relative_to(root).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def _prefixes(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def import_graph(root: Path) -> dict[str, dict[str, int]]:
    """module -> {imported module of the tree: first line that imports it}."""
    files = module_files(root)
    graph: dict[str, dict[str, int]] = {}
    for name, f in files.items():
        package = name if f.name == "__init__.py" else name.rpartition(".")[0]
        own = set(_prefixes(package)) if package else set()
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(f.read_text(), filename=str(f))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, *([base] if base else [])])
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for target in targets:
                for mod in _prefixes(target):
                    if mod in files and mod != name and mod not in own:
                        edges.setdefault(mod, node.lineno)
        graph[name] = edges
    return graph


def unit_of(module: str) -> str | None:
    """The :data:`LAYERS` unit ``module`` belongs to (longest matching prefix), None if none."""
    units = [
        u for _, us in LAYERS for u in us if module == u or (u not in ROOTS and module.startswith(u + "."))
    ]
    return max(units, key=len) if units else None


def layer_of(unit: str) -> int:
    return next(i for i, (_, units) in enumerate(LAYERS) if unit in units)


def find_cycle(graph: dict[str, set[str] | dict[str, int]]) -> list[str] | None:
    """One cycle of ``graph`` as [a, b, ..., a] starting at its smallest name (so the report does not
    depend on which edge the search happened to reach it by), or None (depth-first search, colours)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                ring = path[path.index(nxt) :]
                start = ring.index(min(ring))
                ring = ring[start:] + ring[:start]
                return [*ring, ring[0]]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def unit_graph(graph: dict[str, dict[str, int]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for module, edges in graph.items():
        src = unit_of(module)
        for target in edges:
            dst = unit_of(target)
            if src and dst and src != dst:
                out.setdefault(src, set()).add(dst)
    return out


def problems(root: Path) -> list[str]:
    """Every violation in the tree at ``root``, one line each (empty: the graph follows the layers)."""
    graph, files = import_graph(root), module_files(root)
    found = [
        f"{files[m].relative_to(root)}: module {m} is in no layer of LAYERS" for m in graph if not unit_of(m)
    ]
    for module, edges in sorted(graph.items()):
        src = unit_of(module)
        for target, line in sorted(edges.items()):
            dst = unit_of(target)
            if src and dst and layer_of(dst) > layer_of(src):
                found.append(
                    f"{files[module].relative_to(root)}:{line}: {module} ({LAYERS[layer_of(src)][0]}) imports "
                    f"{target} ({LAYERS[layer_of(dst)][0]}), a layer above it"
                )
    if cycle := find_cycle(graph):
        found.append("import cycle between modules: " + " -> ".join(cycle))
    if cycle := find_cycle(unit_graph(graph)):
        found.append("import cycle between packages: " + " -> ".join(cycle))
    return found


def test_the_import_graph_has_no_cycle_and_follows_the_layers():
    assert problems(REPO) == []


def test_every_unit_of_the_layers_exists_once():
    files = module_files(REPO)
    units = [u for _, us in LAYERS for u in us]
    assert len(units) == len(set(units))
    assert [u for u in units if u not in files] == []


def test_the_docs_state_the_same_layers():
    """docs/design.md's "Layers" block lists each layer as ``name: unit, unit, ...``, top first."""
    text = (REPO / "docs" / "design.md").read_text()
    block = text.split("<!-- layers: the test reads this block -->", 1)[1].split("```", 2)[1]
    lines = [line.strip() for line in block.strip().splitlines()]
    lines = [line for line in lines if line and not line.startswith("(")]
    stated = [
        (name.strip(), tuple(u.strip() for u in units.split(",")))
        for name, units in (
            line.split(":", 1)
            for line in reversed(lines)  # the block draws the top first
        )
    ]
    assert stated == LAYERS


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the repo's components/ and flows/ (the checks run on it; the repo is untouched)."""
    for f in module_files(REPO).values():
        _write(tmp_path, {str(f.relative_to(REPO)): f.read_text()})
    return tmp_path


def test_a_planted_upward_import_is_caught(tree: Path):
    assert problems(tree) == []
    target = tree / "components" / "rollout" / "vllm_engine.py"
    target.write_text(
        target.read_text() + "\n\ndef _late():\n    from components.train.distributed import STORE_FILE_VAR\n"
    )
    found = problems(tree)
    assert any(
        "components/rollout/vllm_engine.py:" in p
        and "components.rollout.vllm_engine (interfaces) imports components.train.distributed (training)" in p
        for p in found
    ), found


def test_a_planted_cycle_is_caught(tree: Path):
    pool = tree / "flows" / "pool.py"
    assert "from flows.pipeline import pipeline" in pool.read_text()
    pipeline = tree / "flows" / "pipeline.py"
    pipeline.write_text(pipeline.read_text() + "\n\ndef _late():\n    from flows.pool import deploy\n")
    found = problems(tree)
    assert "import cycle between modules: flows.pipeline -> flows.pool -> flows.pipeline" in found, found
    assert any("flows.pipeline (pipeline) imports flows.pool (deployments)" in p for p in found), found


def test_a_cycle_inside_one_layer_and_a_module_without_a_layer_are_caught(tree: Path):
    """Two units of one layer may import each other's modules without going up, but not both ways;
    a new top-level module must be given a layer."""
    _write(
        tree,
        {
            "components/envs/uses_algos.py": "from components.algos import losses\n",
            "components/algos/uses_envs.py": "import components.envs.parsing\n",
            "components/newthing.py": "X = 1\n",
        },
    )
    found = problems(tree)
    assert "import cycle between packages: components.algos -> components.envs -> components.algos" in found
    assert "components/newthing.py: module components.newthing is in no layer of LAYERS" in found


def test_an_import_of_a_submodule_counts_as_an_import_of_its_packages(tree: Path):
    """``import components.rollout.base`` runs components/rollout/__init__.py: a package __init__ that
    imported its importer back would be a cycle (here: rollout's __init__ importing a factory that
    imports the engines, which import the package)."""
    init = tree / "components" / "rollout" / "__init__.py"
    init.write_text(init.read_text() + "\nfrom components.rollout.factory import make_engine  # noqa\n")
    graph = import_graph(tree)
    assert "components.rollout" in graph["components.train.rl_session"]
    assert "components.rollout" not in graph["components.rollout.vllm_engine"]  # its own package
    assert problems(tree) == []  # the engines reach the factory only through their own package
    factory = tree / "components" / "rollout" / "factory.py"
    factory.write_text(factory.read_text() + "\nimport components.chat.server  # noqa\n")
    found = problems(tree)
    assert any("import cycle between modules" in p and "components.chat.server" in p for p in found), found
