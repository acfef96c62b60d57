"""One lookup for all single-valued columns (:class:`~ctrkit.data.pipeline.vocab_joint.JointLookup`) gives the
ids :meth:`Vocabulary.lookup` gives column by column, for every kind of integer vocabulary (plain, min_freq,
hashed, capped, MLPerf's modulo with min_freq), and the pipeline's chunks take it without changing an id."""

from __future__ import annotations

import numpy as np
import pytest

from ctrkit.data.pipeline import encode
from ctrkit.data.pipeline.feature_pipeline import DENSE_NAMES, SPARSE_NAMES, FeaturePipeline
from ctrkit.data.pipeline.vocab import VocabBuilder, Vocabulary
from ctrkit.data.pipeline.vocab_joint import JointLookup


def vocabularies(rng: np.random.Generator) -> list[Vocabulary]:
    out = []
    options = [{}, {"min_freq": 2}, {"max_vocab": 7}, {"max_vocab": 9, "mode": "cap"},
               {"max_vocab": 11, "min_freq": 2, "hash_fn": "mod"}, {"max_vocab": 5, "hash_seed": 3}]
    for j, opts in enumerate(options):
        b = VocabBuilder(f"t{j}", "int")
        b.add(rng.integers(0, 40, 300) * 1000003 % (1 << 32))
        out.append(b.finish(**opts)[0])
    out.append(VocabBuilder("empty", "int").finish()[0])
    return out


def test_joint_lookup_gives_each_vocabularys_ids():
    rng = np.random.default_rng(0)
    vocabs = vocabularies(rng)
    joint = JointLookup.of(vocabs)
    assert joint is not None
    n = 500
    keys = rng.integers(0, 45, (len(vocabs), n)) * 1000003 % (1 << 32)  # kept, rare and unseen keys
    keys[:, :5] = [-1, -7, 1 << 32, (1 << 63) - 1, 0]  # outside [0, 2^32): no table's key
    missing = rng.random(keys.shape) < 0.1
    got = joint.lookup(keys, missing)
    for j, v in enumerate(vocabs):
        assert got[j].tolist() == v.lookup(keys[j], missing[j]).tolist(), v.name
    assert (got[missing] == 0).all() and (got[~missing] >= 1).any()
    assert joint.lookup(keys).tolist() == [v.lookup(keys[j]).tolist() for j, v in enumerate(vocabs)]


def test_vocabularies_it_cannot_join_keep_the_per_column_lookup():
    b = VocabBuilder("s", "str")
    b.add(np.array(["a", "b"]))
    assert JointLookup.of([b.finish()[0]]) is None
    assert JointLookup.of([Vocabulary.modulo("m", 10)]) is None  # MLPerf's formula holds no keys
    big = VocabBuilder("big", "int")
    big.add(np.array([1 << 40]))
    assert JointLookup.of([big.finish()[0]]) is None


@pytest.mark.parametrize("max_vocab", [None, 6])
def test_pipeline_chunks_give_the_same_ids_either_way(monkeypatch, max_vocab):
    rng = np.random.default_rng(1)

    def rows(n: int) -> list[dict]:
        return [{"label": int(i % 2), **{d: int(rng.integers(-3, 50)) for d in DENSE_NAMES},
                 **{c: None if rng.random() < 0.1 else f"{int(rng.integers(0, 30)) * 7919:08x}" for c in SPARSE_NAMES}}
                for i in range(n)]

    pipe = FeaturePipeline.criteo(min_freq=2, max_vocab=max_vocab).fit(rows(400))
    test = rows(300)
    joint = pipe.transform(test)
    assert pipe._joint() is not None
    monkeypatch.setattr(encode, "JOINT_MAX_ROWS", 0)  # every chunk column by column
    alone = pipe.transform(test)
    for c in SPARSE_NAMES:
        assert joint[c].dtype == alone[c].dtype and np.array_equal(joint[c], alone[c]), c
    for d in DENSE_NAMES:
        assert np.array_equal(joint[d], alone[d]), d
