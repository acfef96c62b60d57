"""``ctrkit predict``: click probabilities of raw rows (the training data's format) with a checkpoint."""

from __future__ import annotations

import argparse
import csv
import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from ctrkit.data.pipeline.feature_pipeline import FeaturePipeline
from ctrkit.data.storage.store import check_replaceable
from ctrkit.errors import JobError
from ctrkit.io import atomic_file, make_dir
from ctrkit.jobs.scoring import predict_store
from ctrkit.serving.predictor import Predictor

log = logging.getLogger(__name__)
__all__ = ["predict_file", "predict_store", "run_predict"]


def predict_file(model: torch.nn.Module, pipeline: FeaturePipeline, path: str | Path,
                 batch_size: int = 8192) -> Iterator[np.ndarray]:
    """Click probabilities of the raw rows of ``path`` (the format the pipeline was fitted on), in input
    order, one array per chunk of about ``batch_size`` rows; a malformed row is an error naming its line."""
    for _, scores in Predictor(model, pipeline, batch_size=batch_size).predict_file(path):
        yield scores


def run_predict(args: argparse.Namespace) -> int:
    """``ctrkit predict``: one ``line,score`` row per input row, the line number being the row's line in the
    input (CSV: the header is line 1; Parquet: the row number), written only once every row is scored."""
    from ctrkit.data.sources.raw_rows import ReadStats

    out, src = Path(args.out), Path(args.input)
    if src.exists() and out.exists() and out.resolve() == src.resolve() and not args.overwrite:
        raise JobError(f"--out {out} is the --input file; write the scores elsewhere (or pass --overwrite)")
    if out.is_dir():
        raise JobError(f"--out {out} is a directory; give a file path")
    check_replaceable(out, args.overwrite, option="--out")
    make_dir(out.parent, option="--out")
    predictor = Predictor.from_checkpoint(args.checkpoint, batch_size=args.batch_size)
    stats, n = ReadStats(), 0
    with atomic_file(out, option="--out") as tmp, open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["line", "score"])
        for lines, scores in predictor.predict_file(src, stats):
            w.writerows(zip(lines.tolist(), (f"{s:.6f}" for s in scores)))
            n += len(scores)
    if stats.blank_lines:
        log.warning("%s: skipped %d blank lines (not rows); every score keeps its input line number",
                    src, stats.blank_lines)
    log.info("wrote %d scores to %s", n, out)
    return 0
