"""Model folders in storage, their versions, and the per-process manager that loads, caches and reloads them."""

from .cache import LRU
from .layout import DEFAULT_MODEL_NAME, ModelVersion, discover, model_sources
from .manager import LoadedModel, ModelManager

__all__ = ["DEFAULT_MODEL_NAME", "LRU", "LoadedModel", "ModelManager", "ModelVersion", "discover", "model_sources"]
