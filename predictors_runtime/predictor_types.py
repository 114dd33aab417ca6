"""The predictor types Sluice runs (`predictor.type` in cortex.yaml), in one registry.

Config validation, the predictor builder, the model clients and the models layout all derive
what they accept from `PREDICTOR_TYPES`, so a new type is added here and in its client module,
never in four lists that can drift apart. Importing this module imports no framework.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from foundation.errors import ConfigError

# The names as a type, for the config schema; `tests/unit/test_predictor_types.py` checks that it
# lists exactly the registry's keys.
PredictorTypeName = Literal["python", "tensorflow", "onnx"]


@dataclass(frozen=True)
class PredictorType:
    """What Sluice knows of one predictor type."""

    name: str
    # The constructor argument through which the predictor receives its model client.
    client_argument: str
    # Served from `predictor.models` (ONNX, TensorFlow); a python predictor may use them or not.
    needs_models: bool
    # `models.signature_key` means something to it (TensorFlow's SavedModel signatures).
    takes_signature_key: bool
    # What one model version's folder must hold, in words (for errors).
    model_files: str


PREDICTOR_TYPES: dict[str, PredictorType] = {
    "python": PredictorType("python", "python_client", needs_models=False, takes_signature_key=False,
                            model_files="any files its load_model reads"),
    "onnx": PredictorType("onnx", "onnx_client", needs_models=True, takes_signature_key=False,
                          model_files="exactly one *.onnx file"),
    "tensorflow": PredictorType("tensorflow", "tensorflow_client", needs_models=True, takes_signature_key=True,
                                model_files="saved_model.pb and variables/"),
}
DEFAULT_TYPE = "python"


def predictor_type(name: str) -> PredictorType:
    """The registered type called `name`; `ConfigError` naming the known ones otherwise."""
    try:
        return PREDICTOR_TYPES[name]
    except KeyError:
        raise ConfigError(f"predictor type {name!r} is not one of {', '.join(PREDICTOR_TYPES)}") from None
