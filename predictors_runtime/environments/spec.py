"""An API's environment as locked at deploy: what every host builds, and the key it is kept under.

The key is a hash of everything that decides the environment's content: the requirements and
`dependencies.sh` as written, the versions they resolved to (the lock), the index options, the
Python version and platform, Sluice's version and the exact versions of Sluice's own server
libraries the resolve was held to. Two deploys that agree on all of these share one environment
on each host; any difference is another environment, never a stale one.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name


@dataclass(frozen=True)
class EnvironmentSpec:
    """One locked environment; `to_dict()` is how it is stored with the deployment and each job."""

    requirements: str
    shell: str
    lock: str                          # `uv pip compile` output: option lines, then name==version lines
    server_pins: dict[str, str]        # Sluice's own libraries the lock was held to: name -> version
    python: str                        # major.minor of the interpreter it was locked for
    platform: str                      # sysconfig's platform tag, e.g. linux-x86_64
    sluice_version: str
    index_args: tuple[str, ...] = ()   # --index-url / --find-links / --no-index, as the deploy used them
    pip_path: str = "requirements.txt"
    shell_path: str = "dependencies.sh"
    # Pins `--nearest-wheels` moved at deploy, each `old -> new: why` (the moved text is `requirements`).
    moved: tuple[str, ...] = ()
    key: str = field(default="")

    def __post_init__(self) -> None:
        if not self.key:
            object.__setattr__(self, "key", self.content_key())

    def content_key(self) -> str:
        """16 hex digits of a hash over every input that decides the environment's content."""
        decisive = {k: v for k, v in asdict(self).items() if k not in ("key", "pip_path", "shell_path", "moved")}
        decisive["index_args"] = list(self.index_args)
        text = json.dumps(decisive, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["index_args"] = list(self.index_args)
        data["moved"] = list(self.moved)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EnvironmentSpec:
        data = dict(data)
        data["index_args"] = tuple(data.get("index_args") or ())
        data["server_pins"] = dict(data.get("server_pins") or {})
        data["moved"] = tuple(data.get("moved") or ())
        return cls(**data)

    def resolved(self) -> dict[str, str]:
        """The packages the lock pins, name -> version (requirements that are not `==` pins are left out)."""
        return {name: version for name, version in (pinned(line) for line in lock_lines(self.lock)) if name}

    def summary(self) -> dict[str, Any]:
        """What `GET /apis/<name>` shows of it (not the texts)."""
        return {"key": self.key, "python": self.python, "platform": self.platform, "packages": self.resolved(),
                "requirements": self.pip_path if self.requirements.strip() else None,
                "shell": self.shell_path if self.shell.strip() else None,
                **({"moved": list(self.moved)} if self.moved else {})}


def lock_lines(lock: str) -> list[str]:
    """The requirement lines of a lock (comments, blank lines and option lines left out)."""
    lines = []
    for raw in lock.splitlines():
        line = raw.split("#", 1)[0].strip() if not raw.lstrip().startswith("-") else ""
        if line:
            lines.append(line)
    return lines


def option_lines(lock: str) -> list[str]:
    """The option lines of a lock (`--index-url ...`, `--find-links ...`)."""
    return [raw.strip() for raw in lock.splitlines() if raw.strip().startswith("-")]


def pinned(line: str) -> tuple[str, str]:
    """(canonical name, version) of an exact `name==version` requirement; ("", "") for anything else."""
    try:
        requirement = Requirement(line)
    except InvalidRequirement:
        return "", ""
    specifiers = list(requirement.specifier)
    if requirement.url or len(specifiers) != 1 or specifiers[0].operator != "==" or "*" in specifiers[0].version:
        return "", ""
    return canonicalize_name(requirement.name), specifiers[0].version
