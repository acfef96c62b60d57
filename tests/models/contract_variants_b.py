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
    "deepfm": [
        {**DNN},
        {"dnn_hidden": (), "bias": False},
    ],
    "xdeepfm": [
        {**DNN, "cin_layer_sizes": (8, 6), "split_half": True},
        {**DNN, "cin_layer_sizes": (5, 3), "split_half": False, "cin_activation": "relu"},
    ],
    "nfm": [
        {**DNN, "bi_dropout": 0.1},
        {"dnn_hidden": ()},
        {**DNN, "bi_batch_norm": False},
    ],
    "afm": [
        {"attention_dim": 4},
        {"attention_dim": 4, "attention_dropout": 0.1},
    ],
    "fibinet": [
        {**DNN, "bilinear_type": "field_all", "senet_pooling": "mean"},
        {**DNN, "bilinear_type": "field_each", "senet_pooling": "max", "reduction_ratio": 2.0},
        {**DNN, "bilinear_type": "field_interaction", "senet_pooling": "mean"},
    ],
    "autoint": [
        {"attention_layers": 2, "num_heads": 2},
        {**DNN, "attention_layers": 1, "num_heads": 2, "head_dim": 3, "autoint_plus": True},
        {"attention_layers": 1, "num_heads": 2, "dense_as_fields": False},  # dense values reach the head
    ],
}
