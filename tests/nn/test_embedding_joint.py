"""One lookup of two mirrored embedding collections (nn/embedding_joint.py) against each looked up on its own:
the same values and gradients bit for bit, and the cases that must fall back."""

from __future__ import annotations

import pytest
import torch

from ctrkit.batch import KeyedJagged
from ctrkit.errors import IdOutOfRangeError
from ctrkit.nn.embedding import EmbeddingBagCollection
from ctrkit.nn.embedding_joint import pooled_pair
from ctrkit.schema import TableSpec

B = 6
TABLES = [TableSpec("user", 11, 4, ("user",)), TableSpec("item", 13, 4, ("item", "hist")), TableSpec("tag", 5, 4, ("tag",))]
POOLING = {"user": "sum", "item": "sum", "hist": "mean", "tag": "mean"}
KEYS = {"user": "user", "item": "item", "hist": "item", "tag": "tag"}


def pair(dim_b: int = 1, **kw: object) -> tuple[EmbeddingBagCollection, EmbeddingBagCollection]:
    a = EmbeddingBagCollection(TABLES, KEYS, POOLING, init="normal", std=0.5, **kw)
    tables_b = [TableSpec(t.name, t.num_embeddings, dim_b, t.features) for t in TABLES]
    b = EmbeddingBagCollection(tables_b, KEYS, POOLING, init="normal", std=0.5, **kw)
    return a, b


def batch(gen: torch.Generator) -> KeyedJagged:
    """user / item one id per row, hist / tag 0-4 ids (empty bags included)."""
    per_key = {}
    for k, n in (("user", 11), ("item", 13), ("hist", 13), ("tag", 5)):
        lengths = torch.ones(B, dtype=torch.int64) if k in ("user", "item") else torch.randint(0, 5, (B,), generator=gen)
        per_key[k] = (torch.randint(0, n, (int(lengths.sum()),), generator=gen), lengths)
    return KeyedJagged.from_per_key(per_key)


def values_and_grads(a, b, kj, joint: bool):
    for p in (*a.parameters(), *b.parameters()):
        p.grad = None
    pa, pb = pooled_pair(a, b, kj) if joint else (a(kj), b(kj))
    ya, yb = pa.stacked(), pb.stacked()  # (B, F, D_a), (B, F, D_b)
    torch.manual_seed(1)
    ((ya * torch.randn_like(ya)).sum() + (yb * torch.randn_like(yb)).sum()).backward()
    return ya.detach(), yb.detach(), [p.grad.clone() for p in (*a.parameters(), *b.parameters())]


@pytest.mark.parametrize("dim_b", [1, 3])
def test_joint_lookup_equals_separate_bit_for_bit(dim_b: int) -> None:
    gen = torch.Generator().manual_seed(0)
    a, b = pair(dim_b)
    for _ in range(3):
        kj = batch(gen)
        joint, separate = values_and_grads(a, b, kj, True), values_and_grads(a, b, kj, False)
        assert torch.equal(joint[0], separate[0]) and torch.equal(joint[1], separate[1])
        assert all(torch.equal(g, h) for g, h in zip(joint[2], separate[2]))


def test_one_collection_unused_still_gets_no_gradient_and_the_other_its_own() -> None:
    a, b = pair()
    kj = batch(torch.Generator().manual_seed(3))
    pa, _ = pooled_pair(a, b, kj)
    pa.stacked().sum().backward()
    a2, _ = pair()
    a2.load_state_dict(a.state_dict())
    a2(kj).stacked().sum().backward()
    assert torch.equal(next(a.parameters()).grad, next(a2.parameters()).grad)
    assert b.fused_dim1.grad is None or not b.fused_dim1.grad.any()


def test_falls_back_where_it_must() -> None:
    kj = batch(torch.Generator().manual_seed(1))
    a, b = pair(dense_grad_max_rows=0)  # sparse gradients: not merged
    assert pooled_pair(a, b, kj) is None
    a, b = pair()
    other = EmbeddingBagCollection([TableSpec("user", 11, 1, ("user",))], init="zeros")  # other tables
    assert pooled_pair(a, other, kj) is None
    weighted = KeyedJagged(kj.keys, kj.values, lengths=kj.lengths, weights=torch.rand(kj.values.numel()))
    assert pooled_pair(a, b, weighted) is None


def test_ids_are_still_checked() -> None:
    a, b = pair()
    kj = batch(torch.Generator().manual_seed(2))
    bad = KeyedJagged(kj.keys, kj.values.clone(), lengths=kj.lengths)
    bad.values[-1] = 99  # the last id belongs to "tag" (5 rows)
    with pytest.raises(IdOutOfRangeError, match="feature 'tag': id 99"):
        pooled_pair(a, b, bad)
