"""``ctrkit recall``: exact-index candidates equal a brute-force top-K, seen items excluded; cold-start sources;
clear errors for K, reused indexes of another checkpoint and ranking checkpoints."""

from __future__ import annotations

import csv
import json
import shutil

import numpy as np
import pytest
import torch
from conftest import write_log

from ctrkit.checkpoint import Checkpoint
from ctrkit.cli import main
from ctrkit.data.sources.behaviour import preprocess_behaviour
from ctrkit.data.storage.loader import BatchLoader
from ctrkit.data.storage.store import Store
from ctrkit.errors import JobError, RetrievalError, StoreError
from ctrkit.jobs.recall import raw_keys, recall, row_sources
from ctrkit.jobs.train import train_from_config
from ctrkit.retrieval.catalogue import ItemCatalogue, SeenItems
from ctrkit.training.config import load_config

pytest.importorskip("faiss")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = tmp_path_factory.mktemp("recall")
    write_log(d / "log.csv", n_users=80, n_items=40, per_user=8)
    out = preprocess_behaviour(d / "log.csv", d / "st", attr_cols=["cat:cate"], time_col="time", negatives="none",
                               embedding_dim=8)
    cfg = load_config(None, [f"data.train={out['train']}", f"data.valid={out['valid']}", f"data.test={out['test']}",
                             "model.name=two_tower", "model.params.out_dim=8", "model.params.dnn_hidden=[16]",
                             "train.epochs=1", "data.batch_size=32", f"run.dir={d}/runs", "run.name=tt",
                             "train.progress=false"])
    summary = train_from_config(cfg, progress=False)
    return d, out, d / "runs" / "tt" / "best.pt", summary


def test_evaluate_cli_ranks_like_training(trained, capsys):
    """`ctrkit evaluate` on a retrieval checkpoint: the full-ranking metrics training reported for test."""
    _, _out, ckpt_path, summary = trained
    assert main(["evaluate", "--checkpoint", str(ckpt_path)]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    got = dict(kv.split("=") for kv in line.split(": ", 1)[1].split())
    for k, v in summary["test"].items():
        assert float(got[k]) == pytest.approx(v, abs=1e-5)


def _read(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_exact_recall_equals_brute_force(trained, tmp_path):
    _, out, ckpt_path, _summary = trained
    assert main(["recall", "--checkpoint", str(ckpt_path), "--k", "7", "--out", str(tmp_path / "c.csv")]) == 0
    rows = _read(tmp_path / "c.csv")
    ckpt = Checkpoint.load(ckpt_path)
    model = ckpt.build_model()
    cat = ItemCatalogue.from_payload(ckpt.catalogue)
    seen = SeenItems.from_store(Store(out["train"]))
    batch = next(iter(BatchLoader(Store(out["test"]), 10_000, shuffle=False, prefetch=0)))
    with torch.no_grad():
        scores = model.encode_query(batch) @ model.encode_item(cat.batch()).t()  # (Q, N) brute force
    r, i = seen.pairs(batch.group_ids.numpy())
    hv, hl, _ = batch.sparse["hist_item"]
    r = np.concatenate([r, np.repeat(np.arange(len(batch)), hl.numpy())])
    i = np.concatenate([i, hv.numpy()])
    c = cat.rows_of(torch.from_numpy(i))
    scores[torch.from_numpy(r)[c >= 0], c[c >= 0]] = float("-inf")
    top = scores.topk(7, dim=1)
    pipe_items = {int(x): x for x in cat.ids}
    assert len(rows) == 7 * len(batch)

    item_keys = raw_keys(ckpt.feature_pipeline().vocabs_["item"], cat.ids[top.indices.numpy()].reshape(-1))
    got_items = [row["item"] for row in rows]
    got_scores = np.array([float(row["score"]) for row in rows])
    np.testing.assert_allclose(got_scores, top.values.numpy().reshape(-1), atol=1e-5)
    ties = np.isclose(np.diff(top.values.numpy(), axis=1), 0, atol=1e-6).any()
    if not ties:
        assert got_items == list(item_keys)
    assert {row["source"] for row in rows} == {"model"} and pipe_items


def test_row_sources_cold_start(trained):
    _, out, ckpt_path, _summary = trained
    ckpt = Checkpoint.load(ckpt_path)
    model, schema = ckpt.build_model(), ckpt.schema
    batch = next(iter(BatchLoader(Store(out["test"]), 4, shuffle=False, prefetch=0)))
    assert row_sources(model, schema, batch).tolist() == [0, 0, 0, 0]
    kj = batch.sparse
    per_key = {}
    for k in kj.keys:
        v, ln, _ = kj[k]
        if k == "user":
            v = torch.tensor([1, 1, 5, 0])  # unknown, unknown, known, missing
        if k.startswith("hist_"):  # rows 1 and 3: no history
            keep = torch.repeat_interleave(torch.arange(4), ln)
            m = (keep != 1) & (keep != 3)
            v, ln = v[m], ln * torch.tensor([1, 0, 1, 0])
        per_key[k] = (v, ln)
    from ctrkit.batch import Batch, KeyedJagged

    b = Batch(batch.dense, KeyedJagged.from_per_key(per_key), batch.labels, group_ids=batch.group_ids)
    assert row_sources(model, schema, b).tolist() == [1, 2, 0, 2]


def test_recall_errors(trained, tmp_path):
    _, out, ckpt_path, _summary = trained
    with pytest.raises(JobError, match="larger than the .* items"):
        recall(ckpt_path, None, tmp_path / "a.csv", k=10_000)
    recall(ckpt_path, None, tmp_path / "a.csv", k=3, index_kind="hnsw", index_path=tmp_path / "idx")
    with pytest.raises(JobError, match="already exists"):
        recall(ckpt_path, None, tmp_path / "a.csv", k=3)
    other = tmp_path / "other.pt"  # another checkpoint (its bytes differ): the saved index is refused
    ck = Checkpoint.load(ckpt_path)
    ck.weights = {k: v + 1 if v.is_floating_point() else v for k, v in ck.weights.items()}
    ck.save(other)  # a sound checkpoint of other weights
    with pytest.raises(RetrievalError, match="rebuild it"):
        recall(other, None, tmp_path / "b.csv", k=3, index_path=tmp_path / "idx")
    shutil.copy(ckpt_path, tmp_path / "same.pt")  # the same bytes: reused
    recall(tmp_path / "same.pt", None, tmp_path / "c.csv", k=3, index_path=tmp_path / "idx")
    assert len(_read(tmp_path / "c.csv")) == 3 * Store(out["test"]).num_rows


def test_popular_fallback_rows(trained, tmp_path, monkeypatch):
    """Rows served from the popular items: the most frequent training items minus the user's seen ones."""
    import ctrkit.jobs.recall as rc

    _, out, ckpt_path, _ = trained
    monkeypatch.setattr(rc, "row_sources", lambda model, schema, batch: np.array([2, 1] + [0] * (len(batch) - 2)))
    rc.recall(ckpt_path, None, tmp_path / "p.csv", k=4)
    rows = _read(tmp_path / "p.csv")
    assert [r["source"] for r in rows[:8]] == ["popular"] * 4 + ["cold_start_features"] * 4
    ckpt = Checkpoint.load(ckpt_path)
    cat = ItemCatalogue.from_payload(ckpt.catalogue)

    batch = next(iter(BatchLoader(Store(out["test"]), 1, shuffle=False, prefetch=0)))
    _, seen_items = SeenItems.from_store(Store(out["train"])).pairs(batch.group_ids.numpy())
    seen = set(seen_items.tolist()) | set(batch.sparse["hist_item"][0].tolist())
    popular = [int(i) for i in cat.ids[np.argsort(-cat.counts, kind="stable")] if int(i) not in seen][:4]
    keys = raw_keys(ckpt.feature_pipeline().vocabs_["item"], np.array(popular))
    assert [r["item"] for r in rows[:4]] == list(keys)
    assert all(r["score"] == "nan" for r in rows[:4])


def test_recall_batches_default_to_what_the_run_evaluated_with(trained, tmp_path, monkeypatch):
    import ctrkit.jobs.recall as job

    _, _out, ckpt_path, _summary = trained
    sizes = []

    def loader(store, batch_size, **kw):
        sizes.append(batch_size)
        return BatchLoader(store, batch_size, **kw)

    monkeypatch.setattr(job, "BatchLoader", loader)
    assert main(["recall", "--checkpoint", str(ckpt_path), "--k", "3", "--out", str(tmp_path / "a.csv")]) == 0
    assert main(["recall", "--checkpoint", str(ckpt_path), "--k", "3", "--out", str(tmp_path / "b.csv"),
                 "--batch-size", "7"]) == 0
    assert sizes == [4 * 32, 7]  # data.batch_size=32, no data.eval_batch_size


@pytest.fixture(scope="module")
def held_out_users(tmp_path_factory):
    """A log where 20 of 70 users have 3 behaviours: their samples all go to valid / test (no train row)."""
    d = tmp_path_factory.mktemp("recall_unknown")
    rng = np.random.default_rng(1)
    lines = ["user,item,cat,time"]
    for u in range(70):
        for t, i in enumerate(rng.choice(30, 8 if u < 50 else 3, replace=False)):
            lines.append(f"user{u:03d},i{i},c{i % 4},{1000 * u + t}")
    (d / "log.csv").write_text("\n".join(lines) + "\n")
    out = preprocess_behaviour(d / "log.csv", d / "st", attr_cols=["cat:cate"], time_col="time", negatives="none",
                               embedding_dim=8)
    cfg = load_config(None, [f"data.train={out['train']}", f"data.valid={out['valid']}", f"data.test={out['test']}",
                             "model.name=two_tower", "model.params.out_dim=8", "model.params.dnn_hidden=[16]",
                             "train.epochs=1", "data.batch_size=32", f"run.dir={d}/runs", "run.name=tt",
                             "train.progress=false"])
    train_from_config(cfg, progress=False)
    return d, out


def test_recall_names_users_without_train_rows_and_writes_lf(held_out_users, tmp_path):
    """`ctrkit recall` wrote <unknown> for every user it had not seen in training (17,700 lines on one set) and
    CRLF line ends (issue 27, 7)."""
    d, _ = held_out_users
    report = json.loads((d / "st" / "report.json").read_text())
    assert report["users_without_train_rows"] == {"valid": 20, "test": 20}
    assert main(["recall", "--checkpoint", str(d / "runs/tt/best.pt"), "--k", "3", "--out",
                 str(tmp_path / "c.csv")]) == 0
    raw = (tmp_path / "c.csv").read_bytes()
    assert b"\r" not in raw and raw.endswith(b"\n")
    rows = _read(tmp_path / "c.csv")
    users = {r["user"] for r in rows}
    assert users == {f"user{u:03d}" for u in range(70)}  # every test user by its key, none <unknown>
    cold = {r["user"] for r in rows if r["source"] != "model"}
    assert cold == {f"user{u:03d}" for u in range(50, 70)}  # the held-out users are still served as unknown


def test_a_ranking_store_given_to_recall_names_the_features(trained, tmp_path, caplog):
    """A Criteo (ranking) store as --data ended in "KeyedJagged has no key 'hist_item'" (issue 27, 6)."""
    import logging

    from ctrkit.data.sources.criteo import preprocess_criteo
    from ctrkit.jobs.demo import SAMPLE

    _, _, ckpt_path, _ = trained
    st = preprocess_criteo(SAMPLE, tmp_path / "criteo", min_freq=8, embedding_dim=8)
    with caplog.at_level(logging.ERROR, logger="ctrkit"):
        rc = main(["recall", "--checkpoint", str(ckpt_path), "--data", str(st["test"]), "--k", "3", "--out",
                   str(tmp_path / "c.csv")])
    assert rc == 2 and len(caplog.records) == 1
    assert "has other features than checkpoint" in caplog.text and "missing from the store: user, item" in caplog.text
    assert not (tmp_path / "c.csv").exists()


def test_recall_refuses_a_store_of_other_vocabularies(trained, tmp_path):
    """Query rows preprocessed on their own (not with --vocab-from): their ids name other users and items, so
    `ctrkit recall --data` is refused as `ctrkit evaluate` refuses it, and nothing is written (issue 27, 3)."""
    _, _out, ckpt_path, _summary = trained
    write_log(tmp_path / "log.csv", n_users=60, n_items=40, per_user=8, seed=7)
    other = preprocess_behaviour(tmp_path / "log.csv", tmp_path / "st", attr_cols=["cat:cate"], time_col="time",
                                 negatives="none", embedding_dim=8)
    args = ["recall", "--checkpoint", str(ckpt_path), "--data", str(other["test"]), "--k", "3",
            "--out", str(tmp_path / "c.csv")]
    with pytest.raises(StoreError, match="--data: .* other vocabularies .*--vocab-from"):
        recall(ckpt_path, other["test"], tmp_path / "c.csv", k=3)
    assert main(args) == 2
    assert not (tmp_path / "c.csv").exists()
