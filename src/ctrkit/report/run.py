"""Reading a run directory for the report: ``summary.json``, ``metrics.jsonl``, ``config.yaml``,
``predictions.npz`` and the manifests of the stores it was trained on.

A run directory is what ``ctrkit train`` writes under ``run.dir/run.name``. What is missing or unreadable is
not an error as long as the run has ``summary.json`` or ``metrics.jsonl``: the report says what it could not
show (:attr:`Run.notes`). A directory with neither is not a run and raises :class:`JobError`.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from ctrkit.errors import JobError
from ctrkit.metrics import RANKING_METRIC

log = logging.getLogger(__name__)

SPLITS = ("train", "valid", "test")
WHAT_A_RUN_HOLDS = ("a run directory is what `ctrkit train` writes under run.dir/run.name: summary.json, "
                    "metrics.jsonl, config.yaml, best.pt")


@dataclass
class Run:
    """One run directory, read. ``train`` / ``evals``: the train and eval records of metrics.jsonl in order;
    ``predictions``: ``label``, ``score`` (and ``group``) of predictions.npz, or None; ``notes``: what could not
    be read, for the page."""

    path: Path
    summary: dict[str, Any]
    config: dict[str, Any]
    train: list[dict[str, Any]]
    evals: list[dict[str, Any]]
    predictions: dict[str, np.ndarray] | None
    notes: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def model(self) -> str:
        return str(self.summary.get("model") or (self.config.get("model") or {}).get("name") or "?")

    @property
    def task(self) -> str:
        """"ranking" or "retrieval" (from summary.json; else guessed from the eval records' metric names)."""
        if self.summary.get("task"):
            return str(self.summary["task"])
        names = {k for r in self.evals for k in r}
        return "retrieval" if any(RANKING_METRIC.match(k) for k in names) and "auc" not in names else "ranking"

    @property
    def steps_per_epoch(self) -> float | None:
        """Training steps per epoch (the summary's, else its steps / epochs), to put records on an epoch axis; None
        if unknown."""
        if isinstance(self.summary.get("steps_per_epoch"), int) and self.summary["steps_per_epoch"] > 0:
            return float(self.summary["steps_per_epoch"])
        steps, epochs = self.summary.get("steps"), self.summary.get("epochs")
        if isinstance(steps, (int, float)) and isinstance(epochs, (int, float)) and steps > 0 and epochs > 0:
            return float(steps) / float(epochs)
        return None

    @property
    def predictions_split(self) -> str:
        p = self.summary.get("predictions") or {}
        return str(p.get("split") or "test")

    def store_paths(self) -> dict[str, str]:
        """{split: store path} from summary.json's ``data``, else the config's ``data`` block."""
        data = self.summary.get("data") or self.config.get("data") or {}
        return {s: str(data[s]) for s in SPLITS if isinstance(data, dict) and data.get(s)}


def load_run(path: str | Path) -> Run:
    """Read the run directory ``path`` (see the module docstring)."""
    p = Path(path)
    if not p.exists():
        raise JobError(f"run directory {p} does not exist; {WHAT_A_RUN_HOLDS}")
    if not p.is_dir():
        raise JobError(f"{p} is a file, not a run directory; {WHAT_A_RUN_HOLDS}")
    if not (p / "summary.json").is_file() and not (p / "metrics.jsonl").is_file():
        raise JobError(f"{p} is not a ctrkit run directory (no summary.json or metrics.jsonl); {WHAT_A_RUN_HOLDS}")
    notes: list[str] = []
    summary = _read_json(p / "summary.json", notes)
    if not summary:
        notes.append("no summary.json: the run did not finish (or was written by an older ctrkit); the curves "
                     "come from metrics.jsonl alone")
    config = _read_config(p, summary, notes)
    train, evals = _read_records(p / "metrics.jsonl", notes)
    return Run(p, summary, config, train, evals, _read_predictions(p, summary, notes), notes)


def _read_json(path: Path, notes: list[str]) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        out = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise JobError(f"{path} is not valid JSON ({e}); delete it to report from metrics.jsonl alone, or "
                       "train again") from None
    if not isinstance(out, dict):
        raise JobError(f"{path} holds a JSON {type(out).__name__}, not the run summary object; delete it or "
                       "train again")
    return out


def _read_config(run_dir: Path, summary: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    path = run_dir / "config.yaml"
    if path.is_file():
        try:
            cfg = yaml.safe_load(path.read_text())
            if isinstance(cfg, dict):
                return cfg
            notes.append(f"{path.name} holds no mapping; the config shown is summary.json's")
        except yaml.YAMLError as e:
            notes.append(f"{path.name} is not valid YAML ({str(e).splitlines()[0]}); the config shown is "
                         "summary.json's")
    cfg = summary.get("config")
    return cfg if isinstance(cfg, dict) else {}


def _read_records(path: Path, notes: list[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train records, eval records) of metrics.jsonl; a line that is not a JSON object (a run killed while
    writing it) is skipped and noted."""
    train: list[dict[str, Any]] = []
    evals: list[dict[str, Any]] = []
    if not path.is_file():
        notes.append("no metrics.jsonl: no training curves")
        return train, evals
    bad: list[int] = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                bad.append(i)
                continue
            if not isinstance(rec, dict) or not isinstance(rec.get("step"), (int, float)):
                bad.append(i)
            elif rec.get("kind") == "eval":
                evals.append(rec)
            elif rec.get("kind") == "train":
                train.append(rec)
    if bad:
        notes.append(f"metrics.jsonl: skipped {len(bad)} unreadable line(s), first line {bad[0]}")
    return train, evals


def _read_predictions(run_dir: Path, summary: dict[str, Any], notes: list[str]) -> dict[str, np.ndarray] | None:
    info = summary.get("predictions")
    name = info.get("file", "predictions.npz") if isinstance(info, dict) else "predictions.npz"
    path = run_dir / name
    if not path.is_file():  # (a retrieval run writes none; a ranking run's page says it is missing)
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            out = {k: np.asarray(z[k]) for k in ("label", "score", "group") if k in z.files}
    except (OSError, ValueError) as e:
        notes.append(f"{name} cannot be read ({e}); no ROC, calibration or score plots")
        return None
    sizes = {k: v.shape for k, v in out.items()}
    if "label" not in out or "score" not in out or len({v.shape for v in out.values()}) != 1 \
            or out["score"].ndim != 1:
        notes.append(f"{name} does not hold equal-length 1-d arrays 'label' and 'score' ({sizes}); no ROC, "
                     "calibration or score plots")
        return None
    finite = np.isfinite(out["score"])
    if not finite.all():
        notes.append(f"{name}: {int((~finite).sum())} non-finite scores left out of the plots")
        out = {k: v[finite] for k, v in out.items()}
    return out


# ---- data statistics --------------------------------------------------------------------------------
def store_stats(path: str | Path) -> dict[str, Any]:
    """What the report shows of one store, from its manifest.json: ``rows``, ``label_rate``, ``bad_rows`` and
    ``input_rows`` (from the preprocessing statistics; the label rate read from the label column when the
    manifest has none) and ``schema`` (the manifest's schema dict). A store that is gone or unreadable gives
    ``{"error": why}`` instead."""
    p = Path(path)
    mpath = p / "manifest.json"
    if not mpath.is_file():
        why = "no longer exists" if not p.exists() else "is not a ctrkit store (no manifest.json)"
        return {"path": str(p), "error": f"{why}; its statistics cannot be shown"}
    try:
        m = json.loads(mpath.read_text())
        rows = int(m["num_rows"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        return {"path": str(p), "error": f"manifest.json cannot be read ({e})"}
    stats = m.get("stats") if isinstance(m.get("stats"), dict) else {}
    behaviour = stats.get("behaviour") if isinstance(stats.get("behaviour"), dict) else {}
    out: dict[str, Any] = {"path": str(p), "rows": rows, "schema": m.get("schema") or {},
                           "bad_rows": stats.get("bad_rows", behaviour.get("bad_rows")),
                           "input_rows": stats.get("input_rows", behaviour.get("rows_read")),
                           "first_bad_lines": stats.get("first_bad_lines", behaviour.get("first_bad_lines")) or []}
    rate = stats.get("label_rate", stats.get("positive_rate"))
    out["label_rate"] = float(rate) if isinstance(rate, (int, float)) else _label_rate(p, m)
    return out


def _label_rate(path: Path, manifest: dict[str, Any]) -> float | None:
    """Mean of the label column, read in chunks from its memory-mapped .npy (None when it cannot be read)."""
    try:
        col = next(c for c in manifest["columns"].values() if c.get("kind") == "label")
        arr = np.load(path / col["files"]["data"]["file"], mmap_mode="r")
        if arr.shape[0] == 0:
            return None
        step = 1 << 22
        return float(sum(float(np.sum(arr[i:i + step], dtype=np.float64)) for i in range(0, arr.shape[0], step))
                     / arr.shape[0])
    except (OSError, ValueError, KeyError, TypeError, StopIteration) as e:
        log.warning("%s: the label rate cannot be read from the label column (%s)", path, e)
        return None
