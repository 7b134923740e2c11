"""The repo is self-contained: every `docs/...` (or `data/README.md`) path cited in code, params,
the README or the docs exists in the repo, and nothing cites the design notes it was built from
(files a user's clone does not have)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TEXT = {".py", ".md", ".yaml", ".yml", ".toml", ".cfg", ".txt"}
CITED = re.compile(r"(?<![\w/.])((?:docs/|data/README)[\w./-]*\.md)")
# The notes this project was designed from live outside the repo; a citation of them dangles.
OUTSIDE = ["ALGORITHMS" + ".md", "DESIGN" + ".md", "STYLE" + ".md", "MACHINE" + ".md", "/work/" + "shared"]


def repo_text_files() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    files = [REPO / f for f in out if f]
    return [f for f in files if f.is_file() and (f.suffix in TEXT or f.name in ("Makefile", "dvc.yaml"))]


def citations(files: list[Path]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for f in files:
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
            for path in CITED.findall(line):
                found.setdefault(path.rstrip("."), []).append(f"{f}:{n}")
    return found


def test_the_user_docs_exist_and_are_cited():
    cited = citations(repo_text_files())
    for doc in ("docs/algorithms.md", "docs/design.md", "data/README.md"):
        assert (REPO / doc).is_file(), doc
    assert "docs/algorithms.md" in cited  # the algorithms' code points users at the math


def test_every_cited_doc_exists():
    missing = {p: where for p, where in citations(repo_text_files()).items() if not (REPO / p).is_file()}
    assert missing == {}


def test_a_dangling_citation_is_found(tmp_path):
    f = tmp_path / "x.py"
    missing = "docs/" + "nowhere.md"  # split, so this file does not cite it
    f.write_text(f'"""See {missing} and docs/algorithms.md."""\n')
    assert set(citations([f])) == {missing, "docs/algorithms.md"}


def test_nothing_cites_notes_outside_the_repo():
    hits = [
        f"{f.relative_to(REPO)}:{n}: {needle}"
        for f in repo_text_files()
        for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1)
        for needle in OUTSIDE
        if needle in line
    ]
    assert hits == []
