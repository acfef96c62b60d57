"""Contract-test parameter variants for the zoo models of helper A (merged by test_models_contract.py)."""

VARIANTS: dict[str, list[dict]] = {
    "lr": [{}],
    "fm": [{}, {"dense_interaction": False}],
    "ffm": [{"embedding_dim": 4}, {"dense_interaction": False}],
}
