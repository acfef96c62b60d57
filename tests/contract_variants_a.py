"""Contract-test parameter variants for the zoo models of helper A (merged by test_models_contract.py)."""

VARIANTS: dict[str, list[dict]] = {
    "lr": [{}],
    "fm": [{}, {"dense_interaction": False}],
    "ffm": [{"embedding_dim": 4}, {"dense_interaction": False}],
    "mlr": [{"regions": 4}, {"regions": 2, "l1": 1e-5, "l2": 1e-5, "l21": 1e-5}],
    "gbdt_lr": [
        {"num_trees": 10, "num_leaves": 8, "num_threads": 1},
        {"num_trees": 8, "num_leaves": 6, "sparse_as": "numeric", "with_linear": True, "num_threads": 1},
    ],
}
