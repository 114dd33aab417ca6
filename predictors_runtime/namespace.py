"""What one API version's user code sees of the process: environment, import path, modules, folder.

A batch worker process runs the jobs of many APIs one after another, and a predictor's code
reaches for process-wide things: `os.environ` (its `.env`), `sys.path` (its project folder),
`sys.modules` (`import helpers`) and the working directory. Written for the life of the
process, job B would see job A's variables and import A's `helpers.py`, and a redeployed
`helpers.py` would never be imported again. An `ApiNamespace` holds one API version's view of
those four things and puts it in place only while that API's code runs:

- `os.environ`: the process's own environment plus the API's `.env` and `predictor.env`. The
  process's own is taken as it stands when the first namespace is entered (outside every
  namespace, so it holds no API's variables) and restored exactly when the last one is left,
  so variables Sluice itself sets between jobs are neither lost nor frozen at a stale copy.
  Changes user code makes while active stay with its namespace for its next activation.
- `sys.path`: the API's folders first (`python_path`, then the project folder), then the
  process's own path, and no other API's folders. Entries user code adds stay with it too.
- `sys.modules`: a module is the API's when its file (or, for a namespace package, a folder of
  its `__path__`) lies under one of the API's folders; the predictor module itself is one of
  them. They are in `sys.modules` only while the namespace is active: on leaving they are taken
  out and kept by the namespace, on entering they are put back. Modules from anywhere else
  (the standard library, site-packages) are imported once and shared by every API.
- the working directory: the project folder, as in Cortex.

Limits, by the nature of one Python process:
- Swapping is process-wide and not thread-safe: activate from one thread at a time. Threads
  that run while a namespace is active (a model-polling thread calling `load_model` on a
  reload, threads the user's code started) see whatever namespace is active at that moment,
  or none. A process that serves one API from many threads calls `install()` instead.
- A top-level module of the API's folders wins over one of the same name the process imported
  from elsewhere (a project's `api.py` or `jobs.py` over Sluice's packages, its `utils.py` over
  an installed `utils`): while the namespace is in place that other module is out of
  `sys.modules` under its top-level name, so the API's code imports its own. Its submodules stay
  where they are, so code that imported them before keeps working.
- Compiled extension modules cannot be unloaded; one imported from a project folder stays
  loaded in the process even when its namespace takes it out of `sys.modules`.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from foundation.errors import SluiceError


class _EnvironReader:
    """`dict(os.environ)`, decoded once per change of the environment rather than on every read.

    Decoding every variable costs about a microsecond each, and the environment is read twice
    around every batch; comparing CPython's raw mapping under `os.environ` is a C-level check.
    Where that mapping is missing, every read decodes.
    """

    KEPT = 4  # the process's own environment and the namespaces used in turn with it

    def __init__(self) -> None:
        self._seen: list[tuple[dict[Any, Any], dict[str, str]]] = []  # (raw, decoded), latest first

    def read(self) -> dict[str, str]:
        raw = getattr(os.environ, "_data", None)
        if not isinstance(raw, dict):
            return dict(os.environ)
        for index, (known, decoded) in enumerate(self._seen):
            if known == raw:
                if index:
                    self._seen.insert(0, self._seen.pop(index))
                return dict(decoded)
        decoded = dict(os.environ)
        self._seen.insert(0, (dict(raw), decoded))
        del self._seen[self.KEPT:]
        return dict(decoded)


_read_environ = _EnvironReader().read


def _set_environ(target: Mapping[str, str], current: Mapping[str, str] | None = None) -> None:
    """Make `os.environ` (and the C environment under it) equal to `target`, touching only what differs.

    `current` is what `os.environ` holds now when the caller knows it: reading `os.environ`
    decodes every variable, and this runs twice around every batch.
    """
    if current is None:
        current = _read_environ()
    if current == target:
        return
    for key in current.keys() - target.keys():
        os.environ.pop(key, None)
    for key, value in target.items() - current.items():
        os.environ[key] = value


@dataclass
class _Outside:
    """The process as it is outside every namespace."""

    environ: dict[str, str]
    path: list[str]
    cwd: str | None

    @classmethod
    def capture(cls) -> _Outside:
        try:
            cwd: str | None = os.getcwd()
        except FileNotFoundError:  # the folder was removed under the process: nowhere to return to
            cwd = None
        return cls(_read_environ(), list(sys.path), cwd)


# Process-wide, like the things they guard: the namespaces entered, innermost last (only that
# one is in place), and the process's own state while any namespace is in place.
_entered: list[ApiNamespace] = []
_outside: _Outside | None = None

# Put last in `sys.modules` when a namespace is put in place: `sys.modules` keeps insertion order,
# so every module imported while the namespace is in place comes after it. Finding them costs the
# few imported, where a snapshot of every name (thousands in a worker) cost a tenth of a
# millisecond around every batch.
_MARK = "_sluice_namespace_mark"
_MARK_MODULE = ModuleType(_MARK, "Marks where the modules imported under a Sluice API namespace begin.")


def _imported_since_mark() -> list[str]:
    """The names put in `sys.modules` since the mark (all of them if something removed the mark)."""
    try:
        since: list[str] = []
        for name in reversed(sys.modules):  # newest first: stops after the few imported since
            if name == _MARK:
                return since
            since.append(name)
        return since
    except RuntimeError:  # another thread imported meanwhile: read them all at once (one C call)
        names = list(sys.modules)
        return names[names.index(_MARK) + 1:] if _MARK in names else names


def _locations(module: Any) -> list[str]:
    """Where a module was loaded from, read from its `__dict__` so no lazy module is triggered."""
    try:
        namespace = object.__getattribute__(module, "__dict__")
    except Exception:  # noqa: BLE001 - not a module: some libraries put other objects in sys.modules
        return []
    file = namespace.get("__file__")
    if isinstance(file, str):
        return [file]
    try:
        return [entry for entry in namespace.get("__path__") or () if isinstance(entry, str)]
    except Exception:  # noqa: BLE001 - a foreign object's __path__ may raise anything: not the API's
        return []


def active_namespace() -> ApiNamespace | None:
    """The namespace in place now, if any."""
    return _entered[-1] if _entered else None


class ApiNamespace:
    """One API version's environment, import path, modules and working directory.

    `active()` puts them in place around a call and takes them away after; `install()` puts
    them in place for the rest of the process.
    """

    def __init__(self, project_dir: Path, env: Mapping[str, str], python_paths: Sequence[Path] = ()) -> None:
        """`env`: the API's variables (`.env` with `predictor.env` over it). `python_paths`: folders
        searched before the project folder, which is always searched."""
        self.project_dir = Path(project_dir).resolve()
        folders: list[Path] = []
        for folder in [*(Path(p) for p in python_paths), self.project_dir]:
            folder = folder.resolve()
            if folder not in folders:
                folders.append(folder)
        self.folders: tuple[Path, ...] = tuple(folders)
        given = [Path(p) for p in [*python_paths, project_dir] if Path(p).is_absolute()]
        self._roots = tuple(sorted({os.path.join(os.path.abspath(f), "") for f in [*given, *folders]}))
        # What this API changes of the process's environment: a value, or None for "unset".
        self._environ: dict[str, str | None] = dict(env)
        # This API's import path entries, searched before and after the process's own.
        self._path_front: list[str] = [str(f) for f in folders]
        self._path_back: list[str] = []
        # This API's modules while it is not in place.
        self._modules: dict[str, ModuleType] = {}
        # While in place: what was applied, the module names put back (those imported meanwhile
        # follow `_MARK` in sys.modules), and what our modules displaced in sys.modules.
        self._applied_environ: dict[str, str] = {}
        self._modules_put_back: set[str] = set()
        self._displaced: dict[str, Any] = {}
        self._installed = False
        self._closed = False
        self._provided: frozenset[str] | None = None  # top-level module names the folders hold

    def __repr__(self) -> str:
        return f"ApiNamespace({str(self.project_dir)!r})"

    # -- public -----------------------------------------------------------------------------
    @property
    def is_active(self) -> bool:
        """Whether this namespace is in place now."""
        return active_namespace() is self

    @property
    def installed(self) -> bool:
        return self._installed

    def owns(self, module: Any) -> bool:
        """Whether a module is this API's: loaded from under one of its folders."""
        return any(os.path.abspath(location).startswith(self._roots) for location in _locations(module))

    def module_names(self) -> list[str]:
        """Names of the modules this namespace holds (in place or kept aside), sorted."""
        if self.is_active:
            return sorted(name for name, module in list(sys.modules.items()) if self.owns(module))
        return sorted(self._modules)

    @contextlib.contextmanager
    def active(self) -> Iterator[ApiNamespace]:
        """Put this namespace in place for the block, and the previous state back after it.

        Re-entrant: entered again while in place, it stays in place until the outermost block
        ends. Entered while another namespace is in place, that one is set aside for the block
        and put back after. Everything is restored when the block raises, too. On a namespace
        that is installed this is a no-op (safe from any thread).
        """
        if self._installed and self.is_active:
            yield self
            return
        self._enter()
        try:
            yield self
        finally:
            self._leave()

    def install(self) -> None:
        """Put this namespace in place for the life of the process; `active()` becomes a no-op.

        For a process that serves only this API, from several threads, where swapping around
        each call would be unsafe. Refused while another namespace is in place.
        """
        if self._installed:
            return
        if any(other is not self for other in _entered):
            raise SluiceError(f"cannot install {self!r} while {active_namespace()!r} is active")
        if self._closed:
            raise SluiceError(f"{self!r} is closed")
        if not _entered:
            self._enter()
        else:  # inside our own active(): stay in place after it ends
            _entered.insert(0, self)
        self._installed = True

    def close(self) -> None:
        """Let go of the modules this namespace keeps aside, so they can be freed; it cannot be entered again.

        An installed namespace keeps its modules in place: the process serves it to the end.
        """
        if self._closed:
            return
        if self in _entered and not self._installed:
            raise SluiceError(f"cannot close {self!r} while it is active")
        self._closed = True
        self._modules.clear()
        if not self._installed:
            for key in list(sys.path_importer_cache):  # the import finders of our folders
                if isinstance(key, str) and os.path.join(key, "").startswith(self._roots):
                    sys.path_importer_cache.pop(key, None)

    def provided_names(self) -> frozenset[str]:
        """The top-level module names the API's folders hold (`x.py`, a package `x/`, an extension `x.*.so`)."""
        if self._provided is None:
            names: set[str] = set()
            for folder in self.folders:
                try:
                    entries = list(os.scandir(folder))
                except OSError:
                    continue
                for entry in entries:
                    name = entry.name
                    if entry.is_dir():
                        if os.path.exists(os.path.join(entry.path, "__init__.py")) and name.isidentifier():
                            names.add(name)
                    elif name.endswith((".py", ".so", ".pyd")):
                        stem = name.split(".", 1)[0]
                        if stem.isidentifier():
                            names.add(stem)
            self._provided = frozenset(names)
        return self._provided

    # -- swapping ---------------------------------------------------------------------------
    def _enter(self) -> None:
        global _outside
        if self._closed:
            raise SluiceError(f"{self!r} is closed")
        below = active_namespace()
        if below is not self:
            if below is None:
                _outside = _Outside.capture()
            else:
                below._withdraw()
            try:
                self._apply()
            except BaseException:
                self._restore_outside()
                if below is not None:
                    below._apply()
                elif not _entered:
                    _outside = None
                raise
        _entered.append(self)

    def _leave(self) -> None:
        global _outside
        if active_namespace() is not self:
            raise SluiceError(f"{self!r} left while {active_namespace()!r} is active")
        _entered.pop()
        below = active_namespace()
        if below is self:
            return
        self._withdraw()
        if below is None:
            _outside = None
        else:
            below._apply()

    def _apply(self) -> None:
        """Put this namespace's state in place over the process's own."""
        outside = _outside
        assert outside is not None
        os.chdir(self.project_dir)
        environ = dict(outside.environ)
        for key, value in self._environ.items():
            if value is None:
                environ.pop(key, None)
            else:
                environ[key] = value
        _set_environ(environ, outside.environ)  # the process's own is in place: just captured or restored
        self._applied_environ = environ
        own = set(self._path_front) | set(self._path_back)
        sys.path[:] = [*self._path_front, *(p for p in outside.path if p not in own), *self._path_back]
        self._displaced = {name: sys.modules[name] for name in self._modules if name in sys.modules}
        for name in self.provided_names() - self._modules.keys():  # the API's own modules win over others
            module = sys.modules.get(name)
            if module is not None and not self.owns(module):
                self._displaced[name] = sys.modules.pop(name)
        self._modules_put_back = set(self._modules)
        sys.modules.update(self._modules)
        sys.modules.pop(_MARK, None)
        sys.modules[_MARK] = _MARK_MODULE
        self._modules = {}

    def _withdraw(self) -> None:
        """Take this namespace's state out (keeping what its code changed) and put the process's own back."""
        # Modules first, while the namespace's path and folder are still in place.
        kept: dict[str, ModuleType] = {}
        for name in {*_imported_since_mark(), *self._modules_put_back}:
            module = sys.modules.get(name)
            if module is not None and self.owns(module):
                kept[name] = module
        for name in kept:
            sys.modules.pop(name, None)
        sys.modules.pop(_MARK, None)
        self._modules = kept
        self._modules_put_back = set()
        sys.modules.update(self._displaced)
        self._displaced = {}
        current = _read_environ()
        applied = self._applied_environ
        if current != applied:
            for key in current.keys() | applied.keys():
                if current.get(key) != applied.get(key):
                    self._environ[key] = current.get(key)
        self._applied_environ = {}
        outside = _outside
        assert outside is not None
        own = set(self._path_front) | set(self._path_back)
        theirs = set(outside.path)
        front: list[str] = []
        back: list[str] = []
        past_theirs = False
        for entry in sys.path:
            if entry in own or entry not in theirs:
                side = back if past_theirs else front
                if entry not in front and entry not in back:
                    side.append(entry)
            else:
                past_theirs = True
        self._path_front, self._path_back = front, back
        self._restore_outside(current)

    @staticmethod
    def _restore_outside(current_environ: dict[str, str] | None = None) -> None:
        outside = _outside
        assert outside is not None
        _set_environ(outside.environ, current_environ)
        sys.path[:] = outside.path
        if outside.cwd is not None:
            with contextlib.suppress(OSError):
                os.chdir(outside.cwd)
