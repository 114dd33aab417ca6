"""Project folders: what the predictor sees, and bundles that carry it to every worker."""

from __future__ import annotations

import io
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from foundation.errors import ConfigError
from predictors_runtime.project import (
    bundle_digest,
    pack_project,
    project_files,
    read_dotenv,
    unpack_project,
)


def make(root: Path, files: dict[str, str]) -> Path:
    """Write `files` (relative path -> text) under `root` and return root."""
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def tar_of(members: dict[str, bytes], *, prefix: str = "", compress: bool = True) -> bytes:
    """A bundle built another way: given order, real mtimes, optional './' prefix."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz" if compress else "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(prefix + name)
            info.size = len(data)
            info.mtime = 1_700_000_000
            info.uid = 1000
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def hostile_tar(info: tarfile.TarInfo, data: bytes = b"") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return buffer.getvalue()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return make(
        tmp_path / "proj",
        {
            "cortex.yaml": "- name: x\n",
            "predictor.py": "class PythonPredictor: ...\n",
            "lib/helpers.py": "X = 1\n",
            "lib/helpers.pyc": "compiled",
            "lib/__pycache__/helpers.cpython-311.pyc": "compiled",
            "native.pyd": "compiled",
            "opt.pyo": "compiled",
            ".env": "KEY=value\n",
            ".secret": "hidden",
            ".git/config": "[core]\n",
            "data/labels.txt": "a\nb\n",
        },
    )


def test_the_predictor_gets_every_file_except_compiled_and_dot_files(project: Path) -> None:
    assert project_files(project) == [
        "cortex.yaml",
        "data/labels.txt",
        "lib/helpers.py",
        "predictor.py",
    ]


def test_the_config_file_is_left_out_when_it_is_inside_the_project(project: Path) -> None:
    files = project_files(project, project / "cortex.yaml")
    assert "cortex.yaml" not in files
    assert "predictor.py" in files


def test_a_config_file_outside_the_project_changes_nothing(project: Path, tmp_path: Path) -> None:
    outside = make(tmp_path, {"other/cortex.yaml": "- name: x\n"}) / "other" / "cortex.yaml"
    assert project_files(project, outside) == project_files(project)


def test_cortexignore_leaves_out_matching_files_and_folders(project: Path) -> None:
    make(
        project,
        {
            "data/raw/big.bin": "x",
            "notes.md": "n",
            "keep.md": "k",
            "nested/data/inner.txt": "i",
            ".cortexignore": "# a comment\n*.md\n!keep.md\ndata/\n",
        },
    )
    assert project_files(project, project / "cortex.yaml") == [
        "keep.md",
        "lib/helpers.py",
        "predictor.py",
    ]


def test_cortexignore_anchored_patterns_only_match_at_the_root(project: Path) -> None:
    make(project, {"sub/data/x.txt": "x", ".cortexignore": "/data\n"})
    assert project_files(project) == [
        "cortex.yaml",
        "lib/helpers.py",
        "predictor.py",
        "sub/data/x.txt",
    ]


def test_a_file_in_an_ignored_folder_can_not_be_re_included(project: Path) -> None:
    make(project, {".cortexignore": "lib/\n!lib/helpers.py\n"})
    assert "lib/helpers.py" not in project_files(project)


def test_a_symlink_that_escapes_the_project_is_skipped(project: Path, tmp_path: Path) -> None:
    secret = make(tmp_path, {"outside/secret.txt": "s"}) / "outside"
    os.symlink(secret / "secret.txt", project / "leak.txt")
    os.symlink(secret, project / "leakdir")
    os.symlink(project / "data" / "labels.txt", project / "labels-link.txt")
    os.symlink(project / "missing.txt", project / "dangling.txt")
    files = project_files(project)
    assert "leak.txt" not in files
    assert not any(f.startswith("leakdir") for f in files)
    assert "dangling.txt" not in files
    assert "labels-link.txt" in files


def test_a_missing_project_folder_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        project_files(tmp_path / "nope")


def test_dotenv_is_read_into_strings(tmp_path: Path) -> None:
    make(tmp_path, {".env": "# comment\nA=1\nB='quoted value'\nexport C=three\nEMPTY=\nBARE\n"})
    assert read_dotenv(tmp_path) == {
        "A": "1",
        "B": "quoted value",
        "C": "three",
        "EMPTY": "",
        "BARE": "",
    }


def test_a_project_without_dotenv_has_no_variables(tmp_path: Path) -> None:
    assert read_dotenv(tmp_path) == {}


def test_packing_the_same_folder_twice_gives_identical_bytes(project: Path) -> None:
    first = pack_project(project, project / "cortex.yaml")
    os.utime(project / "predictor.py", (1, 1))
    second = pack_project(project, project / "cortex.yaml")
    assert first == second


def test_a_bundle_holds_the_predictors_files_and_dotenv_with_fixed_headers(project: Path) -> None:
    (project / "predictor.py").chmod(0o755)
    data = pack_project(project, project / "cortex.yaml")
    assert data[:2] == b"\x1f\x8b" and data[4:8] == b"\0\0\0\0"  # gzip header mtime 0
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == [
        ".env",
        "data/labels.txt",
        "lib/helpers.py",
        "predictor.py",
    ]
    for m in members:
        assert (m.mtime, m.uid, m.gid, m.uname, m.gname) == (0, 0, 0, "", "")
    modes = {m.name: m.mode for m in members}
    assert modes["predictor.py"] == 0o755
    assert modes["lib/helpers.py"] == 0o644


def test_a_copied_folder_packs_to_the_same_digest(project: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(project, copy)
    os.utime(copy / "predictor.py", (12345, 12345))
    original = pack_project(project, project / "cortex.yaml")
    copied = pack_project(copy, copy / "cortex.yaml")
    assert bundle_digest(original) == bundle_digest(copied)
    (copy / "predictor.py").write_text("changed\n")
    assert bundle_digest(pack_project(copy, copy / "cortex.yaml")) != bundle_digest(original)


def test_the_digest_depends_on_contents_not_on_how_the_archive_was_made() -> None:
    files = {"b.py": b"B", "a.py": b"A"}
    reversed_files = dict(reversed(list(files.items())))
    digest = bundle_digest(tar_of(files))
    assert bundle_digest(tar_of(reversed_files, prefix="./")) == digest
    assert bundle_digest(tar_of(files, compress=False)) == digest
    assert bundle_digest(tar_of({"a.py": b"A", "b.py": b"other"})) != digest
    assert bundle_digest(tar_of({"a.py": b"A", "c.py": b"B"})) != digest


def test_a_bundle_larger_than_the_limit_is_refused_naming_the_size(project: Path) -> None:
    (project / "weights.bin").write_bytes(os.urandom(64 * 1024))
    with pytest.raises(ConfigError, match=r"larger than 32768 bytes") as info:
        pack_project(project, max_bytes=32 * 1024)
    assert ".cortexignore" in info.value.message


def test_a_bundle_unpacks_to_the_files_it_was_packed_from(project: Path, tmp_path: Path) -> None:
    dest = tmp_path / "out" / "bundle"
    unpack_project(pack_project(project, project / "cortex.yaml"), dest)
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()) == [
        ".env",
        "data/labels.txt",
        "lib/helpers.py",
        "predictor.py",
    ]
    assert (dest / "lib" / "helpers.py").read_text() == "X = 1\n"
    assert read_dotenv(dest) == {"KEY": "value"}


def test_unpacking_refuses_a_member_that_climbs_out(tmp_path: Path) -> None:
    data = hostile_tar(tarfile.TarInfo("../evil.py"), b"boom")
    with pytest.raises(ConfigError, match="leaves the destination folder"):
        unpack_project(data, tmp_path / "dest")
    assert not (tmp_path / "evil.py").exists()
    assert not (tmp_path / "dest").exists()


def test_unpacking_refuses_an_absolute_member(tmp_path: Path) -> None:
    target = tmp_path / "abs.py"
    data = hostile_tar(tarfile.TarInfo(str(target)), b"boom")
    with pytest.raises(ConfigError, match="absolute path"):
        unpack_project(data, tmp_path / "dest")
    assert not target.exists()


@pytest.mark.parametrize("kind", [tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.CHRTYPE])
def test_unpacking_refuses_links_and_devices(tmp_path: Path, kind: bytes) -> None:
    info = tarfile.TarInfo("link")
    info.type = kind
    info.linkname = "/etc/passwd"
    with pytest.raises(ConfigError, match="links and devices are refused"):
        unpack_project(hostile_tar(info), tmp_path / "dest")


def test_garbage_is_not_a_bundle(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a readable tar archive"):
        unpack_project(b"not a tarball", tmp_path / "dest")
    with pytest.raises(ConfigError):
        bundle_digest(b"not a tarball")
