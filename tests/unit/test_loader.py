"""Loading a user's predictor file and calling its methods with only what they declare."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from foundation.errors import PredictorError
from predictors_runtime.loader import call_with_declared, load_predictor_class

AVAILABLE = {"payload": [1, 2], "batch_id": "b-1", "job_status": {"status": "status_running"}}


def write(folder: Path, source: str, name: str = "predictor.py") -> Path:
    (folder / name).write_text(textwrap.dedent(source))
    return folder


# -- calling with declared arguments -----------------------------------------------------------
def test_a_method_gets_only_the_arguments_it_declares() -> None:
    def predict(payload: Any) -> Any:
        return payload

    assert call_with_declared(predict, AVAILABLE) == [1, 2]


def test_declared_arguments_are_passed_by_name_in_any_order() -> None:
    def predict(batch_id: str, payload: Any) -> tuple[str, Any]:
        return batch_id, payload

    assert call_with_declared(predict, AVAILABLE) == ("b-1", [1, 2])


def test_a_method_declaring_nothing_is_called_without_arguments() -> None:
    def on_job_complete() -> str:
        return "done"

    assert call_with_declared(on_job_complete, AVAILABLE) == "done"


def test_a_method_with_kwargs_gets_everything_sluice_provides() -> None:
    def predict(**kwargs: Any) -> dict[str, Any]:
        return kwargs

    assert call_with_declared(predict, AVAILABLE) == AVAILABLE


def test_an_optional_argument_sluice_does_not_provide_keeps_its_default() -> None:
    def predict(payload: Any, scale: int = 3) -> Any:
        return [x * scale for x in payload]

    assert call_with_declared(predict, AVAILABLE) == [3, 6]


def test_a_required_argument_sluice_does_not_provide_is_a_predictor_error_naming_it() -> None:
    class PythonPredictor:
        def predict(self, payload: Any, query_params: dict) -> Any:
            return payload

    with pytest.raises(PredictorError) as info:
        call_with_declared(PythonPredictor().predict, AVAILABLE)

    message = info.value.message
    assert "PythonPredictor.predict requires an argument 'query_params'" in message
    assert "Sluice provides batch_id, job_status, payload" in message


def test_a_bound_method_does_not_declare_self() -> None:
    class Handler:
        def handle_batch(self, payload: Any) -> int:
            return len(payload)

    assert call_with_declared(Handler().handle_batch, AVAILABLE) == 2


def test_a_class_is_constructed_with_the_arguments_its_init_declares() -> None:
    class Handler:
        def __init__(self, config: dict) -> None:
            self.config = config

    handler = call_with_declared(Handler, {"config": {"k": 1}, "job_spec": {"job_id": "x"}})

    assert handler.config == {"k": 1}


def test_a_class_requiring_an_undeclared_client_is_a_predictor_error() -> None:
    class PythonPredictor:
        def __init__(self, config: dict, python_client: Any) -> None:
            pass

    with pytest.raises(PredictorError, match="requires an argument 'python_client'"):
        call_with_declared(PythonPredictor, {"config": {}, "job_spec": {}})


# -- loading the predictor class ---------------------------------------------------------------
def test_a_handler_class_is_found(tmp_path: Path) -> None:
    write(tmp_path, """
        class Handler:
            def handle_batch(self, payload):
                return payload
    """)

    cls = load_predictor_class(tmp_path, "predictor.py")

    assert cls.__name__ == "Handler"


def test_a_python_predictor_class_is_found(tmp_path: Path) -> None:
    write(tmp_path, """
        class PythonPredictor:
            def predict(self, payload):
                return payload
    """)

    assert load_predictor_class(tmp_path, "predictor.py").__name__ == "PythonPredictor"


def test_handler_is_preferred_when_a_file_defines_both_spellings(tmp_path: Path) -> None:
    write(tmp_path, """
        class PythonPredictor:
            pass

        class Handler:
            pass
    """)

    assert load_predictor_class(tmp_path, "predictor.py").__name__ == "Handler"


def test_a_name_that_is_not_a_class_is_passed_over(tmp_path: Path) -> None:
    write(tmp_path, """
        Handler = "not a class"

        class PythonPredictor:
            pass
    """)

    assert load_predictor_class(tmp_path, "predictor.py").__name__ == "PythonPredictor"


def test_a_predictor_in_a_subfolder_is_found(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    write(tmp_path / "src", "class Handler:\n    pass\n")

    assert load_predictor_class(tmp_path, "src/predictor.py").__name__ == "Handler"


def test_global_scope_code_runs_when_the_predictor_is_loaded(tmp_path: Path) -> None:
    write(tmp_path, """
        from pathlib import Path

        LABELS = Path(__file__).with_name("labels.txt").read_text().split()
        Path(__file__).with_name("imported.txt").write_text("yes")

        class Handler:
            labels = LABELS
    """)
    (tmp_path / "labels.txt").write_text("setosa versicolor virginica")

    cls = load_predictor_class(tmp_path, "predictor.py")

    assert cls.labels == ["setosa", "versicolor", "virginica"]
    assert (tmp_path / "imported.txt").read_text() == "yes"


def test_loading_twice_with_the_same_tag_imports_once(tmp_path: Path) -> None:
    write(tmp_path, """
        from pathlib import Path

        marker = Path(__file__).with_name("imports.txt")
        marker.write_text(marker.read_text() + "x" if marker.exists() else "x")

        class Handler:
            pass
    """)

    first = load_predictor_class(tmp_path, "predictor.py", module_tag="v1")
    second = load_predictor_class(tmp_path, "predictor.py", module_tag="v1")

    assert first is second
    assert (tmp_path / "imports.txt").read_text() == "x"


def test_two_versions_of_one_api_do_not_share_module_state(tmp_path: Path) -> None:
    write(tmp_path, """
        class Handler:
            seen = []
    """)

    v1 = load_predictor_class(tmp_path, "predictor.py", module_tag="v1")
    v2 = load_predictor_class(tmp_path, "predictor.py", module_tag="v2")
    v1.seen.append("batch")

    assert v1 is not v2
    assert v2.seen == []


def test_an_import_error_is_reported_with_the_users_traceback(tmp_path: Path) -> None:
    write(tmp_path, """
        import os

        def load_model():
            raise FileNotFoundError("model.pkl is missing")

        MODEL = load_model()

        class Handler:
            pass
    """)

    with pytest.raises(PredictorError) as info:
        load_predictor_class(tmp_path, "predictor.py")

    message = info.value.message
    assert message.startswith("importing predictor.py failed: ")
    assert "Traceback (most recent call last)" in message
    assert "in load_model" in message
    assert "FileNotFoundError: model.pkl is missing" in message


def test_a_missing_dependency_is_reported_by_name(tmp_path: Path) -> None:
    write(tmp_path, "import a_package_nobody_installed\n\nclass Handler:\n    pass\n")

    with pytest.raises(PredictorError, match="No module named 'a_package_nobody_installed'"):
        load_predictor_class(tmp_path, "predictor.py")


def test_a_syntax_error_is_reported_as_a_predictor_error(tmp_path: Path) -> None:
    write(tmp_path, "class Handler:\n    def predict(self, payload)\n        return payload\n")

    with pytest.raises(PredictorError, match="SyntaxError"):
        load_predictor_class(tmp_path, "predictor.py")


def test_a_predictor_that_failed_to_import_loads_once_fixed(tmp_path: Path) -> None:
    write(tmp_path, "raise RuntimeError('not yet')\n")
    with pytest.raises(PredictorError, match="RuntimeError: not yet"):
        load_predictor_class(tmp_path, "predictor.py", module_tag="v1")

    write(tmp_path, "class Handler:\n    pass\n")

    assert load_predictor_class(tmp_path, "predictor.py", module_tag="v1").__name__ == "Handler"


def test_a_file_without_a_predictor_class_names_the_classes_looked_for(tmp_path: Path) -> None:
    write(tmp_path, """
        class Predictor:
            def predict(self, payload):
                return payload
    """)

    with pytest.raises(PredictorError) as info:
        load_predictor_class(tmp_path, "predictor.py")

    assert info.value.message == (
        "predictor.py defines none of the classes Handler, PythonPredictor, TensorFlowPredictor, ONNXPredictor"
    )


def test_a_missing_predictor_file_is_a_predictor_error(tmp_path: Path) -> None:
    with pytest.raises(PredictorError, match="predictor file missing.py not found in the project folder"):
        load_predictor_class(tmp_path, "missing.py")
