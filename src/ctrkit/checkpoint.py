"""Self-contained checkpoints: everything needed to resume training or to score raw requests.

:class:`Checkpoint` is the typed view every reader uses (the trainer's writer, the jobs, the Predictor,
export, the recall job); nobody outside this module reads the file's keys. On disk it is one ``torch.save``
file holding only tensors, numbers, strings, lists and dicts, so it loads with
``torch.load(weights_only=True)`` (no pickled code runs on load). The layout (format version 2, unchanged
since the first checksummed release, so every checkpoint written since loads)::

    {"format": "ctrkit-checkpoint", "version": 2, "ctrkit_version": "0.1.0",
     "checksum": "sha256:..." over everything else (see content_digest),
     "config":  resolved run config (nested dict) or None,              -> Checkpoint.config
     "schema":  Schema.to_dict() or None,                               -> Checkpoint.schema (a Schema)
     "model":   {"name": registry name, "params": keyword parameters},  -> model_name, model_params
     "model_state": model.state_dict(),                                 -> weights
     "optimizer":   OptimizerSet.state_dict() or None,                  -> optimizer
     "trainer":     {"epoch", "step", "epoch_complete", "loader", "best_metric", "best_step",
                     "bad_evals", ..., "rng", "weight_average"} or None -> trainer (a TrainerState)
     "vocab":   {"arrays": {name: array ...} or None, "path": vocab directory or None}
                                                                        -> vocab_files, vocab_path
     "pipeline": the training data's pipeline as persist.to_payload() ({"meta": ..., "arrays": ...}) or None,
     "extra":   free dict (e.g. "preprocessing", the retrieval "catalogue")}

numpy arrays anywhere are stored as ``{"__ndarray__": tensor}`` (numeric) or
``{"__ndarray_str__": [str, ...]}`` (string vocabularies) and come back as numpy arrays on load.
Writes are atomic: a temporary file in the same directory (fsynced), then ``os.replace``.

Trust on load: the file is read with ``weights_only=True``; its ``checksum`` (sha256 over the content: every
key, number, string and tensor byte, :func:`content_digest`) is recomputed and a mismatch refuses the file
(flipped bytes are never scored; a byte flipped in the zip structure already fails the read). A checkpoint of
another format version is refused with the versions named; version 1 (before checksums) still loads, with a
warning that it cannot be verified.

Floor: below ``training/``, ``serving/`` and ``jobs/`` (which all read it), above ``models/`` and ``data/`` (whose
model registry and pipeline it rebuilds); it never imports ``training/``.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from ctrkit.errors import CheckpointError
from ctrkit.io import RecordingWriter, missing_path, verify_files, write_failure
from ctrkit.schema import Schema

if TYPE_CHECKING:
    from ctrkit.data.pipeline.feature_pipeline import FeaturePipeline
    from ctrkit.models.base import CTRModel

FORMAT = "ctrkit-checkpoint"
VERSION = 2
READS = (1, 2)  # format versions this ctrkit loads (1: no checksum)
DEFAULT_SCORING_BATCH_SIZE = 8192  # rows per scoring batch when the run config names no batch size
log = logging.getLogger(__name__)


def scoring_batch_size(batch_size: int | None, eval_batch_size: int | None) -> int:
    """Rows per batch that a run evaluates with, and that evaluate / predict / recall score a checkpoint with
    unless told otherwise: ``data.eval_batch_size``, else 4 x ``data.batch_size``."""
    if eval_batch_size:
        return int(eval_batch_size)
    return 4 * int(batch_size) if batch_size else DEFAULT_SCORING_BATCH_SIZE

# ---- plain-data conversion ---------------------------------------------------------------------------
def to_plain(obj: Any, where: str = "checkpoint") -> Any:
    """``obj`` with numpy arrays / scalars, tuples and paths turned into weights_only-safe values."""
    if isinstance(obj, torch.Tensor):
        return obj.detach()
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind in "biuf":
            return {"__ndarray__": torch.from_numpy(np.ascontiguousarray(obj)).clone()}
        if obj.dtype.kind in "USO":
            return {"__ndarray_str__": [str(x) for x in obj.reshape(-1).tolist()], "shape": list(obj.shape)}
        raise CheckpointError(f"{where}: cannot store a numpy array of dtype {obj.dtype}")
    if isinstance(obj, np.generic):
        return obj.item()
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, dict):
        return {k: to_plain(v, f"{where}.{k}") for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_plain(v, f"{where}[{i}]") for i, v in enumerate(obj))
    raise CheckpointError(
        f"{where}: a {type(obj).__name__} cannot be stored in a weights_only checkpoint; "
        "convert it to tensors / numbers / strings / lists / dicts"
    )


def from_plain(obj: Any) -> Any:
    """Inverse of :func:`to_plain` for the numpy markers."""
    if isinstance(obj, dict):
        if "__ndarray__" in obj and len(obj) == 1:
            return obj["__ndarray__"].numpy()
        if "__ndarray_str__" in obj:
            return np.asarray(obj["__ndarray_str__"], dtype=str).reshape(obj.get("shape", [-1]))
        return {k: from_plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [from_plain(v) for v in obj]
    return obj


def content_digest(obj: Any) -> str:
    """sha256 over plain checkpoint content (:func:`to_plain` output): types, dict keys in order, numbers,
    strings, and every tensor's dtype, shape and bytes. Independent of how torch lays the file out."""
    h = hashlib.sha256()

    def walk(o: Any) -> None:
        if isinstance(o, torch.Tensor):
            flat = o.detach().cpu().reshape(-1)
            h.update(f"T{o.dtype}{tuple(o.shape)}".encode())
            if flat.numel():
                if flat.stride(0) != 1:  # e.g. an expanded tensor (stride 0), or strides from a damaged file
                    flat = flat.clone(memory_format=torch.contiguous_format)
                h.update(flat.view(torch.uint8).numpy())
        elif isinstance(o, dict):
            h.update(f"D{len(o)}".encode())
            for k, v in o.items():
                walk(k)
                walk(v)
        elif isinstance(o, (list, tuple)):
            h.update(f"{'L' if isinstance(o, list) else 'U'}{len(o)}".encode())
            for v in o:
                walk(v)
        elif isinstance(o, str):
            b = o.encode("utf-8", "surrogatepass")
            h.update(f"S{len(b)}:".encode())
            h.update(b)
        else:  # None, bool, int, float
            h.update(f"{type(o).__name__}:{o!r};".encode())

    walk(obj)
    return "sha256:" + h.hexdigest()


# ---- the typed checkpoint --------------------------------------------------------------------------------
@dataclass
class TrainProgress:
    """How far a training run got: the one record of its progress (the Trainer keeps one, resume restores
    it, the Predictor reports it). Stored flat in the file's ``"trainer"`` entry."""

    epoch: int = 0
    step: int = 0
    epoch_complete: bool = False
    best_metric: float | None = None
    best_step: int | None = None
    bad_evals: int = 0
    stopped_early: bool = False
    last_eval: dict[str, float] = field(default_factory=dict)
    best_eval: dict[str, float] = field(default_factory=dict)  # the best evaluation: step, epoch, valid metrics
    train_seconds: float = 0.0  # time in training steps (evaluation and checkpoints excluded), over resumes
    samples: int = 0  # training rows seen, over resumes


@dataclass
class TrainerState:
    """What resuming needs besides weights and optimizer: the progress, the loader's mid-epoch position, the
    python / numpy / torch RNG states, the weight average and the learning-rate schedule, each as plain data."""

    progress: TrainProgress = field(default_factory=TrainProgress)
    loader: dict[str, Any] | None = None
    rng: dict[str, Any] | None = None
    weight_average: dict[str, Any] | None = None
    lr_schedule: dict[str, Any] | None = None  # train.lr_schedule's state (training/lr_schedule.py)

    def to_plain(self) -> dict[str, Any]:
        progress = {f.name: getattr(self.progress, f.name) for f in fields(TrainProgress)}
        plain = {**progress, "loader": self.loader, "rng": self.rng, "weight_average": self.weight_average}
        return plain if self.lr_schedule is None else {**plain, "lr_schedule": self.lr_schedule}  # none: no key

    @classmethod
    def from_plain(cls, state: dict[str, Any]) -> TrainerState:
        """From the file's ``"trainer"`` entry; keys older checkpoints lack keep their defaults."""
        plain = from_plain({k: v for k, v in state.items() if k != "rng"})  # RNG tensors stay tensors
        progress = TrainProgress(**{f.name: plain[f.name] for f in fields(TrainProgress) if f.name in plain})
        progress.last_eval, progress.best_eval = dict(progress.last_eval or {}), dict(progress.best_eval or {})
        return cls(progress, plain.get("loader"), state.get("rng"), plain.get("weight_average"), plain.get("lr_schedule"))


@dataclass
class Checkpoint:
    """A checkpoint in memory: what :meth:`save` writes and :meth:`load` returns (see the module docstring).

    ``config`` is the resolved run config as plain nested data (``train.config.config_to_dict``); ``pipeline`` the
    training data's pipeline (``data.pipeline.persist.to_payload``); ``extra`` free plain data
    (``"preprocessing"``, the retrieval ``"catalogue"``). ``vocab_files`` ({file name: bytes as uint8}) or ``vocab_path`` (a store's vocab directory)
    are the vocabularies of checkpoints written before pipelines existed, kept for the agreement checks."""

    model_name: str | None
    weights: dict[str, torch.Tensor]
    model_params: dict[str, Any] = field(default_factory=dict)
    schema: Schema | None = None
    config: dict[str, Any] | None = None
    pipeline: dict[str, Any] | None = None
    optimizer: dict[str, Any] | None = None
    trainer: TrainerState | None = None
    vocab_files: dict[str, Any] | None = None
    vocab_path: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    version: int = VERSION
    ctrkit_version: str | None = field(default_factory=lambda: _version())
    source: str | None = field(default=None, compare=False)  # the file it was read from (for messages)

    @classmethod
    def of(cls, model: nn.Module, *, model_name: str | None = None, **parts: Any) -> Checkpoint:
        """The checkpoint of ``model``'s current weights; ``model_name`` defaults to its registry name,
        ``parts`` are the other fields (``schema``, ``config``, ``pipeline``, ...)."""
        return cls(model_name or getattr(model, "model_name", None), model.state_dict(), **parts)

    # ---- what readers ask for ---------------------------------------------------------------------------
    @property
    def catalogue(self) -> dict[str, Any] | None:
        """The item catalogue payload of a retrieval model (``ItemCatalogue.to_payload()``), else None."""
        return self.extra.get("catalogue")

    @property
    def preprocessing(self) -> dict[str, Any]:
        """How the training store's raw data was read (its manifest's preprocessing record)."""
        return self.extra.get("preprocessing") or {}

    @property
    def data_config(self) -> dict[str, Any]:
        """The ``data`` block of the run config ({} when the checkpoint has no config)."""
        return (self.config.get("data") or {}) if isinstance(self.config, dict) else {}

    @property
    def scoring_batch_size(self) -> int:
        """Rows per batch the run evaluated with (:func:`scoring_batch_size` of its data config)."""
        d = self.data_config
        return scoring_batch_size(d.get("batch_size"), d.get("eval_batch_size"))

    @property
    def progress(self) -> TrainProgress | None:
        return self.trainer.progress if self.trainer is not None else None

    def build_model(self) -> CTRModel:
        """The model, rebuilt from the registry with the checkpoint's parameters and weights, in eval mode."""
        from ctrkit.models.registry import create_model, upgrade_params

        if self.schema is None or not self.model_name:
            raise CheckpointError(f"{self._where()} has no schema or model name; it was saved without them and "
                                  "cannot rebuild a model")
        params = upgrade_params(self.model_name, self.model_params)  # options renamed since the file was written
        model = create_model(self.model_name, self.schema, **params)
        try:
            model.load_state_dict(self.weights)
        except RuntimeError as e:
            raise CheckpointError(f"{self._where()}: weights do not fit model {self.model_name!r}: {e}") from e
        return model.eval()

    def feature_pipeline(self) -> FeaturePipeline:
        """The feature pipeline the model was trained with (rebuilt from the vocabularies, the preprocessing
        record and the data config for checkpoints written before pipelines existed)."""
        from ctrkit.data.pipeline.persist import pipeline_from_parts

        if self.schema is None and not self.pipeline:
            raise CheckpointError(f"{self._where()} has no schema and no pipeline: it cannot read raw data")
        return pipeline_from_parts(payload=self.pipeline, schema=self.schema, vocab_files=self.vocab_files,
                                   preprocessing=self.preprocessing, data_config=self.data_config)

    def _where(self) -> str:
        return str(self.source) if self.source else "the checkpoint"

    # ---- the file ---------------------------------------------------------------------------------------
    def to_plain(self) -> dict[str, Any]:
        """The file's content (without the checksum): weights_only-safe plain data."""
        return to_plain({
            "format": FORMAT, "version": VERSION, "ctrkit_version": self.ctrkit_version,
            "config": self.config,
            "schema": self.schema.to_dict() if self.schema is not None else None,
            "model": {"name": self.model_name, "params": dict(self.model_params)},
            "model_state": self.weights,
            "optimizer": self.optimizer,
            "trainer": self.trainer.to_plain() if self.trainer is not None else None,
            "vocab": {"arrays": self.vocab_files, "path": self.vocab_path},
            "pipeline": self.pipeline,
            "extra": self.extra,
        })

    @classmethod
    def from_plain(cls, raw: dict[str, Any], source: str | None = None) -> Checkpoint:
        """From a verified file's content (versions 1 and 2 share the layout)."""
        model = raw.get("model") or {}
        vocab = from_plain(raw.get("vocab")) or {}
        try:
            schema = Schema.from_dict(raw["schema"]) if raw.get("schema") is not None else None
        except Exception as e:  # noqa: BLE001 - a schema this version cannot read
            raise CheckpointError(f"{source}: its schema cannot be read ({type(e).__name__}: {e})") from None
        return cls(
            model_name=model.get("name"), weights=raw.get("model_state") or {},
            model_params=dict(model.get("params") or {}), schema=schema, config=raw.get("config"),
            pipeline=from_plain(raw.get("pipeline")), optimizer=raw.get("optimizer"),
            trainer=TrainerState.from_plain(raw["trainer"]) if raw.get("trainer") is not None else None,
            vocab_files=vocab.get("arrays"), vocab_path=vocab.get("path"), extra=from_plain(raw.get("extra")) or {},
            version=raw["version"], ctrkit_version=raw.get("ctrkit_version"), source=source,
        )

    def save(self, path: str | Path) -> Path:
        """Write the checkpoint atomically (temporary file beside it, fsync, rename); returns its path. A value
        that is not plain data is an error naming where it is, and leaves an existing file as it was."""
        path = Path(path)
        ckpt = self.to_plain()
        ckpt["checksum"] = content_digest(ckpt)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        out = RecordingWriter()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                out.file = f
                torch.save(ckpt, out)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except (OSError, RuntimeError) as e:  # torch.save reports a failed write as a RuntimeError
            tmp.unlink(missing_ok=True)
            raise CheckpointError(write_failure(path, out.error or e, "the checkpoint", "run.dir")) from None
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return path

    @classmethod
    def load(cls, path: str | Path, map_location: str | torch.device = "cpu") -> Checkpoint:
        """Read and verify the checkpoint at ``path`` (weights_only, format, version, checksum); a sharded one's
        directory (training/sharded_checkpoint.py) as the fused backend's (:func:`read_sharded`)."""
        if (Path(path) / SHARDED_META).is_file():
            return read_sharded(Path(path))
        return cls.from_plain(_read_verified(Path(path), map_location), source=str(path))


SHARDED_META, SHARDED_WEIGHTS = "checkpoint.pt", "weights"  # a sharded checkpoint's directory


def read_sharded(path: Path) -> Checkpoint:
    """A sharded checkpoint as a single-process one: its tables gathered whole from the DCP files, the model
    parameters set to the fused backend, no optimizer state (the fused optimizers' has no single-process twin)."""
    from torch.distributed.checkpoint import FileSystemReader, default_planner, state_dict_loader

    meta, state = Checkpoint.from_plain(_read_verified(path / SHARDED_META, "cpu"), source=str(path)), {}
    verify_files(path / SHARDED_WEIGHTS, meta.extra.get("sharded", {}).get("files", {}), "sharded checkpoint")
    state_dict_loader._load_state_dict(state, storage_reader=FileSystemReader(str(path / SHARDED_WEIGHTS)),
                                       planner=default_planner._EmptyStateDictLoadPlanner(keys={"model"}), no_dist=True)
    meta.weights = dict(state["model"])
    meta.model_params = {**meta.model_params, "embedding_backend": "fused"}
    meta.optimizer = None
    return meta


def _read_verified(path: Path, map_location: str | torch.device) -> dict[str, Any]:
    """The file's content, its checksum checked and removed; every refusal is a CheckpointError."""
    if not path.is_file():
        raise CheckpointError(missing_path(path, "checkpoint file", "A training run writes best.pt and last.pt "
                                           "into its run directory (run.dir/run.name, printed by `ctrkit train`)"))
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # torch raises many types for a bad file
        raise CheckpointError(
            f"{path} could not be read as a checkpoint (truncated, corrupt or not a torch file): "
            f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        ) from e
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise CheckpointError(f"{path} is a torch file but not a ctrkit checkpoint (no format={FORMAT!r})")
    version = ckpt.get("version")
    if version not in READS:
        newer = isinstance(version, int) and version > VERSION
        raise CheckpointError(
            f"{path} has checkpoint format version {version!r} (written by ctrkit {ckpt.get('ctrkit_version')}); "
            f"this ctrkit {_version()} reads versions {list(READS)}: "
            + ("upgrade ctrkit to read it" if newer else "retrain, or export it with the ctrkit that wrote it")
        )
    stored = ckpt.pop("checksum", None)
    if version < 2:
        log.warning("%s is a version-1 checkpoint without a checksum; its content cannot be verified", path)
        return ckpt
    try:
        actual = content_digest(ckpt)
    except Exception as e:  # noqa: BLE001 - a damaged file can hold tensors no digest can read
        raise CheckpointError(f"{path} holds damaged tensors ({type(e).__name__}: {e}); it is refused, "
                              "not scored. Use another copy (e.g. last.pt)") from None
    if stored != actual:
        raise CheckpointError(
            f"{path} fails its checksum (stored {stored}, content {actual}): the file was changed or "
            "damaged after it was written; it is refused, not scored. Use another copy (e.g. last.pt)"
        )
    return ckpt


def _version() -> str:
    from ctrkit.version import __version__

    return __version__
