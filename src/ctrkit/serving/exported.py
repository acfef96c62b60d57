"""An export directory read back (:func:`load_exported`), and what makes a directory an export.

export.json describes the directory and vouches for it: ``files`` holds the sha256 of every program file
(``model.pt``, or ``model.onnx`` and ``model.onnx.data`` beside it for weights past 1 GiB) and ``digest`` the
sha256 of export.json's own other entries (:func:`meta_digest`). Reading an export checks, before anything
runs, that export.json parses and is a v2 ctrkit export, that its digest matches (an edited field is refused),
that every file it names is a plain relative path inside the directory (symlinks resolved: none points out),
that the types of the entries read are right and that each program file has its recorded checksum. Every
refusal is an :class:`~ctrkit.errors.ExportError` naming export.json or the file, and the fix (export the
checkpoint again); so is a program the runtime cannot load.

What ``ctrkit export --overwrite`` may replace (:func:`foreign_entries`): an empty directory, or one holding an
export.json of kind ``ctrkit-export`` and nothing but an export's entries, never a run directory or any other.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from ctrkit.batch import Batch
from ctrkit.data.pipeline.feature_pipeline import FeaturePipeline
from ctrkit.data.pipeline.persist import load_pipeline
from ctrkit.errors import ExportError
from ctrkit.io import file_checksum
from ctrkit.serving.export_formats import program_runner

FORMATS = ("torchscript", "onnx")
MODEL_FILES = {"torchscript": "model.pt", "onnx": "model.onnx"}
ONNX_DATA = "model.onnx.data"  # the weights of an ONNX program past 1 GiB
META_FILE = "export.json"
PIPELINE_DIR = "pipeline"
MARKER, VERSION = "ctrkit-export", 2  # v2: export.json holds the files' checksums and its own digest
ENTRIES = (META_FILE, PIPELINE_DIR, *MODEL_FILES.values(), ONNX_DATA)  # what an export directory holds
AGAIN = "export the checkpoint again (ctrkit export --checkpoint ... --out DIR --overwrite)"


def meta_digest(meta: dict[str, Any]) -> str:
    """sha256 of export.json's entries other than ``digest`` (canonical JSON: sorted keys, no spaces)."""
    body = {k: v for k, v in meta.items() if k != "digest"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def foreign_entries(directory: Path) -> list[str]:
    """What keeps ``ctrkit export --overwrite`` from replacing ``directory`` (a non-empty directory): its entries
    that no export holds, or ``[export.json]`` when it has no export.json of kind ctrkit-export; [] for an export."""
    names = sorted(p.name for p in directory.iterdir())
    foreign = [n for n in names if n not in ENTRIES]
    if foreign:
        return foreign
    try:
        meta = json.loads((directory / META_FILE).read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return [META_FILE]
    return [] if isinstance(meta, dict) and meta.get("kind") == MARKER else [META_FILE]


def _inside(directory: Path, name: Any, key: str, mpath: Path) -> Path:
    """``directory / name`` for a plain relative ``name`` that stays inside ``directory`` (symlinks resolved)."""
    bad = (not isinstance(name, str) or not name or Path(name).is_absolute() or ".." in Path(name).parts
           or "\\" in name)
    path = directory / name if not bad else directory
    if bad or not path.resolve().is_relative_to(directory.resolve()):
        raise ExportError(f"{mpath}: {key!r} = {name!r} points outside the export directory {directory}; an "
                          f"export names only files inside it: {AGAIN}")
    return path


def read_meta(directory: Path) -> dict[str, Any]:
    """export.json of ``directory``, checked as the module docstring says (program files included)."""
    mpath = directory / META_FILE
    if not mpath.is_file():
        raise ExportError(f"{directory} is not a model export (no {META_FILE}); write one with ctrkit export")
    try:
        meta = json.loads(mpath.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ExportError(f"{mpath} cannot be read as JSON ({e}); {AGAIN}") from None
    if not isinstance(meta, dict) or meta.get("kind") != MARKER:
        raise ExportError(f"{mpath} is not a ctrkit export description (no \"kind\": {MARKER!r}); {AGAIN}")
    version = meta.get("version")
    if version != VERSION or isinstance(version, bool):
        older = isinstance(version, int) and not isinstance(version, bool) and 0 < version < VERSION
        raise ExportError(f"{mpath} has export version {version!r}; this ctrkit reads version {VERSION}" + (
            f" (version {version} exports carry no checksums to verify): {AGAIN}" if older else
            " (written by a newer ctrkit, or edited): upgrade ctrkit or " + AGAIN))
    if meta.get("digest") != meta_digest(meta):
        raise ExportError(f"{mpath} fails its checksum: it was edited or damaged after ctrkit export wrote it, "
                          f"so the export is refused; {AGAIN}")
    _check_entries(directory, meta, mpath)
    return meta


def _check_entries(directory: Path, meta: dict[str, Any], mpath: Path) -> None:
    """The entries a reader uses: their types, the paths inside ``directory``, the program files' checksums."""
    fmt, keys, nd = meta.get("format"), meta.get("sparse_keys"), meta.get("num_dense")
    if fmt not in FORMATS:
        raise ExportError(f"{mpath}: 'format' = {fmt!r} is not one of {FORMATS}; {AGAIN}")
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise ExportError(f"{mpath}: 'sparse_keys' = {keys!r} is not a list of feature names; {AGAIN}")
    if not isinstance(nd, int) or isinstance(nd, bool) or nd < 0:
        raise ExportError(f"{mpath}: 'num_dense' = {nd!r} is not a count of dense features; {AGAIN}")
    model = _inside(directory, meta.get("file"), "file", mpath)
    _inside(directory, meta.get("pipeline", PIPELINE_DIR), "pipeline", mpath)
    files = meta.get("files")
    if not isinstance(files, dict) or model.name not in files:
        raise ExportError(f"{mpath}: 'files' holds no checksum of the model file {model.name}; {AGAIN}")
    for name, want in files.items():
        path = _inside(directory, name, f"files.{name}", mpath)
        if not path.is_file():
            raise ExportError(f"{path} is missing: the export is incomplete; {AGAIN}")
        if file_checksum(path, full=True) != want:
            raise ExportError(f"{path} fails its checksum (export.json has {want!r}): the file was changed or "
                              f"damaged after the export, so it is refused; {AGAIN}")


class ExportedModel:
    """An export directory read back for scoring: ``model(dense, values, lengths)`` -> probabilities (B,) float32
    (numpy or CPU tensor inputs, see :mod:`ctrkit.serving.export`); ``score(batch)`` for a Batch; ``pipeline()``
    for the FeaturePipeline that turns raw rows into those inputs."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.meta: dict[str, Any] = read_meta(self.directory)
        self.sparse_keys: list[str] = list(self.meta["sparse_keys"])
        self.num_dense = int(self.meta["num_dense"])
        path = self.directory / self.meta["file"]
        try:
            self._run = program_runner(self.meta["format"], path)
        except ExportError:
            raise
        except Exception as e:  # noqa: BLE001 - torch.jit and onnxruntime raise many types for a bad program
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            raise ExportError(f"{path} cannot be loaded as a {self.meta['format']} program ({type(e).__name__}: "
                              f"{first}); {AGAIN}") from None

    def __call__(self, dense: Any, values: Any, lengths: Any) -> np.ndarray:
        dense = np.ascontiguousarray(dense, np.float32)
        dense = dense.reshape(-1, self.num_dense) if self.num_dense else dense.reshape(len(dense), 0)  # (B, I)
        values, lengths = np.ascontiguousarray(values, np.int64), np.ascontiguousarray(lengths, np.int64)
        F, B = len(self.sparse_keys), dense.shape[0]
        if lengths.shape != (F * B,) or values.shape != (int(lengths.sum()),):
            raise ExportError(f"{self.directory}: inputs must be dense (B, {self.num_dense}), lengths (F*B,) = "
                              f"({F}*{B},) and values (sum of lengths,); got lengths {lengths.shape}, values "
                              f"{values.shape}")
        return self._run(dense, values, lengths)

    def score(self, batch: Batch) -> np.ndarray:
        """Probabilities (B,) of a Batch as the pipeline makes it (``to_batch``: batch stage applied)."""
        kj = batch.sparse if batch.sparse.keys == self.sparse_keys else batch.sparse.select(self.sparse_keys)
        return self(batch.dense, kj.values, kj.lengths)

    def pipeline(self) -> FeaturePipeline:
        return load_pipeline(self.directory / self.meta.get("pipeline", PIPELINE_DIR))


def load_exported(out_dir: str | Path) -> ExportedModel:
    """Read an export written by :func:`ctrkit.serving.export.export_checkpoint` (checked: the module docstring)."""
    return ExportedModel(out_dir)
