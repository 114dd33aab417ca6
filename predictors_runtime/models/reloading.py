"""What changed between two discoveries of an API's models: the pure part of live reloading.

`compare` takes what the manager serves and what a new scan found, and says which versions were
added, removed or changed in place (their fingerprints differ). A model or version the new scan
could not accept (a half-uploaded SavedModel, a folder emptied by mistake) is neither added nor
removed: the previous state is kept for it until the storage is fixed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .layout import DEFAULT_MODEL_NAME, LayoutProblem, ModelVersion, Versions


def label(name: str) -> str:
    """How messages name a model: "model" for the single model of `models.path`, else "model <name>"."""
    return "model" if name == DEFAULT_MODEL_NAME else f"model {name}"


@dataclass
class Comparison:
    """The next state to serve and the differences that lead to it."""

    state: Versions
    added: list[ModelVersion] = field(default_factory=list)
    removed: list[ModelVersion] = field(default_factory=list)
    changed: list[ModelVersion] = field(default_factory=list)  # the new version of each
    kept: list[str] = field(default_factory=list)  # why something was kept as it was

    def describe(self) -> list[str]:
        """One human-readable line per difference, in a stable order."""
        lines = [*self.kept]
        lines += [f"{label(m.name)}: version {m.version} added" for m in self.added]
        lines += [f"{label(m.name)}: version {m.version} removed" for m in self.removed]
        lines += [f"{label(m.name)}: version {m.version} changed" for m in self.changed]
        return lines


def compare(old: Versions, fresh: Versions, problems: list[LayoutProblem], models_can_vanish: bool) -> Comparison:
    """Merge a new scan into the served state.

    `models_can_vanish`: with `dir`, a sub-folder that disappeared is a model removed; with
    `path`/`paths` the config names every model, so a model whose folder is now missing or
    empty keeps its versions (and the problem is reported).
    """
    bad_models = {p.name for p in problems if p.version is None}
    bad_versions = {(p.name, p.version) for p in problems if p.version is not None}
    result = Comparison(state={})
    result.kept = [f"ignored, keeping the previous state: {p.message}" for p in problems]
    for name in sorted(set(old) | set(fresh)):
        before = old.get(name, {})
        if name not in fresh and (name in bad_models or not models_can_vanish):
            result.state[name] = dict(before)
            continue
        after = fresh.get(name, {})
        merged: dict[int, ModelVersion] = {}
        for number in sorted(set(before) | set(after)):
            previous, current = before.get(number), after.get(number)
            if current is None and previous is not None and (name, number) in bad_versions:
                merged[number] = previous
            elif current is None and previous is not None:
                result.removed.append(previous)
            elif current is not None and previous is None:
                result.added.append(current)
                merged[number] = current
            elif current is not None and previous is not None:
                if current.files != previous.files:
                    result.changed.append(current)
                merged[number] = current
        if merged:
            result.state[name] = merged
    return result
