"""Export a checkpoint's model for runtimes without ctrkit: TorchScript or ONNX (``ctrkit export``).

An export directory holds::

    model.pt | model.onnx    the scoring program (below)
    pipeline/                the checkpoint's FeaturePipeline (``FeaturePipeline.load``): raw rows -> the inputs
    export.json              format, model, the inputs and their meaning, the sparse key order, num_dense,
                             the checkpoint's sha256, the check the program passed, the sha256 of every
                             program file and the digest of export.json itself (read back:
                             :mod:`ctrkit.serving.exported`, which refuses an edited or escaping export)

The program takes plain tensors and returns click probabilities::

    dense   (B, Nd)  float32   dense features in schema order, as the pipeline writes them
    values  (nnz,)   int64     the ids of every sparse key, key-major (the KeyedJagged layout of
                               :mod:`ctrkit.batch`) over export.json's ``sparse_keys``, after the pipeline's
                               batch stage (multi-hot)
    lengths (F*B,)   int64     lengths[f*B + b] = the number of ids of key f in row b
    ->      (B,)     float32   sigmoid(logit)

How: :class:`ScoringModule` rebuilds the Batch from the three tensors and calls the model; ``torch.export``
captures it once with B and nnz symbolic, so one program serves every batch size and every bag and history
length (under export the jagged code of :mod:`ctrkit.batch` and :mod:`ctrkit.nn.embedding` has no host syncs
and no branches on the data). ONNX is that program converted by ``torch.onnx.export(dynamo=True)``; TorchScript
is the same program's graph of aten ops, scripted (:func:`~ctrkit.serving.export_formats.to_torchscript`), so both formats compute one graph
(for the CPU; torch >= 2.10 deprecates TorchScript, which libtorch and ``torch.jit.load`` still run).
Before anything is kept, the written file is read back and scored against the eager model on batches of other
sizes and lengths than the export example (empty bags and histories included); more than 1e-5 apart is an
:class:`~ctrkit.errors.ExportError`, as is a model whose forward leaves torch (``exportable = False``: GBDT+LR).

Use::

    export_checkpoint("runs/dlrm/best.pt", "exports/dlrm", "onnx")
    model = load_exported("exports/dlrm")
    probs = model(dense, values, lengths)             # numpy (B,); or model.score(batch)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ctrkit.batch import Batch, KeyedJagged
from ctrkit.checkpoint import Checkpoint
from ctrkit.data.pipeline.feature_pipeline import FeaturePipeline
from ctrkit.data.pipeline.multihot import MultiHot
from ctrkit.data.pipeline.persist import save_pipeline
from ctrkit.errors import ConfigError, ExportError
from ctrkit.io import file_checksum, is_empty_dir, path_exists
from ctrkit.models.base import TwoTowerModel
from ctrkit.models.registry import get_model_class
from ctrkit.models.scoring import probabilities, scoring
from ctrkit.schema import Schema, SequenceFeature, SparseFeature
from ctrkit.serving.export_formats import OUTPUT_NAME, Runner, program_runner, to_torchscript, write_program
from ctrkit.serving.exported import (
    FORMATS,
    MARKER,
    META_FILE,
    MODEL_FILES,
    PIPELINE_DIR,
    VERSION,
    ExportedModel,
    foreign_entries,
    load_exported,
    meta_digest,
)
from ctrkit.version import __version__

log = logging.getLogger(__name__)

TOLERANCE = 1e-5  # max |exported - eager| on the check batches
EXAMPLE_ROWS, CHECK_ROWS = 4, (7, 1)  # the export example's B; the check batches' (other sizes on purpose)
INPUTS = [
    {"name": "dense", "dtype": "float32", "shape": ["B", "Nd"],
     "meaning": "dense features in schema order (dense_names), as the pipeline writes them"},
    {"name": "values", "dtype": "int64", "shape": ["nnz"],
     "meaning": "ids of every sparse key, key-major: all rows of sparse_keys[0], then of sparse_keys[1], ... "
                "(KeyedJagged values, after the pipeline's batch stage)"},
    {"name": "lengths", "dtype": "int64", "shape": ["F*B"],
     "meaning": "lengths[f*B + b] = the number of ids of sparse_keys[f] in row b (0 for an empty bag)"},
]
OUTPUT = {"name": OUTPUT_NAME, "dtype": "float32", "shape": ["B"], "meaning": "click probability, sigmoid(logit)"}
RETRIEVAL_OUTPUT = {**OUTPUT, "meaning": "sigmoid(<query, item> / temperature) of each row's own (query, item) pair: "
                                         "a relevance score, not a calibrated click probability"}


class ScoringModule(nn.Module):
    """``(dense (B, Nd), values (nnz,), lengths (F*B,))`` -> click probabilities (B,): the model's Batch rebuilt
    from plain tensors over ``sparse_keys`` (labels are zero placeholders)."""

    def __init__(self, model: nn.Module, sparse_keys: list[str]) -> None:
        super().__init__()
        self.model = model
        self.sparse_keys = list(sparse_keys)

    def forward(self, dense: torch.Tensor, values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        B = dense.shape[0]
        kj = KeyedJagged(self.sparse_keys, values, lengths=lengths, stride=B)
        batch = Batch(dense=dense, sparse=kj, labels=dense.new_zeros(B))
        return probabilities(self.model(batch))  # (B,)


# ---- what can be exported -------------------------------------------------------------------------
def check_exportable(name: str) -> None:
    """An ExportError naming model ``name`` and why, when its forward leaves torch (``exportable = False``)."""
    cls = get_model_class(name)
    if not getattr(cls, "exportable", True):
        why = getattr(cls, "export_blocker", "") or "its forward leaves torch"
        raise ExportError(f"model {name!r} cannot be exported to TorchScript or ONNX: {why}")


def example_inputs(schema: Schema, stage: MultiHot | None, rows: int,
                   seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random valid inputs of ``rows`` rows: one id per single-valued feature, multi-valued bags of 0-3 ids,
    histories of every length 0..max_len (sequences of one max_len share their lengths, as the attributes of one
    behaviour do); ``stage`` (the pipeline's multi-hot) applied."""
    g = torch.Generator().manual_seed(seed)
    tables = schema.tables()
    seq_lengths: dict[int, torch.Tensor] = {}
    per_key = {}
    for key in schema.sparse_keys:
        f = schema.feature(key)
        if isinstance(f, SequenceFeature):
            if f.max_len not in seq_lengths:
                n = torch.randint(0, f.max_len + 1, (rows,), generator=g)
                n[: min(rows, 2)] = torch.tensor([0, f.max_len])[: min(rows, 2)]  # an empty and a full history
                seq_lengths[f.max_len] = n
            lengths = seq_lengths[f.max_len]
        elif isinstance(f, SparseFeature) and f.multi_valued:
            lengths = torch.randint(0, 4, (rows,), generator=g)
        else:
            lengths = torch.ones(rows, dtype=torch.int64)
        vocab = tables[schema.table_of(key)].num_embeddings
        per_key[key] = (torch.randint(0, vocab, (int(lengths.sum()),), generator=g), lengths)
    kj = KeyedJagged.from_per_key(per_key, stride=rows)
    if stage is not None:
        kj = stage(kj)
    dense = torch.randn(rows, schema.num_dense, generator=g)
    return dense, kj.values, kj.lengths


def capture(module: ScoringModule, example: tuple[torch.Tensor, ...]) -> torch.export.ExportedProgram:
    """``module`` captured by ``torch.export`` with B and nnz symbolic (lengths has F*B entries)."""
    B = torch.export.Dim("batch", min=1)
    nnz = torch.export.Dim("nnz", min=0)
    shapes = {"dense": {0: B}, "values": {0: nnz}, "lengths": {0: len(module.sparse_keys) * B}}
    with torch.no_grad(), warnings.catch_warnings():
        # nn.GRU / nn.LSTM re-read their weights into _flat_weights on every call: harmless under export
        warnings.filterwarnings("ignore", message=r"The tensor attributes .*_flat_weights")
        return torch.export.export(module, example, dynamic_shapes=shapes, strict=False)


def check_program(module: ScoringModule, run: Runner, schema: Schema, stage: MultiHot | None) -> float:
    """max |run - module| over the check batches (CHECK_ROWS rows, other lengths than the export example)."""
    worst = 0.0
    for i, rows in enumerate(CHECK_ROWS):
        dense, values, lengths = example_inputs(schema, stage, rows, seed=1 + i)
        with scoring(module):
            want = module(dense, values, lengths).numpy()
        got = run(dense.numpy(), values.numpy(), lengths.numpy())
        if got.shape != want.shape:
            raise ExportError(f"the exported program returned shape {got.shape} for {rows} rows, not {want.shape}")
        worst = max(worst, float(np.abs(got - want).max()))
    return worst


# ---- checkpoint -> export directory ---------------------------------------------------------------------
def export_checkpoint(checkpoint_path: str | Path, out_dir: str | Path, fmt: str, *, overwrite: bool = False) -> Path:
    """Export the model of ``checkpoint_path`` to ``out_dir`` in ``fmt`` ("torchscript" | "onnx"); returns out_dir.

    ``out_dir`` may be absent or an empty directory; ``overwrite`` lets it be an earlier export (a directory
    holding an export.json written by ctrkit export and nothing but an export's files), never any other
    directory (a run directory, a folder of the user's). Everything is written to a temporary directory beside
    it and renamed at the end: a failure leaves no partial export (and an old one in place).
    """
    if fmt not in FORMATS:
        raise ConfigError(f"export format {fmt!r} is not one of {FORMATS}")
    path, out = Path(checkpoint_path), Path(out_dir)
    check_replaceable_export(out, overwrite)
    ckpt = Checkpoint.load(path)
    name = ckpt.model_name
    if name:
        check_exportable(name)  # before the model is built (GBDT+LR's would parse its trees)
    model, schema = ckpt.build_model(), ckpt.schema
    pipeline = ckpt.feature_pipeline()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        meta = _export_into(tmp, model, name, schema, pipeline, fmt)
        meta["checkpoint"] = {"path": str(path.resolve()), "sha256": file_checksum(path, full=True)}
        meta["files"] = {p.name: file_checksum(p, full=True) for p in sorted(tmp.iterdir()) if p.is_file()}
        meta["digest"] = meta_digest(meta)
        save_pipeline(pipeline, tmp / PIPELINE_DIR)
        (tmp / META_FILE).write_text(json.dumps(meta, indent=1))
        check_replaceable_export(out, overwrite)  # again: something may have appeared there meanwhile
        _move_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _export_into(directory: Path, model: nn.Module, name: str, schema: Schema, pipeline: FeaturePipeline,
                 fmt: str) -> dict[str, Any]:
    """Capture, write and check the program in ``directory``; returns export.json's entries."""
    stage = pipeline.batch_stage
    module = ScoringModule(model, schema.sparse_keys).eval()
    t0 = time.perf_counter()
    try:
        program = capture(module, example_inputs(schema, stage, EXAMPLE_ROWS, seed=0))
        write_program(program, fmt, directory / MODEL_FILES[fmt])
        seconds = time.perf_counter() - t0
        diff = check_program(module, program_runner(fmt, directory / MODEL_FILES[fmt]), schema, stage)
    except ExportError:
        raise
    except Exception as e:  # torch.export / TorchScript / ONNX / onnxruntime raise many types
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ExportError(f"model {name!r} could not be exported to {fmt}: {type(e).__name__}: {first}") from e
    if not diff <= TOLERANCE:
        raise ExportError(f"model {name!r}: the {fmt} program's scores differ from the model's by {diff:.2e} "
                          f"(> {TOLERANCE:g}) on the check batches; nothing was written")
    log.info("exported %s to %s in %.1fs (max |exported - eager| %.1e on %s-row checks)", name, fmt, seconds, diff,
             "/".join(map(str, CHECK_ROWS)))
    return {
        "format": fmt, "file": MODEL_FILES[fmt], "kind": MARKER, "version": VERSION, "model": name,
        "task_kind": type(model).task_kind, "inputs": INPUTS,
        "output": RETRIEVAL_OUTPUT if isinstance(model, TwoTowerModel) else OUTPUT,
        "sparse_keys": schema.sparse_keys, "num_dense": schema.num_dense, "dense_names": schema.dense_names,
        "pipeline": PIPELINE_DIR, "multi_hot": pipeline.multi_hot,
        "check": {"rows": list(CHECK_ROWS), "max_abs_diff": diff, "tolerance": TOLERANCE},
        "torch_version": torch.__version__, "ctrkit_version": __version__,
    }


def check_replaceable_export(out: Path, overwrite: bool) -> None:
    """An ExportError unless ``out`` is absent, an empty directory, or (with ``overwrite``) an earlier export."""
    if not path_exists(out) or is_empty_dir(out):
        return
    if not out.is_dir():
        raise ExportError(f"--out {out} is a file, not an export directory; choose another --out")
    foreign = foreign_entries(out)
    if foreign:
        what = ("holds no export.json written by ctrkit export" if foreign == [META_FILE] else
                f"holds {', '.join(foreign[:5])}{' ...' if len(foreign) > 5 else ''}, which ctrkit export does not "
                "write")
        raise ExportError(f"--out {out} is not an earlier export (it {what}); --overwrite replaces only an export, "
                          "never a run directory or another folder: choose another --out")
    if not overwrite:
        raise ExportError(f"{out} exists and is not empty; pass --overwrite to replace it")


def _move_into_place(tmp: Path, out: Path) -> None:
    """Rename ``tmp`` to ``out``; an existing ``out`` (empty, or replaced by --overwrite) goes only after."""
    if not out.exists():
        os.replace(tmp, out)
        return
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    os.replace(out, old)
    os.replace(tmp, out)
    if old.is_dir():
        shutil.rmtree(old, ignore_errors=True)
    else:
        old.unlink(missing_ok=True)


# ---- command line ----------------------------------------------------------------------------------------
def add_export_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Options of ``ctrkit export``."""
    p.add_argument("--checkpoint", required=True, help="checkpoint to export (a run's best.pt / last.pt)")
    p.add_argument("--format", required=True, choices=FORMATS, help="torchscript (model.pt) or onnx (model.onnx)")
    p.add_argument("--out", required=True, help="export directory: the model file, pipeline/ and export.json")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an earlier export in --out (never a run directory or another folder)")
    return p


def run_export(args: argparse.Namespace) -> int:
    """Run :func:`export_checkpoint` from parsed arguments; logs where the export went."""
    out = export_checkpoint(args.checkpoint, args.out, args.format, overwrite=args.overwrite)
    meta = json.loads((out / META_FILE).read_text())
    log.info("%s: %s export of %s (inputs dense, values, lengths over %d sparse keys) -> %s", args.checkpoint,
             args.format, meta["model"], len(meta["sparse_keys"]), out)
    return 0


__all__ = [
    "FORMATS", "MARKER", "META_FILE", "MODEL_FILES", "PIPELINE_DIR", "VERSION", "ExportedModel", "ScoringModule",
    "add_export_args", "capture", "check_exportable", "check_replaceable_export", "example_inputs",
    "export_checkpoint", "load_exported", "run_export", "to_torchscript",
]
