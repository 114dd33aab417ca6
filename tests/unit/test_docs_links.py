"""The README and docs/ cannot go stale silently: every relative link reaches a file (and its
anchor a heading there), and every repository path cited in the docs, in docstrings and in
comments names a file or folder that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# A path into the repository: one of its top folders, then a file or folder name.
_PATH = re.compile(r"(?<![\w./-])((?:api|beat|jobs|foundation|predictors_runtime|sluice|cortex|cortex_internal|tests|"
                   r"testbed|bench|docker|examples|docs)/[\w./-]*[\w/])")
# The product's code (tests and benchmarks write paths of every kind in their strings).
SOURCE_FOLDERS = ("api", "beat", "jobs", "foundation", "predictors_runtime", "sluice", "cortex", "cortex_internal",
                  "testbed")
# Files the docs tell a reader to make (ignored by git), not files of the repository.
MADE_BY_THE_READER = frozenset({"docker/sluice.env", "bench/.venv-ray", "bench/.venv-bentoml"})


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found, fenced = set(), False
    for line in page.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"^#{1,6} ", line):
            found.add(slug(line.lstrip("#")))
    return found


def prose(text: str) -> str:
    """The text outside fenced code blocks (commands there name the reader's files, not ours)."""
    return re.sub(r"^\s*```.*?^\s*```", "", text, flags=re.MULTILINE | re.DOTALL)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_reaches_its_file_and_heading(page: Path) -> None:
    broken = []
    for target in _LINK.findall(prose(page.read_text())):
        if re.match(r"^[a-z]+:", target):
            continue  # http(s), mailto: not ours to check here
        path_part, _, anchor = target.partition("#")
        destination = (page.parent / path_part).resolve() if path_part else page
        if not destination.exists():
            broken.append(f"{target}: no such file")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            broken.append(f"{target}: no heading #{anchor} in {destination.relative_to(ROOT)}")
    assert broken == [], f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def cited_paths(text: str) -> set[str]:
    return {p.rstrip(".") for p in _PATH.findall(text) if "<" not in p and "*" not in p}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_path_the_docs_cite_exists(page: Path) -> None:
    missing = sorted(p for p in cited_paths(prose(page.read_text()))
                     if not (ROOT / p).exists() and p not in MADE_BY_THE_READER)
    assert missing == [], f"{page.relative_to(ROOT)} cites paths that do not exist: {missing}"


def test_every_path_docstrings_and_comments_cite_exists() -> None:
    missing = []
    for folder in SOURCE_FOLDERS:
        for source in sorted((ROOT / folder).rglob("*.py")):
            if ".venv" in source.parts:
                continue
            for path in cited_paths(source.read_text()):
                if not (ROOT / path).exists():
                    missing.append(f"{source.relative_to(ROOT)}: {path}")
    assert missing == []
