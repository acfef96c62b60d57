"""VectorIndex against a brute-force torch top-k: exact kinds equal it, approximate kinds recall it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import require

from ctrkit.errors import ConfigError, RetrievalError
from ctrkit.retrieval.catalogue import SeenItems
from ctrkit.serving.index import INDEX_KINDS, VectorIndex, default_nlist

require("faiss", "retrieval")


def exact_topk_torch(queries: np.ndarray, vectors: np.ndarray, k: int, metric: str = "ip",
                     mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Brute force: scores (Q, N) = q.v (ip) or -|q - v|^2 (l2), ``mask`` (Q, N) True -> -inf; top-k
    scores and positions (Q, k)."""
    q, v = torch.from_numpy(queries).double(), torch.from_numpy(vectors).double()
    s = q @ v.T if metric == "ip" else -torch.cdist(q, v).square()  # (Q, N)
    if mask is not None:
        s = s.masked_fill(torch.from_numpy(mask), float("-inf"))
    top = s.topk(k, dim=1)
    return top.values.float().numpy(), top.indices.numpy()


def _random(n: int, d: int, nq: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gaussian vectors (ties have probability 0), queries and distinct large item ids."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype(np.float32)
    q = rng.normal(size=(nq, d)).astype(np.float32)
    return x, q, rng.choice(10**12, n, replace=False).astype(np.int64)


def _clustered(n: int, d: int, nq: int, centres: int = 200, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A Gaussian mixture, unit-normalised (as cosine two-tower vectors): items and queries alike."""
    rng = np.random.default_rng(seed)
    c = rng.normal(size=(centres, d))
    x = c[rng.integers(0, centres, n + nq)] + rng.normal(size=(n + nq, d))  # clusters overlap: not trivial
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    return x[:n], x[n:]


@pytest.fixture(scope="module")
def clustered() -> tuple[np.ndarray, np.ndarray]:
    return _clustered(20_000, 32, 200)


@pytest.mark.parametrize("kind,metric", [("flat_ip", "ip"), ("flat_l2", "l2")])
def test_flat_equals_brute_force(kind, metric):
    x, q, ids = _random(3000, 16, 50)
    scores, got = VectorIndex.build(x, ids, kind=kind).search(q, 10)
    ref_scores, ref_pos = exact_topk_torch(q, x, 10, metric)
    assert got.dtype == np.int64 and scores.dtype == np.float32 and got.shape == scores.shape == (50, 10)
    np.testing.assert_array_equal(got, ids[ref_pos])
    np.testing.assert_allclose(scores, ref_scores, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("kind,metric", [("flat_ip", "ip"), ("flat_l2", "l2")])
def test_exclusion_removes_exactly_the_given_ids(kind, metric):
    n, nq, k = 2000, 40, 10
    x, q, ids = _random(n, 8, nq, seed=1)
    rng = np.random.default_rng(2)
    _, top = exact_topk_torch(q, x, 30, metric)
    exclude, mask = [], np.zeros((nq, n), dtype=bool)
    for r in range(nq):  # some of each query's true top items, some random ones, ids not in the index
        pos = np.unique(np.concatenate([top[r, rng.integers(0, 30, rng.integers(0, 12))],
                                        rng.integers(0, n, rng.integers(0, 4))]))
        mask[r, pos] = True
        exclude.append([*ids[pos].tolist(), 10**13, 10**13 + 7])  # the last two: not indexed
    exclude[3] = []
    index = VectorIndex.build(x, ids, kind=kind)
    scores, got = index.search(q, k, exclude=exclude)
    ref_scores, ref_pos = exact_topk_torch(q, x, k, metric, mask=mask)
    np.testing.assert_array_equal(got, ids[ref_pos])
    np.testing.assert_allclose(scores, ref_scores, rtol=1e-4, atol=1e-3)
    for r in range(nq):
        assert not set(got[r]) & set(exclude[r])
    # the same exclusion as (row, item id) pairs, as the catalogue's SeenItems gives them per user
    users = np.arange(nq) * 3 + 100
    seen = SeenItems(np.repeat(users, [len(e) for e in exclude]), np.concatenate(exclude))
    s2, g2 = index.search(q, k, exclude=seen.pairs(users))
    np.testing.assert_array_equal(g2, got)
    np.testing.assert_array_equal(s2, scores)


def test_exclusion_pads_when_too_few_items_left():
    x, q, ids = _random(5, 4, 2)
    scores, got = VectorIndex.build(x, ids).search(q, 5, exclude=[ids[:2].tolist(), []])
    assert (got[0, 3:] == -1).all() and np.isneginf(scores[0, 3:]).all()
    assert set(got[0, :3]) == set(ids[2:]) and set(got[1]) == set(ids)
    assert np.isfinite(scores[1]).all()


@pytest.mark.parametrize("kind,metric", [("ivf", "ip"), ("ivf", "l2"), ("hnsw", "ip"), ("hnsw", "l2")])
def test_approximate_kinds_recall_exact(clustered, kind, metric):
    x, q = clustered
    ids = np.arange(len(x), dtype=np.int64) * 7 + 3
    index = VectorIndex.build(x, ids, kind=kind, metric=metric, ef_construction=80)
    if kind == "ivf":
        assert index.meta["nlist"] == default_nlist(len(x)) == 512  # 4 sqrt(20k) = 566 > 20k // 39
    _, ref = exact_topk_torch(q, x, 10, metric)

    def recall() -> float:
        return float(np.mean([len(set(g) & set(ids[r])) / 10 for g, r in zip(index.search(q, 10)[1], ref)]))

    default = recall()
    assert default >= 0.9, f"{kind}/{metric} recall@10 {default:.3f}"
    index.set_search_params(nprobe=1, ef_search=1)  # the fewest lists / candidates: the trade-off is real
    assert recall() < default - 0.2


def test_default_nlist_follows_the_faiss_rule():
    assert default_nlist(1_000_000) == 4000 and default_nlist(10_000_000) == 12649
    assert default_nlist(100) == 2 and default_nlist(10) == 1


def test_k_out_of_range_is_a_clear_error():
    x, q, ids = _random(20, 4, 3)
    index = VectorIndex.build(x, ids)
    for k in (0, 21):
        with pytest.raises(RetrievalError, match="holds 20 items; lower --k") as e:
            index.search(q, k)
        assert isinstance(e.value, ValueError)
    assert index.search(q, 20)[1].shape == (3, 20)


def test_query_dimension_mismatch_names_both_dimensions():
    x, _, ids = _random(50, 64, 1)
    with pytest.raises(RetrievalError, match="index built for D=64, queries have D=32: .*rebuild it"):
        VectorIndex.build(x, ids).search(np.zeros((2, 32), np.float32), 5)


def test_bad_options_name_the_option():
    x, _, ids = _random(50, 4, 1)
    with pytest.raises(ConfigError, match="kind='annoy'"):
        VectorIndex.build(x, ids, kind="annoy")
    with pytest.raises(ConfigError, match="metric='ip' contradicts kind='flat_l2'"):
        VectorIndex.build(x, ids, kind="flat_l2", metric="ip")
    with pytest.raises(ConfigError, match="metric='cosine'"):
        VectorIndex.build(x, ids, kind="hnsw", metric="cosine")
    with pytest.raises(RetrievalError, match="duplicates"):
        VectorIndex.build(x, np.zeros(50, np.int64))
    with pytest.raises(RetrievalError, match="rows for 1 queries"):
        VectorIndex.build(x, ids).search(x[:1], 3, exclude=[[1], [2]])
    with pytest.raises(RetrievalError, match=r"pairs with rows in \[0, 1\)"):
        VectorIndex.build(x, ids).search(x[:1], 3, exclude=(np.array([0, 1]), np.array([5, 6])))


@pytest.mark.parametrize("kind", INDEX_KINDS)
def test_save_load_round_trip(tmp_path, kind):
    x, q = _clustered(2000, 16, 30, centres=20)
    ids = np.arange(2000, dtype=np.int64)[::-1].copy()
    index = VectorIndex.build(x, ids, kind=kind, fingerprint="sha256:abc", nprobe=4, ef_search=40)
    exclude = [ids[:i].tolist() for i in range(30)]
    before = index.search(q, 10, exclude=exclude)
    path = index.save(tmp_path / "items.index")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["items.index"]  # no temporary left behind
    loaded = VectorIndex.load(path, expect_dim=16, expect_fingerprint="sha256:abc")
    assert loaded.meta == index.meta and len(loaded) == 2000
    after = loaded.search(q, 10, exclude=exclude)
    np.testing.assert_array_equal(after[0], before[0])
    np.testing.assert_array_equal(after[1], before[1])


def test_load_refuses_another_checkpoint_or_dimension(tmp_path):
    x, _, ids = _random(100, 8, 1)
    path = VectorIndex.build(x, ids, fingerprint="ckpt-1").save(tmp_path / "idx")
    with pytest.raises(RetrievalError, match=r"built from checkpoint ckpt-1, this is ckpt-2; rebuild"):
        VectorIndex.load(path, expect_fingerprint="ckpt-2")
    with pytest.raises(RetrievalError, match="holds D=8 vectors, the model has D=16"):
        VectorIndex.load(path, expect_dim=16)
    with pytest.raises(RetrievalError, match="is not a saved index"):
        VectorIndex.load(tmp_path / "nowhere")


def test_save_refuses_to_overwrite(tmp_path):
    x, _, ids = _random(100, 8, 1)
    path = VectorIndex.build(x, ids, fingerprint="old").save(tmp_path / "idx")
    with pytest.raises(RetrievalError, match="already exists; .*overwrite=True"):
        VectorIndex.build(x, ids, fingerprint="new").save(path)
    assert json.loads((path / "index.json").read_text())["fingerprint"] == "old"
    VectorIndex.build(x[:50], ids[:50], kind="flat_l2", fingerprint="new").save(path, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idx"]
    loaded = VectorIndex.load(path, expect_fingerprint="new")
    assert len(loaded) == 50 and loaded.meta["kind"] == "flat_l2"


def test_a_truncated_or_damaged_saved_index_is_a_retrieval_error(tmp_path):
    """faiss's own RuntimeError (or numpy's, or json's) became a traceback (issue 27, 6)."""
    import shutil

    x, _, ids = _random(300, 8, 1)
    good = VectorIndex.build(x, ids, kind="hnsw", fingerprint="f").save(tmp_path / "good")

    def damaged(name, edit):
        path = tmp_path / name
        shutil.copytree(good, path)
        edit(path)
        return path

    def cut(path, file="index.faiss"):
        data = (path / file).read_bytes()
        (path / file).write_bytes(data[: len(data) // 2])

    def without_size(path):  # an index saved before index.json held the size: faiss reads the cut file itself
        cut(path)
        meta = json.loads((path / "index.json").read_text())
        meta.pop("bytes")
        (path / "index.json").write_text(json.dumps(meta))

    cases = {
        "truncated": (lambda p: cut(p), r"index.faiss holds \d+ bytes, index.json says \d+: the file is truncated"),
        "old": (without_size, r"index.faiss cannot be read by faiss \(truncated or damaged"),
        "ids": (lambda p: cut(p, "ids.npy"), r"ids.npy cannot be read"),
        "json": (lambda p: (p / "index.json").write_text("{"), r"index.json cannot be read"),
        "keys": (lambda p: (p / "index.json").write_text("{}"), r"index.json cannot be read \(KeyError"),
    }
    for name, (edit, message) in cases.items():
        with pytest.raises(RetrievalError, match=message + r".*rebuild it"):
            VectorIndex.load(damaged(name, edit))
    assert len(VectorIndex.load(good, expect_fingerprint="f")) == 300


def test_faiss_loader_lines_are_quiet_unless_debugging():
    """faiss logs "Could not load library with AVX512 support due to: ModuleNotFoundError ..." at INFO while it
    looks for its fastest build: not an error, shown only with debug logging (issue 27, 7)."""
    import subprocess
    import sys

    code = ("import logging, sys; logging.basicConfig(level=getattr(logging, sys.argv[1])); "
            "from ctrkit.serving.index import _faiss; _faiss()")
    for level, shown in (("INFO", False), ("DEBUG", True)):
        p = subprocess.run([sys.executable, "-c", code, level], capture_output=True, text=True, timeout=120,
                           check=True)
        assert ("faiss.loader" in p.stderr) == shown, p.stderr
