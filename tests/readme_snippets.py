"""The code blocks of the README and of docs/, as the tests read them.

Each fenced block is preceded by a marker that says what a test does with it:
`<!-- snippet: run -->` (run on a `sluice up` stack by tests/integration/test_readme_snippets.py)
or `<!-- snippet: skip: <why> -->` (a session, a cluster, output to read, a file's contents).
A block without one fails tests/unit/test_readme_snippets.py, so a new snippet is run or its
reason for not running is written next to it.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = (README, *sorted((ROOT / "docs").glob("*.md")))
_MARKER = re.compile(r"<!-- snippet: (run|skip: [^>]+) -->")


@dataclass(frozen=True)
class Snippet:
    language: str
    text: str
    line: int  # of the opening fence, 1-based
    marker: str | None  # "run", "skip: <why>", or None when the block has none
    page: str = "README.md"  # where it is, from the repository's root

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.marker == "run"

    def commands(self) -> list[str]:
        """A shell block's commands: continuation lines joined, comments and blanks left out
        (a `$ ` prompt taken off)."""
        joined = re.sub(r"\\\n\s*", " ", self.text)
        out = []
        for raw in joined.splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            out.append(line.removeprefix("$ "))
        return out


def all_snippets() -> list[Snippet]:
    """Every block of the README, then of each page of docs/."""
    return [snippet for page in PAGES for snippet in snippets(page)]


def snippets(path: Path = README) -> list[Snippet]:
    lines = path.read_text().splitlines()
    found: list[Snippet] = []
    i = 0
    while i < len(lines):
        fence = re.match(r"^\s*```(\w*)\s*$", lines[i])  # a block inside a list item is indented
        if fence is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip().startswith("```"))
        previous = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = _MARKER.fullmatch(previous.strip())
        found.append(Snippet(fence.group(1), textwrap.dedent("\n".join(lines[i + 1:end])) + "\n", i + 1,
                             marker.group(1) if marker else None, path.relative_to(ROOT).as_posix()))
        i = end + 1
    return found
