"""Contract-test parameter variants for the zoo models of helper A (merged by test_models_contract.py)."""

VARIANTS: dict[str, list[dict]] = {
    "lr": [{}],
    "fm": [{}, {"dense_interaction": False}],
    "ffm": [{"embedding_dim": 4}, {"dense_interaction": False, "embedding_dim": 2}],
    "mlr": [{"regions": 4}, {"regions": 2, "l1": 1e-5, "l2": 1e-5, "l21": 1e-5}],
    "gbdt_lr": [
        {"num_trees": 10, "num_leaves": 8, "num_threads": 1},
        {"num_trees": 8, "num_leaves": 6, "sparse_as": "numeric", "with_linear": True, "num_threads": 1},
    ],
    # NCF sees only the user and item ids; on the planted data an id-only oracle reaches AUC 0.734,
    # below the contract's 0.75, so the variants add the dense features to the MLP branch (use_dense).
    "ncf": [
        {"mlp_hidden": (16, 8), "use_dense": True},
        {"user_feature": "user", "item_feature": "item", "gmf_dim": 4, "mlp_dim": 6, "mlp_hidden": (8,),
         "use_dense": True},
    ],
    "pnn": [
        {"product": "inner", "product_units": 16, "dnn_hidden": (16,)},
        {"product": "outer", "product_units": 16, "dnn_hidden": (16,)},
        {"product": "both", "product_units": 8, "dnn_hidden": (8,), "batch_norm": True},
    ],
    "wide_deep": [
        {"dnn_hidden": (16,)},
        {"dnn_hidden": (16,), "crosses": (("user", "item"), ("item", "ctx")), "cross_buckets": 500},
    ],
}
