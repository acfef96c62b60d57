"""Training: config (YAML -> dataclasses), optimizers by parameter group, tasks, the Trainer and its checkpoint
writer (the checkpoint format itself is :mod:`ctrkit.checkpoint`, one floor down).

Imports are lazy so ``import ctrkit.training.config`` (used by the CLI) does not pull in the trainer.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "Config": "config", "DataConfig": "config", "ModelConfig": "config", "TrainConfig": "config",
    "RunConfig": "config", "EarlyStoppingConfig": "config", "load_config": "config",
    "config_to_dict": "config", "config_from_dict": "config", "save_config": "config",
    "OptimizerSet": "optim", "RowWiseAdagrad": "optim", "build_optimizers": "optim",
    "CheckpointWriter": "writer",
    "Trainer": "trainer", "TrainingError": "trainer", "Callback": "callbacks",
    "Task": "tasks", "CTRTask": "tasks",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f"ctrkit.training.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'ctrkit.training' has no attribute {name!r}")
