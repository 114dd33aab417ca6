"""Each API version's code sees only its own environment, import path, modules and folder."""

from __future__ import annotations

import os
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from foundation.errors import SluiceError
from predictors_runtime.namespace import ApiNamespace, active_namespace


@pytest.fixture(autouse=True)
def _nothing_left_in_place() -> Iterator[None]:
    path, cwd = list(sys.path), os.getcwd()
    yield
    assert active_namespace() is None
    assert sys.path == path
    assert os.getcwd() == cwd
    for name in ("helpers", "shapes", "shapes.circle", "plain"):
        assert name not in sys.modules


def project(folder: Path, **files: str) -> Path:
    """A project folder with the given files (`pkg/mod.py` makes the folders)."""
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def api_a(tmp_path: Path) -> ApiNamespace:
    folder = project(
        tmp_path / "a",
        **{"helpers.py": "def who():\n    return 'a'\n\nCALLS = []\n",
           "shapes/__init__.py": "KIND = 'a-shapes'\n",
           "shapes/circle.py": "AREA = 'a-circle'\n",
           "plain/part.py": "NAME = 'a-plain'\n"},  # `plain` is a namespace package (no __init__.py)
    )
    return ApiNamespace(folder, {"ONLY_A": "1"}, [])


def api_b(tmp_path: Path) -> ApiNamespace:
    folder = project(
        tmp_path / "b",
        **{"helpers.py": "def who():\n    return 'b'\n\nCALLS = []\n",
           "shapes/__init__.py": "KIND = 'b-shapes'\n",
           "shapes/circle.py": "AREA = 'b-circle'\n",
           "plain/part.py": "NAME = 'b-plain'\n"},
    )
    return ApiNamespace(folder, {"ONLY_B": "1"}, [])


def what_the_code_sees() -> dict[str, object]:
    """What a predictor would see of the process: run inside a namespace."""
    import helpers
    import plain.part
    import shapes.circle

    return {
        "helpers": helpers.who(), "shapes": shapes.KIND, "circle": shapes.circle.AREA, "plain": plain.part.NAME,
        "ONLY_A": os.environ.get("ONLY_A"), "ONLY_B": os.environ.get("ONLY_B"), "cwd": os.getcwd(),
    }


def test_two_apis_in_turn_each_see_only_their_own_variables_modules_and_folder(tmp_path: Path) -> None:
    a, b = api_a(tmp_path), api_b(tmp_path)

    seen = []
    for namespace in (a, b, a):
        with namespace.active():
            seen.append(what_the_code_sees())

    assert seen[0] == {"helpers": "a", "shapes": "a-shapes", "circle": "a-circle", "plain": "a-plain",
                       "ONLY_A": "1", "ONLY_B": None, "cwd": str(a.project_dir)}
    assert seen[1] == {"helpers": "b", "shapes": "b-shapes", "circle": "b-circle", "plain": "b-plain",
                       "ONLY_A": None, "ONLY_B": "1", "cwd": str(b.project_dir)}
    assert seen[2] == seen[0]
    assert "ONLY_A" not in os.environ and "ONLY_B" not in os.environ


def test_an_apis_modules_are_kept_between_its_calls_and_imported_once(tmp_path: Path) -> None:
    a, b = api_a(tmp_path), api_b(tmp_path)
    with a.active():
        import helpers

        helpers.CALLS.append("first")
        first = helpers
    with b.active():
        import helpers

        assert helpers.CALLS == []
    with a.active():
        import helpers

        assert helpers is first and helpers.CALLS == ["first"]

    assert a.module_names() == ["helpers"]
    assert sys.modules.get("helpers") is None


def test_modules_imported_inside_are_found_even_when_the_code_empties_sys_modules_of_its_mark(tmp_path: Path) -> None:
    a = api_a(tmp_path)
    with a.active():
        for name in [n for n in sys.modules if n.startswith("_sluice_")]:  # code that prunes sys.modules
            del sys.modules[name]
        import helpers  # noqa: F401
        import shapes.circle  # noqa: F401

    assert a.module_names() == ["helpers", "shapes", "shapes.circle"]
    assert "helpers" not in sys.modules and not [n for n in sys.modules if n.startswith("_sluice_")]


def test_nothing_of_the_namespace_is_left_in_sys_modules_after_it(tmp_path: Path) -> None:
    a, b = api_a(tmp_path), api_b(tmp_path)
    before = set(sys.modules)
    with a.active():
        import helpers  # noqa: F401
        with b.active():
            import plain.part  # noqa: F401

    assert set(sys.modules) - before == set()


def test_the_import_path_puts_the_apis_folders_first_and_no_other_apis(tmp_path: Path) -> None:
    lib = project(tmp_path / "a" / "lib", **{"extra.py": "X = 1\n"})
    a = ApiNamespace(tmp_path / "a", {}, [lib])
    b = api_b(tmp_path)
    before = list(sys.path)

    with a.active():
        inside_a = list(sys.path)
    with b.active():
        inside_b = list(sys.path)

    assert inside_a == [str(lib.resolve()), str(a.project_dir), *before]
    assert inside_b == [str(b.project_dir), *before]
    assert sys.path == before


def test_the_process_environment_is_seen_inside_and_restored_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLUICE_TEST_PROCESS", "process")
    monkeypatch.setenv("SHARED_NAME", "process")
    a = ApiNamespace(project(tmp_path / "a"), {"SHARED_NAME": "api", "ONLY_A": "1"})
    before = dict(os.environ)

    with a.active():
        inside = dict(os.environ)

    assert inside == {**before, "SHARED_NAME": "api", "ONLY_A": "1"}
    assert dict(os.environ) == before


def test_variables_the_process_sets_between_calls_are_seen_on_the_next_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = api_a(tmp_path)
    with a.active():
        pass
    monkeypatch.setenv("SLUICE_TEST_LATER", "later")

    with a.active():
        assert os.environ["SLUICE_TEST_LATER"] == "later"


def test_what_the_code_changes_stays_with_its_api_and_not_the_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLUICE_TEST_DROPPED", "process")
    a, b = api_a(tmp_path), api_b(tmp_path)
    vendored = project(tmp_path / "a" / "vendored", **{"vendored_lib.py": "V = 'vendored'\n"})
    with a.active():
        os.environ["SET_BY_A"] = "yes"
        del os.environ["SLUICE_TEST_DROPPED"]
        sys.path.append(str(vendored))
    with b.active():
        b_sees = (os.environ.get("SET_BY_A"), os.environ.get("SLUICE_TEST_DROPPED"), str(vendored) in sys.path)
    outside = (os.environ.get("SET_BY_A"), os.environ.get("SLUICE_TEST_DROPPED"), str(vendored) in sys.path)

    with a.active():
        import vendored_lib

        assert (os.environ.get("SET_BY_A"), os.environ.get("SLUICE_TEST_DROPPED")) == ("yes", None)
        assert sys.path[-1] == str(vendored) and vendored_lib.V == "vendored"

    assert b_sees == (None, "process", False)
    assert outside == (None, "process", False)
    assert "vendored_lib" not in sys.modules


def test_everything_is_restored_when_the_code_raises(tmp_path: Path) -> None:
    a = api_a(tmp_path)
    env, path, cwd = dict(os.environ), list(sys.path), os.getcwd()

    def code_that_raises() -> None:
        with a.active():
            import helpers  # noqa: F401

            _ = 1 / 0

    with pytest.raises(ZeroDivisionError):
        code_that_raises()

    assert (dict(os.environ), sys.path, os.getcwd()) == (env, path, cwd)
    assert "helpers" not in sys.modules
    assert active_namespace() is None


def test_entering_again_while_active_keeps_it_in_place_until_the_outer_block_ends(tmp_path: Path) -> None:
    a = api_a(tmp_path)
    with a.active():
        import helpers

        with a.active():
            assert helpers.who() == "a"
        assert a.is_active and os.environ["ONLY_A"] == "1"
        import helpers as again

        assert again is helpers
    assert not a.is_active and "ONLY_A" not in os.environ


def test_another_api_entered_inside_one_sets_it_aside_and_gives_it_back(tmp_path: Path) -> None:
    a, b = api_a(tmp_path), api_b(tmp_path)
    with a.active():
        import helpers as a_helpers

        with b.active():
            inner = what_the_code_sees()
        import helpers

        assert helpers is a_helpers
        assert (os.environ.get("ONLY_A"), os.environ.get("ONLY_B"), os.getcwd()) == ("1", None, str(a.project_dir))

    assert (inner["helpers"], inner["ONLY_A"], inner["ONLY_B"]) == ("b", None, "1")


def test_a_library_first_imported_by_api_code_stays_shared(tmp_path: Path) -> None:
    sys.modules.pop("colorsys", None)
    a = api_a(tmp_path)

    with a.active():
        import colorsys

    assert sys.modules["colorsys"] is colorsys
    assert a.module_names() == []


def test_a_redeployed_folder_gets_its_new_code(tmp_path: Path) -> None:
    old = ApiNamespace(project(tmp_path / "bundle-1", **{"helpers.py": "def who():\n    return 'old'\n"}), {})
    new = ApiNamespace(project(tmp_path / "bundle-2", **{"helpers.py": "def who():\n    return 'new'\n"}), {})
    with old.active():
        import helpers

        assert helpers.who() == "old"

    with new.active():
        import helpers

        assert helpers.who() == "new"


def test_a_closed_namespace_lets_go_of_its_modules_and_cannot_be_entered(tmp_path: Path) -> None:
    a = api_a(tmp_path)
    with a.active():
        import helpers  # noqa: F401
    assert a.module_names() == ["helpers"]

    a.close()

    assert a.module_names() == []
    with pytest.raises(SluiceError, match="closed"), a.active():
        pass


def test_closing_an_active_namespace_is_refused(tmp_path: Path) -> None:
    a = api_a(tmp_path)
    with a.active(), pytest.raises(SluiceError, match="while it is active"):
        a.close()


# An installed namespace, for every thread of a fresh interpreter: tests/integration/test_namespace_installed.py.


def test_installing_while_another_namespace_is_active_is_refused(tmp_path: Path) -> None:
    a, b = api_a(tmp_path), api_b(tmp_path)
    with a.active(), pytest.raises(SluiceError, match="cannot install"):
        b.install()
