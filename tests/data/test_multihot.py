import numpy as np
import pytest
import torch

from ctrkit.batch import KeyedJagged
from ctrkit.data.pipeline.multihot import MultiHot

KEYS = ["c0", "c1", "c2", "c3"]
NUM = [6, 7, 5, 9]


def seed_example_batch():
    ids = torch.tensor([[1, 2, 3, 4], [5, 6, 0, 8]])  # I[b, f]
    return ids, KeyedJagged.from_dense(KEYS, ids)


@pytest.mark.parametrize("dist", ["uniform", "pareto"])
def test_seed_worked_example(dist):
    ids, kj = seed_example_batch()
    mh = MultiHot(NUM, 3, 8, dist)
    out = mh(kj)
    assert mh.expanded == [False, False, False, True]
    w = mh.weight[3]
    assert w.shape == (9, 3) and all(mh.weight[i] is None for i in range(3))
    # the seed's ordering: [I00, I10, I01, I11, I02, I12, I03, I03^1, I03^2, I13, I13^1, I13^2]
    expected = [ids[0, 0], ids[1, 0], ids[0, 1], ids[1, 1], ids[0, 2], ids[1, 2],
                ids[0, 3], w[ids[0, 3], 1], w[ids[0, 3], 2], ids[1, 3], w[ids[1, 3], 1], w[ids[1, 3], 2]]
    assert out.values.tolist() == [int(x) for x in expected]
    assert out.offsets.tolist() == [0, 1, 2, 3, 4, 5, 6, 9, 12]
    assert out.lengths.tolist() == [1, 1, 1, 1, 1, 1, 3, 3]
    assert out.offsets.tolist() == mh.offsets(2).tolist()
    assert out.keys == KEYS and out.stride == 2
    assert out.values.dtype == torch.int64
    v = out["c3"][0]
    assert v.min() >= 0 and v.max() < 9


@pytest.mark.parametrize("dist", ["uniform", "pareto"])
def test_against_loop_reference_and_determinism(dist):
    rng = np.random.default_rng(0)
    num = [3, 50, 1000, 20, 400]
    B, m = 37, 4
    ids = torch.from_numpy(np.stack([rng.integers(0, n, B) for n in num], 1))
    keys = [f"k{i}" for i in range(len(num))]
    a, b = MultiHot(num, m, 50, dist), MultiHot(num, m, 50, dist)
    for wa, wb in zip(a.weight, b.weight):
        assert (wa is None) == (wb is None)
        if wa is not None:
            assert torch.equal(wa, wb)
            assert wa.min() >= 0 and wa.max() < wa.shape[0]
    out = a(KeyedJagged.from_dense(keys, ids))
    # naive reference: loop over features and rows
    ref_vals, ref_len = [], []
    for f, n in enumerate(num):
        for r in range(B):
            x = int(ids[r, f])
            if n >= 50:
                row = [x] + [int(a.weight[f][x, j]) for j in range(1, m)]
            else:
                row = [x]
            ref_vals += row
            ref_len.append(len(row))
    assert out.values.tolist() == ref_vals
    assert out.lengths.tolist() == ref_len
    assert out.offsets.tolist() == np.concatenate([[0], np.cumsum(ref_len)]).tolist()
    # features under the threshold untouched
    for f in (0, 3):
        assert torch.equal(out[keys[f]][0], ids[:, f])


def test_distributions_differ_and_seed_is_feature_index():
    u = MultiHot([100, 100], 5, 10, "uniform")
    p = MultiHot([100, 100], 5, 10, "pareto")
    assert not torch.equal(u.weight[0], p.weight[0])
    assert not torch.equal(u.weight[0], u.weight[1])  # seeds 0 and 1
    # pareto(a=0.25) is heavy-tailed: small ids (mod n) much more common than under uniform
    assert (p.weight[0][:, 1:] < 5).float().mean() > (u.weight[0][:, 1:] < 5).float().mean()


def test_passes_extra_keys_and_rejects_multi_valued(tmp_path):
    kj = KeyedJagged(["a", "b", "hist"], torch.tensor([1, 2, 3, 4, 5, 6, 7]),
                     lengths=torch.tensor([1, 1, 1, 1, 2, 1]), stride=2)
    mh = MultiHot([10, 3], 2, 5, collect_freqs=True)
    out = mh(kj)
    assert out.lengths.tolist() == [2, 2, 1, 1, 2, 1]
    assert out["hist"][0].tolist() == [5, 6, 7]
    assert out["a"][0].tolist()[::2] == [1, 2]
    mh.save_freqs(tmp_path / "f.npz")
    z = np.load(tmp_path / "f.npz")
    assert z["pre_0"].sum() == 2 and z["post_0"].sum() == 4 and z["pre_0"][1] == 1
    np.testing.assert_array_equal(z["pre_1"], z["post_1"])
    bad = KeyedJagged(["a", "b"], torch.tensor([1, 2, 3, 4, 5]), lengths=torch.tensor([2, 1, 1, 1]), stride=2)
    with pytest.raises(ValueError, match="single-valued"):
        mh(bad)
    with pytest.raises(ValueError, match="outside"):
        mh(KeyedJagged.from_dense(["a", "b"], torch.tensor([[10, 0], [1, 1]])))
    with pytest.raises(ValueError, match="distribution"):
        MultiHot([10], 2, 5, "zipf")


MLPERF_SIZES = [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]


def test_per_feature_sizes_against_loop_reference():
    """MLPerf DLRM-DCNv2's per-table sizes: feature i becomes m_i ids (size 1: its own id), weights repeated."""
    rng = np.random.default_rng(1)
    num = [int(n) for n in rng.integers(2, 300, len(MLPERF_SIZES))]
    B = 9
    ids = torch.from_numpy(np.stack([rng.integers(0, n, B) for n in num], 1))
    keys = [f"C{i + 1}" for i in range(len(num))]
    mh = MultiHot(num, MLPERF_SIZES, 1, "uniform")
    weights = torch.arange(B * len(num), dtype=torch.float32)
    kj = KeyedJagged(keys, ids.T.reshape(-1), lengths=torch.ones(B * len(num), dtype=torch.int64), stride=B,
                     weights=weights)
    out = mh(kj)
    ref_vals, ref_len, ref_w = [], [], []
    for f, (n, m) in enumerate(zip(num, MLPERF_SIZES)):
        assert mh.weight[f].shape == (n, m)
        for r in range(B):
            x = int(ids[r, f])
            row = [x] + [int(mh.weight[f][x, j]) for j in range(1, m)]
            ref_vals += row
            ref_len.append(m)
            ref_w += [float(weights[f * B + r])] * m
    assert out.values.tolist() == ref_vals and out.lengths.tolist() == ref_len
    assert out.weights.tolist() == ref_w
    assert out.offsets.tolist() == mh.offsets(B).tolist() == np.concatenate([[0], np.cumsum(ref_len)]).tolist()
    same = MultiHot(num, [4] * len(num), 1)  # a list of one size == that size
    assert torch.equal(same(kj).values, MultiHot(num, 4, 1)(kj).values)
    with pytest.raises(Exception, match="26 sparse features"):
        MultiHot(num, MLPERF_SIZES[:-1], 1)
    with pytest.raises(Exception, match=">= 1"):
        MultiHot(num, [0] + MLPERF_SIZES[1:], 1)
