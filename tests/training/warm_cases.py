"""What the warm-start tests share (test_warm_start.py, test_warm_start_expiry.py): one training step with fixed
dropout masks, and a model trained a few steps and saved as the checkpoint to warm-start from."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import make_batch

from ctrkit.checkpoint import Checkpoint
from ctrkit.models.registry import create_model
from ctrkit.nn.embedding_torchrec import torchrec_available
from ctrkit.schema import Schema
from ctrkit.training.config import TrainConfig
from ctrkit.training.optim import build_optimizers
from ctrkit.training.tasks import CTRTask

TRCH = pytest.mark.skipif(not torchrec_available(), reason="torchrec is not installed")


def step(model, opt, batch) -> None:
    model.train()
    opt.zero_grad()
    torch.manual_seed(11)  # the same dropout masks on both sides
    CTRTask().bind(model).loss(model, batch)[0].backward()
    opt.step()


def trained_checkpoint(name: str, schema: Schema, params: dict[str, Any], cfg: TrainConfig,
                       data: dict[str, np.ndarray], path: Path,
                       prepare: Callable[[Any], None] | None = None) -> tuple[Any, Any, Checkpoint]:
    """Model ``name`` (seed 0; ``prepare`` applied before its optimizers are built) trained 3 steps of 64 rows,
    saved with its optimizer states to ``path`` -> (model, optimizers, the checkpoint loaded back)."""
    torch.manual_seed(0)
    model = create_model(name, schema, **params)
    if prepare is not None:
        prepare(model)
    opt = build_optimizers(model, cfg)
    for s in range(3):
        step(model, opt, make_batch(data, slice(64 * s, 64 * (s + 1)), schema))
    Checkpoint.of(model, schema=schema, model_params=params, optimizer=copy.deepcopy(opt.state_dict())).save(path)
    return model, opt, Checkpoint.load(path)
