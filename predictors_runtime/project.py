"""Project folders: which files a predictor gets, its `.env`, and the bundle workers fetch.

A deploy packs the folder once into a deterministic tar.gz so that the bundle's digest names
its contents: the same folder deployed twice is stored once, and every worker on every host
runs exactly the code that was deployed. Unpacking is strict because a bundle may come from
storage that someone else can write to.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import posixpath
import tarfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pathspec
from dotenv import dotenv_values

from foundation.errors import ConfigError
from foundation.limits import MAX_BUNDLE_BYTES, MAX_BUNDLE_FILES, MAX_UNPACKED_BYTES

IGNORE_FILE = ".cortexignore"
DOTENV_FILE = ".env"
_COMPILED_SUFFIXES = (".pyc", ".pyo", ".pyd")


def _ignore_spec(root: Path) -> pathspec.GitIgnoreSpec | None:
    """The `.cortexignore` rules of `root`, or None when there is none."""
    path = root / IGNORE_FILE
    if not path.is_file():
        return None
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
        return pathspec.GitIgnoreSpec.from_lines(lines)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ConfigError(f"{path}: cannot read ignore rules: {e}") from e


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def project_files(root: Path, config_file: Path | None = None) -> list[str]:
    """Sorted POSIX paths (relative to `root`) of the files the predictor gets.

    Left out: compiled Python, dot-files and dot-folders, `__pycache__`, the config file and
    whatever `.cortexignore` excludes (gitignore rules; files in an excluded folder cannot be
    re-included, as in git). A symlinked file is kept only when it resolves to a regular file
    inside `root`, so a bundle never carries files from elsewhere on the deploying host;
    symlinked folders are not followed, which also rules out link cycles.
    """
    root = Path(root)
    if not root.is_dir():
        raise ConfigError(f"{root}: project folder does not exist or is not a folder")
    real_root = root.resolve()
    skip = Path(config_file).resolve() if config_file is not None else None
    spec = _ignore_spec(root)
    found: list[str] = []
    for folder, dirnames, filenames in os.walk(root, followlinks=False):
        rel_folder = Path(folder).relative_to(root).as_posix()
        prefix = "" if rel_folder == "." else rel_folder + "/"
        kept_dirs = []
        for name in dirnames:
            if name.startswith(".") or name == "__pycache__":
                continue
            if os.path.islink(os.path.join(folder, name)):
                continue
            if spec is not None and spec.match_file(prefix + name + "/"):
                continue
            kept_dirs.append(name)
        dirnames[:] = sorted(kept_dirs)
        for name in filenames:
            if name.startswith(".") or name.endswith(_COMPILED_SUFFIXES):
                continue
            rel = prefix + name
            if spec is not None and spec.match_file(rel):
                continue
            full = Path(folder) / name
            real = full.resolve()
            if not _inside(real, real_root) or not real.is_file():
                continue
            if skip is not None and real == skip:
                continue
            found.append(rel)
    return sorted(found)


def read_dotenv(root: Path) -> dict[str, str]:
    """The `VARIABLE=value` pairs of `root/.env` (none when absent); bare names map to ""."""
    path = Path(root) / DOTENV_FILE
    if not path.is_file():
        return {}
    try:
        values = dotenv_values(path, encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read: {e}") from e
    return {key: "" if value is None else value for key, value in values.items()}


class _CappedBuffer(io.BytesIO):
    """A BytesIO that refuses to grow past a limit, so a huge folder fails early."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def write(self, data: bytes) -> int:  # type: ignore[override]
        if self.tell() + len(data) > self.limit:
            raise _TooLarge()
        return super().write(data)


class _TooLarge(Exception):
    """Raised inside the packer when the bundle outgrows its limit."""


def _member(name: str, size: int, executable: bool) -> tarfile.TarInfo:
    """A tar header with nothing in it that depends on who packed it or when."""
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode = 0o755 if executable else 0o644
    info.type = tarfile.REGTYPE
    return info


def pack_project(
    root: Path, config_file: Path | None = None, *, max_bytes: int = MAX_BUNDLE_BYTES
) -> bytes:
    """A deterministic tar.gz of `project_files(root)` plus `.env`: same files, same bytes.

    `.env` is left out of the predictor's files (it is a dot-file) but workers need it to set
    the predictor's environment, so the bundle carries it as `.env`.
    """
    root = Path(root)
    names = project_files(root, config_file)
    dotenv = root / DOTENV_FILE
    if dotenv.is_file() and _inside(dotenv.resolve(), root.resolve()):
        names.append(DOTENV_FILE)
    names.sort()
    buffer = _CappedBuffer(max_bytes)
    current = ""
    try:
        with (gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0, compresslevel=6) as gz,
              tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar):
                for name in names:
                    current = name
                    path = root / name
                    stat = path.stat()
                    info = _member(name, stat.st_size, bool(stat.st_mode & 0o111))
                    with path.open("rb") as handle:
                        tar.addfile(info, handle)
    except _TooLarge as e:
        raise ConfigError(
            f"{root}: project bundle is larger than {max_bytes} bytes "
            f"({max_bytes / (1024 * 1024):g} MiB) once packed (limit reached while adding "
            f"{current!r}); list large files in {IGNORE_FILE} and load models from storage"
        ) from e
    except OSError as e:
        raise ConfigError(f"{root}: cannot pack {current!r}: {e}") from e
    return buffer.getvalue()


@dataclass(frozen=True)
class BundleLimits:
    """What one bundle may unpack to (`SLUICE_MAX_UNPACKED_BUNDLE_BYTES`, `SLUICE_MAX_BUNDLE_FILES`)."""

    unpacked_bytes: int = MAX_UNPACKED_BYTES
    files: int = MAX_BUNDLE_FILES


def _open_bundle(data: bytes) -> tarfile.TarFile:
    try:
        return tarfile.open(fileobj=io.BytesIO(data), mode="r:*")
    except (tarfile.TarError, EOFError, OSError) as e:
        raise ConfigError(f"project bundle is not a readable tar archive: {e}") from e


def _safe_name(member: tarfile.TarInfo) -> str:
    """The member's normalised relative path; refuse anything that could land outside dest."""
    name = member.name
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        raise ConfigError(f"project bundle member {name!r} has an absolute path")
    normal = posixpath.normpath(name.replace("\\", "/"))
    if normal == ".." or normal.startswith("../"):
        raise ConfigError(f"project bundle member {name!r} leaves the destination folder")
    if not (member.isfile() or member.isdir()):
        raise ConfigError(
            f"project bundle member {name!r} is not a regular file or folder "
            "(links and devices are refused)"
        )
    if member.issparse():  # `sluice deploy` never writes one; refused rather than reasoned about
        raise ConfigError(f"project bundle member {name!r} is a sparse file (sparse files are refused)")
    return normal


def _checked_members(tar: tarfile.TarFile, limits: BundleLimits) -> Iterator[tarfile.TarInfo]:
    """The members of `tar`, header by header, each checked; refused as soon as a limit is passed.

    The sizes counted are the headers' (a PAX `size` included), and extraction writes exactly
    that many bytes per file (less data is a read error), so the count bounds what is written.
    Reading stops at the first header over a limit, before the body it announces is inflated.
    """
    total = 0
    count = 0
    try:
        for member in tar:
            _safe_name(member)
            count += 1
            if count > limits.files:
                raise ConfigError(
                    f"project bundle holds more than {limits.files} files and folders, the limit "
                    "(SLUICE_MAX_BUNDLE_FILES); list what the predictor does not need in .cortexignore"
                )
            total += member.size if member.isfile() else 0
            if total > limits.unpacked_bytes:
                raise ConfigError(
                    f"project bundle unpacks to more than {limits.unpacked_bytes} bytes "
                    f"({limits.unpacked_bytes / 2**20:g} MiB), the limit (SLUICE_MAX_UNPACKED_BUNDLE_BYTES; "
                    f"reached at {member.name!r}); load large files from storage instead"
                )
            yield member
    except (tarfile.TarError, EOFError, OSError, zlib.error) as e:
        raise ConfigError(f"project bundle is corrupt: {e}") from e


def bundle_digest(data: bytes, limits: BundleLimits = BundleLimits()) -> str:
    """sha256 over the bundle's *contents*: sorted (path, sha256 of file bytes) pairs.

    Headers, order, compression and folder entries do not count, so two archives of the same
    files share a digest however they were produced. Content-addressed storage keys on this.
    """
    files: dict[str, str] = {}
    with _open_bundle(data) as tar:
        for member in _checked_members(tar, limits):
            name = _safe_name(member)
            if member.isdir():
                continue
            try:
                handle = tar.extractfile(member)
                assert handle is not None  # regular files always have a body
                digest = hashlib.sha256()
                while chunk := handle.read(1024 * 1024):
                    digest.update(chunk)
            except (tarfile.TarError, EOFError, OSError, zlib.error) as e:
                raise ConfigError(f"project bundle is corrupt: {e}") from e
            files[name] = digest.hexdigest()
    total = hashlib.sha256()
    for name in sorted(files):
        total.update(name.encode("utf-8") + b"\0" + files[name].encode("ascii") + b"\n")
    return total.hexdigest()


def unpack_project(data: bytes, dest: Path, limits: BundleLimits = BundleLimits()) -> int:
    """Extract a bundle into `dest` (created if missing), refusing unsafe members; returns the
    bytes of its files.

    Every member is checked, the limits included, before anything is written, so a refused
    bundle leaves nothing behind; the stdlib "data" filter is applied on top when this Python
    has it.
    """
    dest = Path(dest)
    with _open_bundle(data) as tar:
        members = list(_checked_members(tar, limits))
        dest.mkdir(parents=True, exist_ok=True)
        try:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(dest, members=members, filter="data")
            else:  # pragma: no cover - Python < 3.11.4; members were checked above
                tar.extractall(dest, members=members)
        except (tarfile.TarError, OSError, zlib.error) as e:
            raise ConfigError(f"cannot unpack project bundle into {dest}: {e}") from e
    return sum(member.size for member in members if member.isfile())
