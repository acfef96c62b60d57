"""TensorBoard logging of a run (``run.log: [tensorboard]``): the scalars of metrics.jsonl, as event files.

:class:`TensorBoardLogger` is a trainer :class:`~ctrkit.training.trainer.Callback` fed every record the trainer
writes to metrics.jsonl (``on_record``) and nothing else, so the two always agree::

    {"kind": "train", "step": 50, "epoch": 0, "loss": 0.47, "bce": 0.46}   -> train/loss, train/bce at step 50
    {"kind": "eval", "step": 120, "epoch": 0, "auc": 0.78, "logloss": 0.45,
     "best": 0.78, "stopped_early": false, "train_seconds": 3.2, "samples": 30720}
                                                                          -> valid/auc, valid/logloss at step 120

A train record gives ``train/<key>`` for each of its numbers but step / epoch; an eval record gives
``valid/<metric>`` for each metric (its bookkeeping fields, :data:`EVAL_BOOKKEEPING`, are not plotted).
The global step is the record's optimizer step. Events are flushed at every evaluation and the writer is
closed when training ends (an early-stopped eval record, or :meth:`TensorBoardLogger.close`, which the
train job calls whatever way training ended).

A resumed run writes into the same directory: the writer is opened at the first record of this process with
``purge_step`` = that record's step, so TensorBoard hides the events a killed attempt wrote for the steps the
resumed run trains again (as metrics.jsonl drops their records).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from ctrkit.errors import ConfigError
from ctrkit.training.callbacks import Callback

log = logging.getLogger(__name__)

TRAIN_BOOKKEEPING = ("kind", "step", "epoch")
EVAL_BOOKKEEPING = ("kind", "step", "epoch", "best", "stopped_early", "train_seconds", "samples")


def _summary_writer_class() -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as e:  # torch imports the tensorboard package lazily, here
        raise ConfigError(f"run.log=[tensorboard] needs the tensorboard package ({e}); "
                          "pip install 'ctrkit[tensorboard]', or drop tensorboard from run.log") from None
    return SummaryWriter


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def scalars_of(record: dict[str, Any]) -> dict[str, float]:
    """The TensorBoard scalars of one metrics.jsonl record: {"train/loss": ..., } or {"valid/auc": ..., }."""
    kind = record.get("kind")
    if kind == "train":
        prefix, skip = "train", TRAIN_BOOKKEEPING
    elif kind == "eval":
        prefix, skip = "valid", EVAL_BOOKKEEPING
    else:
        return {}
    return {f"{prefix}/{k}": float(v) for k, v in record.items() if k not in skip and _is_number(v)}


class TensorBoardLogger(Callback):
    """Writes the scalars of every metrics.jsonl record under ``log_dir`` (see the module docstring)."""

    def __init__(self, log_dir: str | Path) -> None:
        self.log_dir = Path(log_dir)
        self._writer_class = _summary_writer_class()  # a missing package fails before training starts
        self._writer: Any = None
        self._opened = False  # the first writer of this process purges the events of steps trained again

    def on_record(self, trainer: Any, record: dict[str, Any]) -> None:
        scalars = scalars_of(record)
        step = record.get("step")
        if not scalars or not isinstance(step, int):
            return
        writer = self._open(step)
        for tag, value in scalars.items():
            writer.add_scalar(tag, value, global_step=step)
        if record["kind"] == "eval":
            writer.flush()
            if record.get("stopped_early"):  # the last record of an early-stopped run
                self.close()

    def _open(self, step: int) -> Any:
        if self._writer is None:
            purge = None if self._opened else step
            try:
                self.log_dir.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise ConfigError(f"run.log=[tensorboard]: cannot create {self.log_dir}: {e.strerror or e}") from None
            self._writer = self._writer_class(log_dir=str(self.log_dir), purge_step=purge)
            self._opened = True
        return self._writer

    def close(self) -> None:
        """Flush and close the event file (again: nothing); a later record opens a new one."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
