"""A local wheelhouse of tiny packages the tests make themselves, so no test needs a package index.

A wheel is a zip with the package's files and a `.dist-info` folder (METADATA, WHEEL, RECORD);
`make_wheel` writes exactly that, so uv resolves and installs it as it would any wheel from PyPI.
"""

from __future__ import annotations

import base64
import hashlib
import io
import tarfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

# The package two APIs pin at different versions; its module says which version it is.
GREETING = "sluice-test-greeting"
GREETING_MODULE = "sluicetestgreeting"
# A package whose oldest release has no wheel, only a source that does not build.
OLD_BUILD = "sluice-test-old-build"


def make_wheel(folder: Path, name: str, version: str, files: dict[str, str], requires: Sequence[str] = (),
               wheel_version: str = "1.0") -> Path:
    """Write `<name>-<version>-py3-none-any.whl` holding `files` (path in the wheel -> text)."""
    folder.mkdir(parents=True, exist_ok=True)
    dist = f"{name.replace('-', '_')}-{version}.dist-info"
    contents = dict(files)
    contents[f"{dist}/METADATA"] = (f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                    + "".join(f"Requires-Dist: {r}\n" for r in requires))
    contents[f"{dist}/WHEEL"] = (f"Wheel-Version: {wheel_version}\nGenerator: sluice-tests\nRoot-Is-Purelib: true\n"
                                 "Tag: py3-none-any\n")
    record = []
    path = folder / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for arcname, text in contents.items():
            data = text.encode()
            wheel.writestr(arcname, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{arcname},sha256={digest},{len(data)}")
        record.append(f"{dist}/RECORD,,")
        wheel.writestr(f"{dist}/RECORD", "\n".join(record) + "\n")
    return path


def make_unbuildable_sdist(folder: Path, name: str, version: str) -> Path:
    """Write `<name>-<version>.tar.gz`, a source distribution whose build fails (as an old release's does
    on a Python it has no wheel for)."""
    folder.mkdir(parents=True, exist_ok=True)
    root = f"{name.replace('-', '_')}-{version}"
    path = folder / f"{root}.tar.gz"
    files = {f"{root}/PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{root}/setup.py": f"raise SystemExit('{name} {version} builds only on Python 3.7')\n"}
    with tarfile.open(path, "w:gz") as sdist:
        for arcname, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(arcname)
            info.size = len(data)
            sdist.addfile(info, io.BytesIO(data))
    return path


def make_wheelhouse(folder: Path) -> Path:
    """The tests' packages:

    - `sluice-test-greeting` 1.0.0 and 2.0.0 (module `sluicetestgreeting`, `VERSION` and `greet()`);
    - `sluice-test-old-celery` 1.0, which requires `celery<5` (a conflict through a dependency);
    - `sluice-test-broken` 1.0, whose metadata resolves but whose wheel no installer accepts (a
      wheel format version from the future), as a package a host cannot install;
    - `sluice-test-old-build` 1.0 as a source distribution that does not build, then 2.0 and 3.0
      as wheels: an old pin with no wheel for this Python.
    """
    for version in ("1.0.0", "2.0.0"):
        make_wheel(folder, GREETING, version, {
            f"{GREETING_MODULE}/__init__.py": f"VERSION = {version!r}\n\n\ndef greet(name):\n"
                                              f"    return 'hello ' + name + ' from {version}'\n"})
    make_wheel(folder, "sluice-test-old-celery", "1.0", {"sluicetestoldcelery/__init__.py": "X = 1\n"},
               requires=["celery<5"])
    make_wheel(folder, "sluice-test-broken", "1.0", {"sluicetestbroken/__init__.py": "X = 1\n"}, wheel_version="9.0")
    make_unbuildable_sdist(folder, OLD_BUILD, "1.0")
    for version in ("2.0", "3.0"):
        make_wheel(folder, OLD_BUILD, version, {"sluicetestoldbuild/__init__.py": f"VERSION = {version!r}\n"})
    return folder
