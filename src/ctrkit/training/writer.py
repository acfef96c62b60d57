"""How a training run's checkpoints are written and read back for resume: one :class:`CheckpointWriter`.

The :class:`~ctrkit.training.trainer.Trainer` hands the writer what changes during a run (weights, optimizer state,
:class:`~ctrkit.checkpoint.TrainerState`); the writer adds what does not (model name and parameters, schema,
config, feature pipeline, vocabularies, extras) and writes ``<run_dir>/<name>`` as a
:class:`~ctrkit.checkpoint.Checkpoint`. A distributed trainer replaces the writer (e.g. one that writes on rank 0
only, or gathers sharded tables first) without touching the loop.

The RNG state of a checkpoint (python, numpy, torch and CUDA generators) is captured and restored here too.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ctrkit.checkpoint import Checkpoint, TrainerState
from ctrkit.errors import TrainingError
from ctrkit.schema import Schema


def rng_state() -> dict[str, Any]:
    """Python, numpy and torch global RNG states as tensors / numbers."""
    py_version, py_state, py_gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    out: dict[str, Any] = {
        "python": {"version": py_version, "state": torch.tensor(py_state, dtype=torch.int64),
                   "gauss_next": py_gauss},
        "numpy": {"name": np_name, "keys": torch.from_numpy(np_keys.astype(np.int64)), "pos": int(np_pos),
                  "has_gauss": int(np_has_gauss), "cached_gaussian": float(np_gauss)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured."""
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"].tolist()), py["gauss_next"]))
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class CheckpointWriter:
    """Writes the checkpoints of one run into ``run_dir`` (None: writes nothing).

    ``model_name`` / ``model_params`` rebuild the model from the registry; ``schema`` / ``pipeline``
    (``data.pipeline.persist.to_payload``) / ``vocab`` (a dict of vocabulary files, or a store's vocab directory) make
    the checkpoint self-contained for evaluate, predict and the server; ``config`` is the run config as plain
    data; ``extra`` free plain data (e.g. the retrieval catalogue)."""

    def __init__(self, run_dir: str | Path | None, *, model_name: str | None = None,
                 model_params: dict[str, Any] | None = None, schema: Schema | None = None,
                 config: dict[str, Any] | None = None, pipeline: dict[str, Any] | None = None,
                 vocab: dict[str, Any] | str | Path | None = None, extra: dict[str, Any] | None = None) -> None:
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.model_name, self.model_params = model_name, dict(model_params or {})
        self.schema, self.config, self.pipeline, self.extra = schema, config, pipeline, dict(extra or {})
        by_path = isinstance(vocab, (str, Path))
        self.vocab_files = None if by_path else vocab
        self.vocab_path = str(vocab) if by_path else None

    def checkpoint(self, model: nn.Module, optimizer: Any, state: TrainerState | None) -> Checkpoint:
        """The checkpoint of ``model``'s current weights, ``optimizer`` (its ``state_dict()``) and ``state``."""
        return Checkpoint.of(
            model, model_name=self.model_name, model_params=self.model_params, schema=self.schema,
            config=self.config, pipeline=self.pipeline, extra=self.extra, trainer=state,
            optimizer=optimizer.state_dict() if optimizer is not None else None,
            vocab_files=self.vocab_files, vocab_path=self.vocab_path,
        )

    def write_to(self, path: str | Path, model: nn.Module, optimizer: Any, state: TrainerState | None) -> Path:
        """Write the checkpoint to ``path`` (atomic); returns it."""
        return self.checkpoint(model, optimizer, state).save(path)

    def write(self, name: str, model: nn.Module, optimizer: Any, state: TrainerState | None) -> Path | None:
        """Write ``<run_dir>/<name>`` (``best.pt``, ``last.pt``); nothing without a run directory."""
        if self.run_dir is None:
            return None
        return self.write_to(self.run_dir / name, model, optimizer, state)

    def read(self, path: str | Path, map_location: str | torch.device = "cpu") -> Checkpoint:
        """The checkpoint at ``path``, for resume."""
        return Checkpoint.load(path, map_location=map_location)


def restore_training(writer: CheckpointWriter, path: Path, model: nn.Module, optimizer: Any, average: Any,
                     device: torch.device) -> TrainerState:
    """Load the training checkpoint at ``path`` (through ``writer``) into ``model``, ``optimizer`` and the weight
    ``average`` (None without train.ema_decay) and restore its RNG state; returns its TrainerState. A checkpoint
    without trainer state, of another model or of the other averaging choice is a TrainingError saying so."""
    ckpt = writer.read(path, map_location=device)
    state = ckpt.trainer
    if state is None or ckpt.optimizer is None:
        raise TrainingError(f"cannot resume from {path}: it holds no trainer/optimizer state "
                            "(an exported model, not a training checkpoint)")
    try:
        model.load_state_dict(ckpt.weights)
        optimizer.load_state_dict(ckpt.optimizer)
    except (RuntimeError, ValueError, KeyError) as e:
        raise TrainingError(f"cannot resume from {path}: it does not match this model: {e}") from e
    averaging = state.weight_average
    if (averaging is None) != (average is None):
        raise TrainingError(
            f"cannot resume from {path}: it was trained "
            + (f"with train.ema_decay={averaging['decay']}; resume with that value" if averaging is not None
               else "without weight averaging; resume with train.ema_decay=null (or start a new run)"))
    if average is not None:
        average.load_state_dict(averaging)  # the model gets its trained weights back
    set_rng_state(state.rng)
    return state
