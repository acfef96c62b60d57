import pytest

from ctrkit.schema import (
    DenseFeature,
    Schema,
    SchemaError,
    SequenceFeature,
    SparseFeature,
    auto_embedding_dim,
)


def schema() -> Schema:
    return Schema(
        dense=[DenseFeature("price")],
        sparse=[
            SparseFeature("user", 1000, 16, group="user"),
            SparseFeature("item", 5000, 16, group="item"),
            SparseFeature("item_cat", 50, "auto", group="item"),
            SparseFeature("target_item", 5000, table="item", group="item"),
        ],
        sequence=[SequenceFeature("hist_item", 20, shares="item")],
    )


def test_tables_shared_and_auto_dims():
    s = schema()
    t = s.tables()
    assert list(t) == ["user", "item", "item_cat"]
    assert t["item"].features == ("item", "target_item", "hist_item")
    assert t["item"].embedding_dim == 16
    assert t["item_cat"].embedding_dim == auto_embedding_dim(50) == round(6 * 50**0.25)
    assert auto_embedding_dim(10**12) == 64  # capped
    assert auto_embedding_dim(1024, "log2") == 10
    assert s.sparse_keys == ["user", "item", "item_cat", "target_item", "hist_item"]
    assert s.pooled_keys == s.sparse_keys  # hist_item pools (mean)
    unpooled = Schema(sparse=list(s.sparse), sequence=[SequenceFeature("hist_item", 20, shares="item", pooling="none")])
    assert unpooled.pooled_keys == ["user", "item", "item_cat", "target_item"]
    assert s.embedding_dim("hist_item") == 16
    assert s.group("item") == ["item", "item_cat", "target_item"]


def test_json_round_trip(tmp_path):
    s = schema()
    s.to_json(tmp_path / "schema.json")
    assert Schema.from_json(tmp_path / "schema.json") == s
    assert Schema.from_json(s.to_json()) == s


@pytest.mark.parametrize(
    "kwargs, msg",
    [
        ({"sparse": [SparseFeature("a", 10), SparseFeature("a", 10)]}, "'a' appears twice"),
        ({"dense": [DenseFeature("x")], "sparse": [SparseFeature("a", 10, table="x")]}, "names table 'x'"),
        ({"sparse": [SparseFeature("a", 10, 8), SparseFeature("b", 10, 4, table="a")]}, "shares table 'a'"),
        ({"sparse": [SparseFeature("a", 1)]}, "vocab_size must be"),
        ({"sparse": [SparseFeature("a", 10, 0)]}, "embedding_dim must be"),
        ({"sequence": [SequenceFeature("h", 5, shares="item")]}, "shares the table of 'item'"),
        ({"dense": [DenseFeature("x", group="items")]}, "group 'items'"),
        ({"sparse": [SparseFeature("a", 10, pooling="max")]}, "pooling 'max'"),
    ],
)
def test_validation_names_the_feature(kwargs, msg):
    with pytest.raises(SchemaError, match=msg):
        Schema(**kwargs)


def test_from_dict_rejects_unknown_keys():
    with pytest.raises(SchemaError, match="unknown keys"):
        Schema.from_dict({"sparse": [{"name": "a", "vocab_size": 10, "dimm": 4}]})
