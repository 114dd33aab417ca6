"""Following the log files of a `sluice up` stack (`sluice up --verbose`): each process writes its
own file in the data folder's `logs/`; this reads what each file gained since the last look, and
finds the files that processes started later (worker nodes, replicas) begin.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class LogFollower:
    """New lines of every `*.log` under `folder`, by file name. Lines written before it was made
    are not repeated (a restarted stack keeps its old logs); a file that shrank is read anew."""

    folder: Path
    _offsets: dict[Path, int] = field(default_factory=dict)
    _partial: dict[Path, bytes] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for path in self._files():
            self._offsets[path] = path.stat().st_size

    def _files(self) -> list[Path]:
        return sorted(self.folder.rglob("*.log")) if self.folder.is_dir() else []

    def new_lines(self) -> list[tuple[str, str]]:
        """(name of the log, line) for each whole line written since the last call, file by file."""
        out: list[tuple[str, str]] = []
        for path in self._files():
            try:
                size = path.stat().st_size
                offset = self._offsets.get(path, 0)
                if size < offset:  # the file was truncated or replaced
                    offset, self._partial[path] = 0, b""
                if size == offset:
                    continue
                with open(path, "rb") as f:
                    f.seek(offset)
                    data = self._partial.pop(path, b"") + f.read(size - offset)
            except OSError:
                continue  # removed meanwhile
            self._offsets[path] = size
            *whole, rest = data.split(b"\n")
            if rest:
                self._partial[path] = rest
            name = str(path.relative_to(self.folder).with_suffix(""))
            out += [(name, line.decode(errors="replace")) for line in whole if line.strip()]
        return out
