"""Checkpoints the export tests share: a tiny model of the contract test, its weights moved off their start."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from conftest import planted_data

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))  # contract_cases.py
from contract_cases import VARIANTS, build, schema_for

from ctrkit.checkpoint import Checkpoint
from ctrkit.models.base import CTRModel
from ctrkit.schema import Schema


def tiny_checkpoint(name: str, path: Path) -> tuple[Path, CTRModel, Schema, dict]:
    """Model ``name`` (the contract test's first variant) with its weights moved off their (partly zero) start, so
    scores differ from row to row, saved as a checkpoint; returns (path, model in eval mode, schema, rows)."""
    schema = schema_for(name)
    data = planted_data(120, seed=7, schema=schema)
    params = VARIANTS.get(name, [{}])[0]
    model = build(name, params, data=data)
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.2)
    model.eval()
    return Checkpoint.of(model, model_params=params, schema=schema).save(path), model, schema, data
