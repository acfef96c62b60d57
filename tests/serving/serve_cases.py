"""What the server tests share: raw Criteo rows as JSON objects and a small DLRM trained on a store."""

from __future__ import annotations

import gzip
from pathlib import Path

from ctrkit.cli import main
from ctrkit.jobs.demo import SAMPLE


def sample_rows(n: int, start: int = 0) -> list[dict]:
    """Raw Criteo rows as JSON objects: label, I1..I13 integers (None if empty), C1..C26 hex keys (None)."""
    rows = []
    with gzip.open(SAMPLE, "rt") as f:
        for k, line in enumerate(f):
            if k < start:
                continue
            if len(rows) == n:
                break
            v = line.rstrip("\n").split("\t")
            row = {"label": int(v[0])}
            row.update({f"I{i}": int(v[i]) if v[i] else None for i in range(1, 14)})
            row.update({f"C{i}": v[13 + i] or None for i in range(1, 27)})
            rows.append(row)
    return rows


def train(d: Path, train_store: Path, valid_store: Path) -> Path:
    assert main(["train", "--config", "configs/criteo/dlrm.yaml", "--quiet", f"--data.train={train_store}",
                 f"--data.valid={valid_store}", "--data.test=", f"--run.dir={d / 'runs'}", "--run.name=r",
                 "--train.epochs=1", "--model.params.dense_arch=[8]", "--model.params.over_arch=[8]"]) == 0
    return d / "runs/r/best.pt"
