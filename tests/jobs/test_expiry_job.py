"""Expiry end to end on two Criteo-sample "days": day 1 grown from day 0 with ``--expire-after 1`` (every value of
day 0 absent from day 1 evicted, its id reused), ``ctrkit train --warm-start`` onto it resets the rows of those ids
and keeps the others, and the warm-started checkpoint served by the Predictor (raw values encoded with the
checkpoint's pipeline) scores a row holding an evicted value exactly as the row holding a value never seen."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import torch

from ctrkit.checkpoint import Checkpoint
from ctrkit.cli import main
from ctrkit.data.sources.criteo import SPARSE_NAMES
from ctrkit.data.storage.fitted import fitted_at
from ctrkit.jobs.demo import SAMPLE
from ctrkit.serving.predictor import Predictor

NEVER = "0badf00d"  # a Criteo key in neither day


def _dicts(lines: list[str]) -> list[dict]:
    out = []
    for ln in lines:
        f = ln.split("\t")
        out.append({**{f"I{i}": int(f[i]) if f[i] else None for i in range(1, 14)},
                    **{f"C{j}": f[13 + j] for j in range(1, 27)}})
    return out


def test_warm_start_onto_an_expired_day_resets_its_rows_and_serves_evicted_values_as_rare(tmp_path: Path, capsys):
    with gzip.open(SAMPLE, "rt") as f:
        lines = f.read().splitlines()
    (tmp_path / "day0.tsv").write_text("\n".join(lines[:4000]) + "\n")
    (tmp_path / "day1.tsv").write_text("\n".join(lines[4000:8000]) + "\n")
    pre = ["preprocess", "criteo", "--split", "0.9,0.1,0", "--min-freq", "4", "--embedding-dim", "8"]
    assert main([*pre, str(tmp_path / "day0.tsv"), "--out", str(tmp_path / "d0")]) == 0
    assert main([*pre, str(tmp_path / "day1.tsv"), "--out", str(tmp_path / "d1"), "--vocab-from",
                 str(tmp_path / "d0" / "train"), "--grow", "--expire-after", "1"]) == 0
    train = ["train", "--config", "configs/criteo/deepfm.yaml", "--quiet", "--data.test=null",
             f"--run.dir={tmp_path / 'runs'}", "--data.batch_size=512"]
    assert main([*train, f"--data.train={tmp_path / 'd0' / 'train'}", f"--data.valid={tmp_path / 'd0' / 'valid'}",
                 "--run.name=day0", "--train.epochs=1"]) == 0
    day0 = tmp_path / "runs" / "day0" / "last.pt"
    rc = main([*train, f"--data.train={tmp_path / 'd1' / 'train'}", f"--data.valid={tmp_path / 'd1' / 'valid'}",
               "--run.name=day1", "--warm-start", str(day0), "--train.max_steps=1", "--train.lr=1e-12",
               "--train.embedding_lr=1e-12"])
    assert rc == 0, capsys.readouterr().err
    old, new = Checkpoint.load(day0), Checkpoint.load(tmp_path / "runs" / "day1" / "last.pt")
    v0, v1 = fitted_at(tmp_path / "d0" / "train").vocabs_, fitted_at(tmp_path / "d1" / "train").vocabs_
    n_reset = 0
    for c in SPARSE_NAMES:  # rows of reset ids start afresh; the others are the checkpoint's (lr 1e-12)
        reset = torch.as_tensor(v1[c].reset if v1[c].reset is not None else np.zeros(0, np.int64))
        for key in [k for k in old.weights if k.endswith(f"tables.{c}")]:  # the deep and the first-order tables
            w0, w1 = old.weights[key], new.weights[key]
            keep = torch.as_tensor(np.setdiff1d(np.arange(w0.shape[0]), reset.numpy()))
            torch.testing.assert_close(w1[keep], w0[keep], rtol=0, atol=1e-6)
            if len(reset):
                assert (w1[reset] - w0[reset]).abs().amax(1).min() > 0, key  # every reset row changed
        n_reset += len(reset)
    assert n_reset > 50  # (89 on these days)

    p = Predictor.from_checkpoint(tmp_path / "runs" / "day1" / "last.pt")
    for c in SPARSE_NAMES:  # the checkpoint's pipeline holds the store's ids (reused ones included) and records
        served = p.pipeline.vocabs_[c]
        for part in ("keys", "ids", "last_seen", "reset"):
            np.testing.assert_array_equal(getattr(served, part), getattr(v1[c], part), err_msg=f"{c} {part}")
    rows = _dicts(lines[:4000])
    evicted = []  # (row, column) holding a day-0 value that day 1 evicted
    for c in SPARSE_NAMES:
        assert v1[c].lookup(np.array([int(NEVER, 16)]))[0] == 1
        gone = set(v0[c].keys.tolist()) - set(v1[c].keys.tolist())
        evicted += [(i, c) for i, r in enumerate(rows) if r[c] and int(r[c], 16) in gone][:3]
    assert len(evicted) > 20
    as_is = [rows[i] for i, _ in evicted]
    never = [{**rows[i], c: NEVER} for i, c in evicted]
    known = [{**rows[i], c: format(int(v1[c].keys[0]), "x")} for i, c in evicted]  # a value day 1 kept
    ids = p.pipeline.transform(as_is)
    assert [int(ids[c][k]) for k, (_, c) in enumerate(evicted)] == [1] * len(evicted)  # encoded as rare
    s_as_is, s_never, s_known = p.predict(as_is), p.predict(never), p.predict(known)
    np.testing.assert_array_equal(s_as_is, s_never)  # an evicted value is a rare value, served
    assert np.abs(s_as_is - s_known).max() > 1e-4  # (the column matters: a kept value scores otherwise)
    lineage = json.loads((tmp_path / "d1" / "train" / "manifest.json").read_text())["preprocessing"]["vocab_lineage"]
    assert lineage["expire_after"] == 1 and sum(t["reset"] for t in lineage["tables"].values()) == n_reset
