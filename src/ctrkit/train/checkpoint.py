"""Self-contained checkpoints: everything needed to resume training or to score raw requests.

A checkpoint is one ``torch.save`` file holding only tensors, numbers, strings, lists and dicts, so
it loads with ``torch.load(weights_only=True)`` (no pickled code runs on load)::

    {"format": "ctrkit-checkpoint", "version": 2, "ctrkit_version": "0.1.0",
     "checksum": "sha256:..." over everything else (see content_digest),
     "config":  resolved run config (nested dict) or None,
     "schema":  Schema.to_dict() or None,
     "model":   {"name": registry name, "params": keyword parameters},
     "model_state": model.state_dict(),
     "optimizer":   OptimizerSet.state_dict() or None,
     "trainer":     {"epoch", "step", "epoch_complete", "loader", "best_metric", "best_step",
                     "bad_evals", "rng": rng_state()} or None,
     "vocab":   {"arrays": {name: array ...} or None, "path": vocab directory or None},
     "pipeline": the training data's FeaturePipeline.to_payload() ({"meta": ..., "arrays": ...}) or None,
     "extra":   free dict}

numpy arrays anywhere are stored as ``{"__ndarray__": tensor}`` (numeric) or
``{"__ndarray_str__": [str, ...]}`` (string vocabularies) and come back as numpy arrays on load.
Writes are atomic: a temporary file in the same directory (fsynced), then ``os.replace``.

Trust on load: the file is read with ``weights_only=True``; its ``checksum`` (sha256 over the content: every
key, number, string and tensor byte, :func:`content_digest`) is recomputed and a mismatch refuses the file
(flipped bytes are never scored; a byte flipped in the zip structure already fails the read). A checkpoint of
another format version is refused with the versions named; version 1 (before checksums) still loads, with a
warning that it cannot be verified.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ctrkit.errors import CheckpointError
from ctrkit.io import missing_path

FORMAT = "ctrkit-checkpoint"
VERSION = 2
READS = (1, 2)  # format versions this ctrkit loads (1: no checksum)
log = logging.getLogger(__name__)

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


# ---- RNG state -----------------------------------------------------------------------------------
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


# ---- save / load ---------------------------------------------------------------------------------
def save_checkpoint(
    path: str | Path,
    *,
    model: nn.Module,
    model_name: str | None = None,
    model_params: dict[str, Any] | None = None,
    schema: Any = None,
    config: dict[str, Any] | None = None,
    optimizer: Any = None,
    trainer_state: dict[str, Any] | None = None,
    vocab: dict[str, Any] | str | Path | None = None,
    pipeline: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write a checkpoint atomically; returns its path.

    ``schema`` is a :class:`~ctrkit.schema.Schema` (or its dict); ``model_name`` defaults to the
    registry name of the model's class; ``vocab`` is a dict of arrays (stored inside, so predict
    needs nothing else) or a path to a store's vocab directory (stored as a reference);
    ``pipeline`` is the training data's :class:`~ctrkit.data.pipeline.feature_pipeline.FeaturePipeline` as plain
    arrays + JSON (``FeaturePipeline.to_payload()``), so evaluate / predict apply what training applied.
    """
    path = Path(path)
    name = model_name or getattr(model, "model_name", None)
    if isinstance(vocab, (str, Path)):
        vocab_entry = {"arrays": None, "path": str(vocab)}
    else:
        vocab_entry = {"arrays": vocab, "path": None}
    ckpt = {
        "format": FORMAT,
        "version": VERSION,
        "ctrkit_version": _version(),
        "config": config,
        "schema": schema.to_dict() if hasattr(schema, "to_dict") else schema,
        "model": {"name": name, "params": dict(model_params or {})},
        "model_state": model.state_dict(),
        "optimizer": optimizer.state_dict() if hasattr(optimizer, "state_dict") else optimizer,
        "trainer": trainer_state,
        "vocab": vocab_entry,
        "pipeline": pipeline,
        "extra": extra or {},
    }
    ckpt = to_plain(ckpt)
    ckpt["checksum"] = content_digest(ckpt)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(ckpt, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint with ``torch.load(weights_only=True)`` and check its format marker."""
    path = Path(path)
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
    if version >= 2:
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
    else:
        log.warning("%s is a version-1 checkpoint without a checksum; its content cannot be verified", path)
    ckpt["vocab"] = from_plain(ckpt.get("vocab"))
    ckpt["extra"] = from_plain(ckpt.get("extra"))
    ckpt["pipeline"] = from_plain(ckpt.get("pipeline"))
    if ckpt.get("trainer") is not None:
        rng = ckpt["trainer"].get("rng")
        ckpt["trainer"] = from_plain({k: v for k, v in ckpt["trainer"].items() if k != "rng"})
        ckpt["trainer"]["rng"] = rng
    return ckpt


def load_model(path: str | Path, map_location: str | torch.device = "cpu", *,
               ckpt: dict[str, Any] | None = None) -> tuple[nn.Module, Any, Any]:
    """Rebuild the model of a checkpoint: ``(model in eval mode, Schema, Config or None)``; ``ckpt``: the
    checkpoint at ``path`` already read by :func:`load_checkpoint`."""
    from ctrkit.models.registry import ConfigError, create_model, upgrade_params
    from ctrkit.schema import Schema
    from ctrkit.train.config import config_from_dict

    ckpt = load_checkpoint(path, map_location) if ckpt is None else ckpt
    if ckpt.get("schema") is None or not ckpt["model"].get("name"):
        raise CheckpointError(
            f"{path} has no schema or model name; it was saved without them and cannot rebuild a model"
        )
    schema = Schema.from_dict(ckpt["schema"])
    name = ckpt["model"]["name"]
    model = create_model(name, schema, **upgrade_params(name, ckpt["model"]["params"]))  # options renamed since
    try:
        model.load_state_dict(ckpt["model_state"])
    except RuntimeError as e:
        raise CheckpointError(f"{path}: weights do not fit model {ckpt['model']['name']!r}: {e}") from e
    model.eval()
    config = None
    if ckpt.get("config") is not None:
        try:
            config = config_from_dict(ckpt["config"])
        except ConfigError:  # a config this version cannot validate stays a plain dict
            config = ckpt["config"]
    return model, schema, config


def _version() -> str:
    from ctrkit.version import __version__

    return __version__
