"""Every command the README and docs/ tell a user to type still runs: each shell code block (```bash,
```sh, ```shell) is split into simple commands, and each one must name a make target of the Makefile,
a `python -m <module>` that exists (in the repo or installed), a script file of the repo, or one of the
tools steprl drives (dvc, mlflow, prefect, git, torchrun, pytest) or a shell builtin. Relative links
of the same pages must point at files of the repo. Nothing is run."""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHELL_BLOCK = re.compile(r"^```(?:bash|sh|shell)[ \t]*\n(.*?)^```", re.M | re.S)
# `$(...)`, one level of nested parentheses inside allowed (e.g. `$([ $e = a ] && echo 1)`).
SUBST = re.compile(r"\$\(((?:[^()]|\([^()]*\))*)\)")
# `<name>`, `<ref of a>`: a placeholder the reader fills in (a redirection has a space after `<`).
PLACEHOLDER = re.compile(r"<(?=[\w.])[^<>\n]*(?<=[\w.])>")
SEPARATORS = {"&&", "||", ";", "|", "&", "(", ")", ";;"}
KEYWORDS = {"do", "then", "else", "!", "time"}
# The tools steprl is driven with (installed into .venv by `make setup`) and shell builtins.
TOOLS = {"dvc", "mlflow", "prefect", "git", "torchrun", "pytest", "ruff", "honcho", "uv", "vf-eval"}
BUILTINS = {"cd", "source", ".", "export", "eval", "echo", "cat", "wait", "kill", "for", "done", "[", "ls"}
PYTHONS = {"python", "python3", "python3.11"}
MAKE_OPTIONS_WITH_ARG = {"-o", "-C", "-f", "-j", "-W", "-I"}
DOC_PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def make_targets(makefile: Path = REPO / "Makefile") -> set[str]:
    """The targets of the Makefile's rules (`name ...: deps`), assignments (`X := ...`) left out."""
    rule = re.compile(r"^([A-Za-z0-9_.-]+(?: +[A-Za-z0-9_.-]+)*) *:(?!=)")
    return {t for m in map(rule.match, makefile.read_text().splitlines()) if m for t in m.group(1).split()}


def shell_blocks(text: str) -> list[str]:
    """The shell code blocks of a markdown text."""
    return SHELL_BLOCK.findall(text)


def simple_commands(block: str) -> list[list[str]]:
    """The simple commands of a shell block: continuation lines joined, comments dropped, `$(...)`
    checked as commands of their own, split at `&&`, `||`, `;`, `|`, `&` and parentheses, with
    redirections, leading variable assignments and keywords (`do`, ...) removed."""
    commands: list[list[str]] = []
    for line in block.replace("\\\n", " ").splitlines():
        line = PLACEHOLDER.sub("PLACEHOLDER", line)
        while m := SUBST.search(line):
            commands += simple_commands(m.group(1))
            line = line[: m.start()] + "SUBST" + line[m.end() :]
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        words: list[str] = []
        tokens = iter(lexer)
        for token in tokens:
            if token in SEPARATORS:
                commands.append(words)
                words = []
            elif set(token) <= set("<>&|;()") and ("<" in token or ">" in token):
                next(tokens, None)  # a redirection and its target
            else:
                words.append(token)
        commands.append(words)
    out = []
    for words in commands:
        while words and (words[0] in KEYWORDS or re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0])):
            words = words[1:]
        if words:
            out.append(words)
    return out


def module_exists(name: str) -> bool:
    """Whether `python -m name` finds a module: a file of the repo, or an installed module found
    without importing it (the submodules looked up in the package's folders)."""
    parts = name.split(".")
    path = REPO.joinpath(*parts)
    if path.with_suffix(".py").is_file() or (path / "__main__.py").is_file():
        return True
    if (REPO / parts[0]).is_dir():
        return False  # a package of the repo without that module
    spec = importlib.util.find_spec(parts[0])
    for part in parts[1:]:
        if spec is None or not spec.submodule_search_locations:
            return False
        found = [Path(d) / part for d in spec.submodule_search_locations]
        hits = [p for p in found if p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()]
        if not hits:
            return False
        spec = importlib.util.spec_from_file_location(
            part,
            hits[0] / "__init__.py" if hits[0].is_dir() else hits[0].with_suffix(".py"),
            submodule_search_locations=[str(hits[0])] if hits[0].is_dir() else None,
        )
    return spec is not None


def command_problem(words: list[str], targets: set[str]) -> str | None:
    """Why a simple command would not run here, or None when it names what exists."""
    program = words[0]
    name = program.removeprefix(".venv/bin/")
    args = words[1:]
    if name in TOOLS or name in BUILTINS:
        return None
    if name == "make":
        skip = False
        for a in args:
            if skip:
                skip = False
            elif a in MAKE_OPTIONS_WITH_ARG:
                skip = True
            elif not a.startswith("-") and "=" not in a and a not in targets:
                return f"make target {a!r} is not in the Makefile"
        return None
    if name in PYTHONS:
        if args[:1] == ["-m"] and len(args) >= 2:
            if not module_exists(args[1]):
                return f"module {args[1]!r} does not exist"
            rest = args[2:]
            if "--" in rest and rest.index("--") + 1 < len(rest):
                return command_problem(rest[rest.index("--") + 1 :], targets)  # flows.repro -- dvc ...
            return None
        if args[:1] == ["-c"]:
            return None
        if args and not (REPO / args[0]).is_file():
            return f"script {args[0]!r} does not exist"
        return None if args else "python without a module or script"
    if "/" in program and (REPO / program).is_file():
        return None
    return f"{program!r} is neither a make target, a python module or script, nor a known tool"


def block_problems(block: str, targets: set[str] | None = None) -> list[str]:
    """Every command of a shell block that would not run, with the reason."""
    targets = make_targets() if targets is None else targets
    return [
        f"{' '.join(words)}: {why}"
        for words in simple_commands(block)
        if (why := command_problem(words, targets))
    ]


def test_every_command_of_the_readme_and_docs_names_what_exists():
    targets = make_targets()
    problems = [
        f"{page.relative_to(REPO)}: {p}"
        for page in DOC_PAGES
        for block in shell_blocks(page.read_text())
        for p in block_problems(block, targets)
    ]
    assert problems == []


def test_the_readme_has_its_two_commands():
    blocks = shell_blocks((REPO / "README.md").read_text())
    commands = [words for block in blocks for words in simple_commands(block)]
    assert ["make", "repro"] in commands and ["make", "test"] in commands


def test_the_makefile_targets_are_read():
    assert {"setup", "repro", "test", "test-all", "chat", "serve", "worker", "mlflow-ui"} <= make_targets()


def test_a_made_up_target_module_or_script_is_found():
    block = """
make repro PROFILE=sokoban                  # a real target with a variable
make reproduce                              # no such target
(cd w1 && make worker POOL=steprl) && make -o .venv/.installed tset
python -m flows.chat --model grpo-s0
python -m flows.chatbot
.venv/bin/python -m flows.repro -- dvc exp run --run-all
python -m flows.repro -- make nowhere
python benchmarks/logprob_gap.py
python benchmarks/no_such_benchmark.py
eval "$(.venv/bin/python -m flows.serves env)"
dvc plots diff $(dvc exp ls --names-only)
OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=eth0 .venv/bin/python -m flows.sft \\
  --algo grpo
git checkout <ref of a> && .venv/bin/dvc checkout models/sft
steprl-train --fast
"""
    assert block_problems(block) == [
        "make reproduce: make target 'reproduce' is not in the Makefile",
        "make -o .venv/.installed tset: make target 'tset' is not in the Makefile",
        "python -m flows.chatbot: module 'flows.chatbot' does not exist",
        "python -m flows.repro -- make nowhere: make target 'nowhere' is not in the Makefile",
        "python benchmarks/no_such_benchmark.py: script 'benchmarks/no_such_benchmark.py' does not exist",
        ".venv/bin/python -m flows.serves env: module 'flows.serves' does not exist",
        "steprl-train --fast: 'steprl-train' is neither a make target, a python module or script, nor a known tool",
    ]


def test_an_installed_module_is_found_without_importing_it():
    assert module_exists("pytest")
    assert module_exists("json.tool")
    assert not module_exists("json.no_such_tool")
    assert not module_exists("no_such_package_anywhere")


def test_only_shell_blocks_are_read():
    text = "```\nmake nowhere\n```\n\n```python\nimport os\n```\n\n```bash\nmake test\n```\n"
    assert shell_blocks(text) == ["make test\n"]


LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_every_relative_link_of_the_readme_and_docs_resolves():
    broken = [
        f"{page.relative_to(REPO)}: {target}"
        for page in DOC_PAGES
        for target in LINK.findall(page.read_text())
        if not re.match(r"^(https?:|mailto:|#)", target) and not (page.parent / target.split("#")[0]).exists()
    ]
    assert broken == []
