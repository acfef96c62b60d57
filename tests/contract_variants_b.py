"""Contract-test variants for the zoo models of issue 4 (part b): small sizes, every option branch."""

from __future__ import annotations

DNN = {"dnn_hidden": (16,)}

VARIANTS: dict[str, list[dict]] = {
    "dcn": [
        {**DNN, "cross_layers": 2},
        {"cross_layers": 1, "dnn_hidden": ()},
    ],
    "dcnv2": [
        {**DNN, "cross_type": "matrix", "structure": "parallel", "cross_layers": 2},
        {**DNN, "cross_type": "matrix", "structure": "stacked", "cross_layers": 2},
        {**DNN, "cross_type": "mix", "structure": "parallel", "cross_layers": 2, "rank": 4, "experts": 2},
        {**DNN, "cross_type": "mix", "structure": "stacked", "cross_layers": 2, "rank": 4, "experts": 1},
    ],
}
