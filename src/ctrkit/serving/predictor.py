"""Score raw rows with a checkpoint: ``Predictor.from_checkpoint(path).predict(rows)``.

A :class:`Predictor` holds what a checkpoint carries for scoring: the model (eval mode) and the training data's
:class:`~ctrkit.data.pipeline.feature_pipeline.FeaturePipeline` (vocabularies, dense statistics, the multi-hot stage). Raw rows
(a list of dicts, a pandas DataFrame, a pyarrow Table or a dict of columns, holding raw values: numbers,
strings, Criteo's hex keys, lists or delimited strings for multi-valued and sequence features) go through that
pipeline to a :class:`~ctrkit.batch.Batch` and the model, in chunks of ``batch_size`` rows, giving click
probabilities in input order. These are the numbers ``ctrkit evaluate`` scores for the same rows after
preprocessing (tested), and ``ctrkit predict`` and ``ctrkit serve`` are built on this class.

Two ways to meet a malformed row: :meth:`Predictor.predict` refuses the chunk with an error naming the row and
the field; :meth:`Predictor.score` scores the well-formed rows and returns the others with their reasons (the
valid rows' scores do not depend on the invalid rows beside them: every row is encoded on its own).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from ctrkit.data.pipeline.encode import Raw
from ctrkit.data.pipeline.feature_pipeline import FeaturePipeline
from ctrkit.data.pipeline.rows import BadRows
from ctrkit.errors import DataError, JobError, Problem
from ctrkit.models.base import TwoTowerModel
from ctrkit.models.scoring import probabilities, scoring

log = logging.getLogger(__name__)


@dataclass
class Scored:
    """Result of :meth:`Predictor.score`: ``scores`` [n] (NaN where the row was malformed), and the problems of
    the malformed rows (row: the 1-based number, or the line when lines were given; field; reason), in row order."""

    scores: np.ndarray
    bad: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> np.ndarray:
        return ~np.isnan(self.scores)


class Predictor:
    """A model and its feature pipeline, ready to score raw rows (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, pipeline: FeaturePipeline, *, device: str | torch.device = "cpu",
                 batch_size: int = 8192, checkpoint: str | Path | None = None,
                 info: dict[str, Any] | None = None) -> None:
        if isinstance(model, TwoTowerModel):
            raise JobError("a retrieval model ranks items for a user; score it with `ctrkit recall`, not predict")
        if batch_size < 1:
            raise JobError(f"batch_size must be >= 1, got {batch_size}")
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.pipeline = pipeline
        self.batch_size = int(batch_size)
        self.checkpoint = Path(checkpoint) if checkpoint is not None else None
        self.info = dict(info or {})

    @classmethod
    def from_checkpoint(cls, path: str | Path, *, device: str | torch.device = "cpu",
                        batch_size: int | None = None) -> Predictor:
        """The model and pipeline of the checkpoint at ``path`` (verified and read without unpickling code);
        ``batch_size`` defaults to the rows per batch the run evaluated with (``Checkpoint.scoring_batch_size``)."""
        from ctrkit.checkpoint import Checkpoint

        path = Path(path)
        ckpt = Checkpoint.load(path)
        progress = ckpt.progress
        info = {
            "checkpoint": path.name,  # the file's name only: /metadata shows no path of the serving machine
            "ctrkit_version": ckpt.ctrkit_version,
            "model": ckpt.model_name,
            "model_params": ckpt.model_params,
            "schema": ckpt.schema.to_dict() if ckpt.schema is not None else None,
            "training": {"step": progress.step, "epoch": progress.epoch, "best_metric": progress.best_metric,
                         "best_step": progress.best_step, "last_eval": progress.last_eval or {}}
            if progress is not None else {"step": None, "epoch": None, "best_metric": None, "best_step": None,
                                          "last_eval": {}},
        }
        batch_size = ckpt.scoring_batch_size if batch_size is None else batch_size
        return cls(ckpt.build_model(), ckpt.feature_pipeline(), device=device, batch_size=batch_size,
                   checkpoint=path, info=info)

    # ---- what it reads -------------------------------------------------------------------------------
    @property
    def schema(self) -> Any:
        return self.pipeline.schema

    @property
    def input_columns(self) -> list[str]:
        """Raw columns every row must have (a label, weight or group column is optional)."""
        return self.pipeline.input_columns(optional=False)

    # ---- scoring -------------------------------------------------------------------------------------
    def predict(self, rows: Raw) -> np.ndarray:
        """Click probabilities [n] float32 of raw ``rows``, in order; a malformed row is a DataError naming it."""
        out = [self.score_columns(self.pipeline.transform(chunk, lines=lines, unit="row"))
               for chunk, lines in _chunks(rows, self.batch_size)]
        return np.concatenate(out) if out else np.zeros(0, np.float32)

    def score(self, rows: Raw, *, lines: np.ndarray | None = None) -> Scored:
        """Scores of the well-formed rows of ``rows`` (NaN for the others) and the reasons of the malformed
        ones; ``lines``: the number reported for each row (default 1..n)."""
        parts, bad_all = [], []
        for chunk, chunk_lines in _chunks(rows, self.batch_size, lines):
            bad = BadRows("rows", keep=len(chunk_lines))
            enc = self.pipeline.encode(chunk, lines=chunk_lines, bad=bad, unit="row")
            scores = np.full(len(chunk_lines), np.nan, np.float32)
            if len(enc):
                scores[enc.keep] = self.score_columns(self.pipeline.finalize(enc.parts()))
            parts.append(scores)
            bad_all += bad.problems
        return Scored(np.concatenate(parts) if parts else np.zeros(0, np.float32), bad_all)

    def score_validated(self, columns: dict[str, Any]) -> np.ndarray:
        """Click probabilities of rows whose feature columns passed the server's check against the pipeline's rules
        (:class:`~ctrkit.serving.validation.RowValidator`, in the arrays of
        :func:`~ctrkit.serving.validation.to_arrays`), in one chunk: encoded without checking a value again, to the
        ids and values :meth:`score` would give them."""
        return self.score_columns(self.pipeline.transform(columns, validated=True))

    def predict_file(self, path: str | Path, stats: Any = None) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(line numbers, click probabilities) of the raw rows of ``path`` (the format the pipeline was fitted on:
        Criteo TSV plain or gzip, CSV, Parquet; label column optional), in input order, about ``batch_size`` rows
        at a time. A malformed row is an error naming the file and its line; blank lines are counted in
        ``stats`` (:class:`~ctrkit.data.sources.raw_rows.ReadStats`), not scored."""
        from ctrkit.data.sources.raw_rows import iter_raw, transform_chunk

        for chunk in iter_raw(self.pipeline, path, self.batch_size, stats):
            yield chunk.lines, self.score_columns(transform_chunk(self.pipeline, path, chunk))

    def score_columns(self, columns: dict[str, Any]) -> np.ndarray:
        """Click probabilities of transformed columns (:meth:`FeaturePipeline.transform` output, or a store's)."""
        batch = self.pipeline.to_batch(columns)
        if self.device.type != "cpu":
            batch = batch.to(self.device)
        with scoring(self.model):
            return probabilities(self.model(batch)).cpu().numpy()

    def metadata(self) -> dict[str, Any]:
        """Model, schema, training metrics, the checkpoint's file name and checksum (``ctrkit serve``'s /metadata);
        no absolute path of this machine."""
        return {**self.info, "checkpoint_sha256": self.checkpoint_sha256, "input_columns": self.input_columns,
                "batch_size": self.batch_size, "device": str(self.device)}

    @cached_property
    def checkpoint_sha256(self) -> str | None:
        """sha256 of the checkpoint file, read when first asked for (not by scoring, which never needs it)."""
        from ctrkit.io import file_checksum

        return file_checksum(self.checkpoint, full=True) if self.checkpoint is not None else None


def _chunks(rows: Raw, size: int, lines: np.ndarray | None = None) -> Iterator[tuple[Raw, np.ndarray]]:
    """(chunk of at most ``size`` rows, their numbers) over list / DataFrame / pyarrow Table / dict of columns."""
    n = _num_rows(rows)
    lines = np.arange(1, n + 1) if lines is None else np.asarray(lines, np.int64)
    if len(lines) != n:
        raise DataError(f"{len(lines)} line numbers for {n} rows")
    for start in range(0, n, size):  # no rows: no chunk (a model may not take a batch of 0 rows)
        stop = min(start + size, n)
        yield _slice(rows, start, stop), lines[start:stop]


def _num_rows(rows: Raw) -> int:
    if isinstance(rows, (pa.Table, pa.RecordBatch)):
        return rows.num_rows
    if isinstance(rows, dict):
        first = next(iter(rows.values()), [])
        return len(first[1]) if isinstance(first, tuple) else len(first)
    if isinstance(rows, list) or type(rows).__module__.split(".")[0] == "pandas":
        if isinstance(rows, list) and not all(isinstance(r, dict) for r in rows):
            i = next(i for i, r in enumerate(rows) if not isinstance(r, dict))
            raise DataError(f"row {i + 1} is a {type(rows[i]).__name__}, not an object of field: value pairs")
        return len(rows)
    raise DataError(f"cannot read rows from a {type(rows).__name__}; give a list of dicts, a pandas DataFrame, "
                    "a pyarrow Table or a dict of columns")


def _slice(rows: Raw, start: int, stop: int) -> Raw:
    if isinstance(rows, (pa.Table, pa.RecordBatch)):
        return rows.slice(start, stop - start)
    if isinstance(rows, list):
        return rows[start:stop]
    if isinstance(rows, dict):
        if start == 0 and stop == _num_rows(rows):
            return rows
        raise DataError("a dict of columns is scored in one chunk; raise batch_size or pass a pyarrow Table")
    return rows.iloc[start:stop]
