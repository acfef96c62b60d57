"""FeaturePipeline: fit / transform / to_batch against naive Python, streaming fit, persistence, fingerprints."""

from __future__ import annotations

import gzip
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch

from ctrkit.checkpoint import Checkpoint
from ctrkit.data.pipeline.feature_pipeline import DENSE_NAMES, SPARSE_NAMES, FeaturePipeline
from ctrkit.data.pipeline.multihot import MultiHot
from ctrkit.data.pipeline.persist import from_payload, load_pipeline, save_pipeline, to_payload
from ctrkit.data.pipeline.vocab import save_vocabularies
from ctrkit.data.sources.criteo import preprocess_criteo
from ctrkit.data.storage.fitted import pipeline_from_store, store_vocab_fingerprint
from ctrkit.data.storage.store import Store
from ctrkit.errors import DataError, NotFittedError

BUNDLED = Path(__file__).resolve().parents[2] / "examples" / "data" / "criteo_sample.tsv.gz"
SPEC = {
    "label": {"column": "rating", "threshold": 4}, "weight": "w", "group_id": "g",
    "dense": [{"name": "x", "transform": "standardize"}, {"name": "xl", "column": "x", "transform": "log"},
              {"name": "n", "transform": "none"}],
    "sparse": [{"name": "u", "embedding_dim": 4}, {"name": "c", "table": "shared", "embedding_dim": 4},
               {"name": "c2", "table": "shared", "embedding_dim": 4},
               {"name": "tags", "multi_valued": True, "delimiter": ";", "embedding_dim": 4}],
    "sequence": [{"name": "hist", "shares": "u", "max_len": 2}],
}


def make_rows(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        rows.append({
            "rating": int(rng.integers(1, 6)), "w": None if i % 7 == 0 else float(rng.integers(1, 4)),
            "g": f"g{rng.integers(0, 5)}", "x": None if i % 5 == 0 else float(rng.normal(3, 2)),
            "n": int(rng.integers(-5, 5)), "u": "" if i % 11 == 0 else f"u{rng.integers(0, 30)}",
            "c": f"v{rng.integers(0, 8)}", "c2": f"v{rng.integers(4, 12)}",
            "tags": ";".join(f"t{k}" for k in rng.integers(0, 6, rng.integers(0, 4))),
            "hist": "|".join(f"u{k}" for k in rng.integers(0, 40, rng.integers(0, 5))),
        })
    return rows


def naive(rows: list[dict], fit_rows: list[dict]) -> dict:
    """Per-row Python reference of the spec's rules, vocabularies fitted on ``fit_rows``."""
    def first_ids(values):
        ids: dict[str, int] = {}
        for v in values:
            if v and v not in ids:
                ids[v] = len(ids) + 2
        return ids

    u = first_ids([r["u"] for r in fit_rows] + [t for r in fit_rows for t in r["hist"].split("|")])
    shared = first_ids([r["c"] for r in fit_rows] + [r["c2"] for r in fit_rows])
    tags = first_ids([t for r in fit_rows for t in r["tags"].split(";")])
    groups = first_ids([r["g"] for r in fit_rows])
    xs = [r["x"] or 0.0 for r in fit_rows]
    mean = sum(xs) / len(xs)
    std = math.sqrt(sum(x * x for x in xs) / len(xs) - mean ** 2)
    out: dict = {k: [] for k in ("label", "weight", "group", "x", "xl", "n", "u", "c", "c2", "tags", "hist")}
    for r in rows:
        x = r["x"] or 0.0
        out["label"].append(float(r["rating"] >= 4))
        out["weight"].append(1.0 if r["w"] is None else r["w"])
        out["group"].append(groups.get(r["g"], 1))
        out["x"].append((x - mean) / std)
        out["xl"].append(-2.0 if x + 3 <= math.exp(-2) else math.log(x + 3))
        out["n"].append(float(r["n"]))
        out["u"].append(u.get(r["u"], 1) if r["u"] else 0)
        out["c"].append(shared.get(r["c"], 1))
        out["c2"].append(shared.get(r["c2"], 1))
        out["tags"].append([tags.get(t, 1) for t in r["tags"].split(";") if t])
        out["hist"].append([u.get(t, 1) for t in r["hist"].split("|") if t][-2:])
    return out


def jagged_rows(col) -> list[list[int]]:
    v, ln = col
    ends = np.cumsum(ln)
    return [v[e - k:e].tolist() for e, k in zip(ends, ln)]


def check_columns(got: dict, want: dict) -> None:
    for k in ("label", "weight", "x", "xl", "n"):
        np.testing.assert_allclose(got[k], np.float32(want[k]), rtol=1e-6, atol=1e-6, err_msg=k)
    for k in ("group", "u", "c", "c2"):
        assert got[k].tolist() == want[k], k
    assert jagged_rows(got["tags"]) == want["tags"] and jagged_rows(got["hist"]) == want["hist"]


def assert_same_columns(got: dict, want: dict) -> None:
    """Equal transform outputs: arrays, and (values, lengths) pairs for jagged columns."""
    assert set(got) == set(want)
    for k, v in want.items():
        if isinstance(v, tuple):
            assert all(np.array_equal(a, b) for a, b in zip(got[k], v)), k
        else:
            np.testing.assert_array_equal(got[k], v, err_msg=k)


def test_fit_transform_matches_naive_rules() -> None:
    rows = make_rows(300)
    pipe = FeaturePipeline.table(SPEC).fit(rows)
    check_columns(pipe.transform(rows), naive(rows, rows))
    new = make_rows(50, seed=1)  # unseen values -> 1, statistics of the fit rows
    check_columns(pipe.transform(new), naive(new, rows))
    s = pipe.schema
    assert s.feature("c").vocab_size == s.feature("c2").vocab_size == 2 + 12 and s.tables()["shared"].features == (
        "c", "c2")
    assert s.weight == "weight" and s.group_id == "group" and s.feature("hist").max_len == 2


def test_rows_without_label_weight_group_transform_and_batch() -> None:
    rows = make_rows(40)
    pipe = FeaturePipeline.table(SPEC).fit(rows)
    bare = [{k: v for k, v in r.items() if k not in ("rating", "w", "g")} for r in rows]
    got, full = pipe.transform(bare), pipe.transform(rows)
    assert "label" not in got and "weight" not in got and "group" not in got
    for k in ("x", "u", "c"):
        np.testing.assert_array_equal(got[k], full[k])
    b = pipe.to_batch(got)
    assert torch.equal(b.labels, torch.zeros(40)) and b.weights is None and b.group_ids is None
    assert torch.equal(b.dense, pipe.to_batch(full).dense)


def test_inputs_arrow_dicts_and_columns_agree() -> None:
    rows = make_rows(60)
    pipe = FeaturePipeline.table(SPEC).fit(rows)
    want = pipe.transform(rows)
    table = pa.Table.from_pylist(rows)
    for raw in (table, {c: table.column(c) for c in table.column_names}, table.to_batches()[0]):
        assert_same_columns(pipe.transform(raw), want)


def test_streaming_fit_equals_one_chunk() -> None:
    # one column per vocabulary: first appearance over chunks is first appearance over all rows (with
    # several columns per table the order is "feed order": chunk by chunk, column by column)
    spec = {**SPEC, "sparse": [e for e in SPEC["sparse"] if e["name"] != "c2"], "sequence": []}
    rows = make_rows(500)
    whole = FeaturePipeline.table(spec, min_freq=2).fit(rows)
    pipe = FeaturePipeline.table(spec, min_freq=2)
    fitter = pipe.fitter()
    parts = []
    for i in range(0, 500, 77):
        enc = fitter.encode(rows[i:i + 77])
        fitter.add_dense_stats(enc.dense)
        parts.append(enc.parts())
    fitter.finish()
    want = whole.transform(rows)
    got = [pipe.finalize(p, fitter.luts) for p in parts]
    for k, v in want.items():
        if isinstance(v, tuple):
            assert [r for g in got for r in jagged_rows(g[k])] == jagged_rows(v), k
        else:
            np.testing.assert_allclose(np.concatenate([g[k] for g in got]), v, rtol=1e-6, err_msg=k)
    assert pipe.vocab_fingerprint() == whole.vocab_fingerprint()


def test_to_batch_layout_and_multi_hot_stage() -> None:
    rows = make_rows(30)
    pipe = FeaturePipeline.table(SPEC).fit(rows)
    cols = pipe.transform(rows)
    b = pipe.to_batch(cols)
    want_vals, want_lens = [], []
    for key in ("u", "c", "c2", "tags", "hist"):  # key-major, as the schema orders the keys
        per_row = jagged_rows(cols[key]) if isinstance(cols[key], tuple) else [[int(i)] for i in cols[key]]
        want_vals += [i for r in per_row for i in r]
        want_lens += [len(r) for r in per_row]
    assert b.sparse.keys == ["u", "c", "c2", "tags", "hist"]
    assert b.sparse.values.tolist() == want_vals and b.sparse.lengths.tolist() == want_lens
    assert torch.equal(b.dense[:, 0], torch.from_numpy(cols["x"])) and torch.equal(b.labels, torch.from_numpy(cols["label"]))
    mh = pipe.with_multi_hot(3, min_table_size=10)
    assert pipe.batch_stage is None and mh.vocabs_ is pipe.vocabs_
    ref = MultiHot.from_schema(pipe.schema, 3, 10)(b.sparse)
    got = mh.to_batch(cols).sparse
    assert torch.equal(got.values, ref.values) and torch.equal(got.lengths, ref.lengths)
    assert got.lengths_2d()[0].tolist() == [3] * 30  # table u has >= 10 rows: expanded


def test_malformed_rows_name_the_row_and_columns_are_checked() -> None:
    rows = make_rows(10)
    pipe = FeaturePipeline.table(SPEC).fit(rows)
    with pytest.raises(DataError, match=r"row 3: dense 'x' is not a number"):
        pipe.transform(rows[:2] + [{**rows[2], "x": "abc"}])
    with pytest.raises(DataError, match=r"lack the columns \['u'\]"):
        pipe.transform([{k: v for k, v in r.items() if k != "u"} for r in rows])
    with pytest.raises(NotFittedError):
        FeaturePipeline.table(SPEC).transform(rows)
    with pytest.raises(DataError, match="shares 'nope'"):
        FeaturePipeline.table({"label": "y", "sparse": ["a"], "sequence": [{"name": "h", "shares": "nope",
                                                                            "max_len": 3}]})


def test_save_load_and_checkpoint_payload_round_trip(tmp_path: Path) -> None:
    rows = make_rows(200)
    rows[3]["c"] = "é ünïcode"
    pipe = FeaturePipeline.table(SPEC, max_vocab=12, max_vocab_mode="hash").fit(rows).with_multi_hot(2, 5)
    want = pipe.transform(rows)
    d = save_pipeline(pipe, tmp_path / "p")
    assert {f.suffix for f in d.iterdir()} == {".json", ".npy"}
    for f in d.glob("*.npy"):  # plain numeric arrays: readable without pickle
        assert np.load(f, allow_pickle=False).dtype.kind in "iuf"
    ckpt = Checkpoint.of(torch.nn.Linear(1, 1), model_name="x", pipeline=to_payload(pipe)).save(tmp_path / "c.pt")
    raw = torch.load(ckpt, weights_only=True)  # nothing but plain data inside
    assert raw["pipeline"]["meta"]["multi_hot"]["size"] == 2
    for other in (load_pipeline(d), from_payload(Checkpoint.load(ckpt).pipeline)):
        assert_same_columns(other.transform(rows), want)
        assert other.vocab_fingerprint() == pipe.vocab_fingerprint()
        assert other.schema == pipe.schema and other.batch_stage.fingerprint() == pipe.batch_stage.fingerprint()
    meta = json.loads((d / "pipeline.json").read_text())
    meta["multi_hot"]["fingerprint"] = "sha256:0"
    (d / "pipeline.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match="multi-hot tables rebuilt"):
        load_pipeline(d).to_batch(want)


def criteo_lines(n: int) -> list[str]:
    with gzip.open(BUNDLED, "rt") as f:
        return f.read().splitlines()[:n]


def test_criteo_pipeline_of_a_store_maps_raw_text_like_preprocessing(tmp_path: Path) -> None:
    lines = criteo_lines(600)
    src = tmp_path / "s.tsv"
    src.write_text("\n".join(lines) + "\n")
    store = preprocess_criteo(src, tmp_path / "o", split="1,0", shuffle=False, min_freq=2, progress=False)["train"]
    s = Store(store)
    pipe = load_pipeline(store)
    assert pipe.kind == "criteo" and pipe.schema == s.schema
    names = ["label", *DENSE_NAMES, *SPARSE_NAMES]
    rows = [dict(zip(names, ln.split("\t"))) for ln in lines]  # raw text: hex keys, integer strings
    got = pipe.transform(rows)
    for c in ("label", *DENSE_NAMES, *SPARSE_NAMES):
        np.testing.assert_array_equal(got[c], np.asarray(s[c]), err_msg=c)
    # the same pipeline, rebuilt from the manifest and vocab/ of a store written before pipelines existed
    save_vocabularies(Path(store) / "vocab", pipe.vocabs_)
    shutil.rmtree(Path(store) / "pipeline")
    old = pipeline_from_store(store)
    np.testing.assert_array_equal(old.transform(rows)["C5"], np.asarray(s["C5"]))
    assert old.vocab_fingerprint() == pipe.vocab_fingerprint()
    with pytest.raises(DataError, match=r"row 2: categorical 'C1' is not empty or 8 hex digits"):
        pipe.transform([rows[0], {**rows[1], "C1": "xyz"}])


def test_vocab_fingerprints_of_stores(tmp_path: Path) -> None:
    src = tmp_path / "s.tsv"
    src.write_text("\n".join(criteo_lines(800)) + "\n")
    a = preprocess_criteo(src, tmp_path / "a", progress=False)
    b = preprocess_criteo(src, tmp_path / "b", min_freq=3, progress=False)
    fps = {k: store_vocab_fingerprint(p) for k, p in a.items()}
    assert len(set(fps.values())) == 1  # train / valid / test of one run share the vocabularies
    assert fps["train"] == load_pipeline(a["train"]).vocab_fingerprint()
    assert store_vocab_fingerprint(b["train"]) != fps["train"]
    save_vocabularies(a["test"] / "vocab", load_pipeline(a["test"]).vocabs_)  # an older store: vocab/ only,
    shutil.rmtree(a["test"] / "pipeline")  # the fingerprint computed from it
    assert store_vocab_fingerprint(a["test"]) == fps["train"]


def test_checkpoints_written_before_pipelines_get_theirs_rebuilt(tmp_path: Path) -> None:
    src = tmp_path / "s.tsv"
    src.write_text("\n".join(criteo_lines(500)) + "\n")
    train = Store(preprocess_criteo(src, tmp_path / "o", min_freq=2, embedding_dim=8, progress=False)["train"])
    save_vocabularies(train.path / "vocab", load_pipeline(train.path).vocabs_)  # the layout of those days
    old = Checkpoint.from_plain({  # the layout of a checkpoint file, as it was before pipelines
        "version": 2, "schema": train.schema.to_dict(), "vocab": {"arrays": {
            f.name: np.frombuffer(f.read_bytes(), np.uint8) for f in sorted((train.path / "vocab").iterdir())},
            "path": None},
        "extra": {"data_format": "criteo", "preprocessing": train.preprocessing}, "pipeline": None,
        "config": {"data": {"multi_hot_size": 2, "multi_hot_min_table_size": 30}}})
    pipe = old.feature_pipeline()
    assert pipe.kind == "criteo" and pipe.schema == train.schema
    assert pipe.vocab_fingerprint() == load_pipeline(train.path).vocab_fingerprint()
    assert pipe.multi_hot["size"] == 2 and pipe.batch_stage.expanded == [
        t.num_embeddings >= 30 for t in train.schema.tables().values()]
