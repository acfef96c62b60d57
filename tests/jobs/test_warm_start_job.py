"""`ctrkit train --warm-start CHECKPOINT` end to end on Criteo-sample stores with real vocabularies: a store whose
vocabularies are grown versions of the checkpoint's (every table given new keys, known ids unchanged) warm-starts,
and its first evaluation, one step at a negligible learning rate later, is the checkpoint's AUC on the same rows; a
renumbered vocabulary, --resume with --warm-start, and another model are refused with one line (exit 2); --resume
onto a grown vocabulary points to --warm-start."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from ctrkit.checkpoint import Checkpoint
from ctrkit.cli import main
from ctrkit.data.pipeline.persist import load_pipeline, save_pipeline
from ctrkit.data.pipeline.vocab_arrays import with_keys
from ctrkit.data.sources.criteo import preprocess_criteo
from ctrkit.data.storage.store import Store
from ctrkit.jobs.demo import SAMPLE
from ctrkit.jobs.scoring import evaluate_store


def grown_copy(store: Path, out: Path, renumber: bool = False) -> Path:
    """``store`` with every vocabulary given 1 + (table index % 4) new keys after its own (its rows unchanged: only
    known ids), the schema's sizes to match; ``renumber``: C1's first two keys swap ids instead."""
    shutil.copytree(store, out)
    p = load_pipeline(out / "pipeline")
    for i, (name, v) in enumerate(p.vocabs_.items()):
        if name.startswith("C"):
            new = np.arange(1 + i % 4) + int(v.keys.max()) + 1
            p.vocabs_[name] = with_keys(v, new)
    if renumber:
        v = p.vocabs_["C1"]
        v.keys[[0, 1]] = v.keys[[1, 0]]
    p._fingerprint = None  # computed anew from the grown vocabularies
    shutil.rmtree(out / "pipeline")
    save_pipeline(p, out / "pipeline")
    manifest = json.loads((out / "manifest.json").read_text())
    for f in manifest["schema"]["sparse"]:
        f["vocab_size"] = p.vocabs_[f["name"]].size
    (out / "manifest.json").write_text(json.dumps(manifest))
    (out / ".verified.json").unlink(missing_ok=True)
    return out


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    d = tmp_path_factory.mktemp("warm")
    st = preprocess_criteo(SAMPLE, d / "criteo", split="0.8,0.1,0.1", seed=0, min_freq=8, embedding_dim=8,
                           progress=False)
    rc = main(["train", "--config", "configs/criteo/deepfm.yaml", "--quiet", f"--data.train={st['train']}",
               f"--data.valid={st['valid']}", "--data.test=null", f"--run.dir={d / 'runs'}", "--run.name=day1", "--train.epochs=1",
               "--data.batch_size=512"])
    assert rc == 0
    return d, st, d / "runs" / "day1" / "last.pt"


def test_a_grown_store_warm_starts_and_scores_known_rows_as_the_checkpoint(first, capsys):
    d, st, ckpt = first
    train, valid = grown_copy(st["train"], d / "g_train"), grown_copy(st["valid"], d / "g_valid")
    old = Checkpoint.load(ckpt)
    before = evaluate_store(old.build_model(), Store(st["valid"]), old.feature_pipeline())  # on the old valid rows
    rc = main(["train", "--config", "configs/criteo/deepfm.yaml", "--quiet", f"--data.train={train}",
               f"--data.valid={valid}", "--data.test=null", f"--run.dir={d / 'runs'}", "--run.name=day2", "--warm-start", str(ckpt),
               "--train.max_steps=1", "--train.lr=1e-12", "--train.embedding_lr=1e-12", "--data.batch_size=512"])
    assert rc == 0, capsys.readouterr().err
    summary = json.loads((d / "runs" / "day2" / "summary.json").read_text())
    assert summary["config"]["train"]["warm_start"] == str(ckpt)
    auc = summary["best"]["valid"]["auc"]
    print(f"checkpoint valid AUC {before['auc']:.6f}; warm-started run after one step at lr 1e-12: {auc:.6f}")
    assert auc == pytest.approx(before["auc"], abs=1e-6)
    assert auc > 0.6  # the trained model, not a fresh one (a fresh one scores ~0.5)


def test_a_renumbered_vocabulary_resume_together_and_another_model_are_refused(first, caplog):
    d, st, ckpt = first
    train = grown_copy(st["train"], d / "r_train", renumber=True)
    base = ["train", "--config", "configs/criteo/deepfm.yaml", "--quiet", f"--run.dir={d / 'runs'}", "--data.test=null",
            "--data.valid=null", "--run.name=bad", "--train.epochs=1"]
    assert main([*base, f"--data.train={train}", "--warm-start", str(ckpt)]) == 2
    err = caplog.text
    assert "table 'C1': 2 of its" in err and "known values have other ids" in err, err
    assert f"--vocab-from {st['train']} --grow" in err, err  # the checkpoint's training store, named
    grown = grown_copy(st["train"], d / "g2_train")
    assert main([*base, f"--data.train={grown}", "--warm-start", str(ckpt), "--resume", str(ckpt)]) == 2
    assert "both say where the run starts" in caplog.text
    assert main([*base, f"--data.train={grown}", "--warm-start", str(ckpt), "--model.name=dcn"]) == 2
    assert "is a checkpoint of model 'deepfm', and this run trains 'dcn'" in caplog.text
    assert main([*base, f"--data.train={grown}", "--resume", str(ckpt)]) == 2
    assert f"start a new run with --warm-start {ckpt}" in caplog.text
