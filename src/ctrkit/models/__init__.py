"""Models, one small file each, registered by name with ``@register_model``.

Importing this package imports every module in it, so every built-in model is registered.
"""

import importlib
import pkgutil

from ctrkit.models.registry import create_model, list_models, model_params, register_model

for _m in pkgutil.iter_modules(__path__):
    if _m.name != "registry" and not _m.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_m.name}")

__all__ = ["create_model", "list_models", "model_params", "register_model"]
