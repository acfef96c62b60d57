import pytest
import torch

from ctrkit.batch import Batch, KeyedJagged


def seed_example() -> tuple[torch.Tensor, KeyedJagged]:
    # seed 000 §3.3: B = 2 rows, 4 single-valued features
    ids = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    return ids, KeyedJagged.from_dense(["cat_0", "cat_1", "cat_2", "cat_3"], ids)


def test_key_major_layout_matches_seed():
    ids, kj = seed_example()
    # values stored column first: [I00, I10, I01, I11, I02, I12, I03, I13]
    assert kj.values.tolist() == [1, 5, 2, 6, 3, 7, 4, 8]
    assert kj.offsets.tolist() == list(range(9))
    assert kj.lengths.tolist() == [1] * 8
    assert kj.stride == 2
    assert kj.length_per_key() == [2, 2, 2, 2]
    assert kj.offset_per_key() == [0, 2, 4, 6, 8]
    d = kj.to_dict()
    assert list(d) == kj.keys
    for f, k in enumerate(kj.keys):
        values, lengths, offsets = d[k]
        assert values.tolist() == ids[:, f].tolist()
        assert lengths.tolist() == [1, 1]
        assert offsets.tolist() == [0, 1, 2]


def jagged() -> KeyedJagged:
    # key a: rows [10, 11], [] ; key b: rows [20], [21, 22, 23]
    return KeyedJagged(["a", "b"], torch.tensor([10, 11, 20, 21, 22, 23]), lengths=torch.tensor([2, 0, 1, 3]))


def test_offsets_from_lengths_and_back():
    kj = jagged()
    assert kj.offsets.tolist() == [0, 2, 2, 3, 6]
    kj2 = KeyedJagged(kj.keys, kj.values, offsets=kj.offsets)
    assert kj2.lengths.tolist() == [2, 0, 1, 3]
    assert kj.to_dict()["b"][2].tolist() == [0, 1, 4]


def test_select_and_permute():
    kj = jagged()
    p = kj.permute([1, 0])
    assert p.keys == ["b", "a"]
    assert p.values.tolist() == [20, 21, 22, 23, 10, 11]
    assert p.lengths.tolist() == [1, 3, 2, 0]
    s = kj.select(["b"])
    assert s.values.tolist() == [20, 21, 22, 23] and s.stride == 2
    with pytest.raises(KeyError, match="no key 'z'"):
        kj.select(["z"])


def test_to_padded_keeps_most_recent():
    kj = jagged()
    ids, mask = kj.to_padded("b", 2)
    assert ids.tolist() == [[20, 0], [22, 23]]
    assert mask.tolist() == [[True, False], [True, True]]
    ids, mask = kj.to_padded("a", 3)
    assert ids.tolist() == [[10, 11, 0], [0, 0, 0]]
    assert mask.sum().item() == 2


def test_bad_construction():
    with pytest.raises(TypeError, match="int64"):
        KeyedJagged(["a"], torch.tensor([1.0]), lengths=torch.tensor([1]))
    with pytest.raises(ValueError, match="expected 4"):
        KeyedJagged(["a", "b"], torch.tensor([1, 2, 3]), lengths=torch.tensor([1, 1, 1]), stride=2)
    with pytest.raises(ValueError, match="unique"):
        KeyedJagged(["a", "a"], torch.tensor([1, 2]), lengths=torch.tensor([1, 1]))


def test_batch_to_device():
    _, kj = seed_example()
    b = Batch(dense=torch.zeros(2, 3), sparse=kj, labels=torch.tensor([0.0, 1.0]), group_ids=torch.tensor([1, 1]))
    c = b.to("cpu")
    assert len(c) == 2 and c.sparse.values.tolist() == kj.values.tolist() and c.weights is None
