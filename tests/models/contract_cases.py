"""The registry of contract cases: for every model family, the variants (small sizes, every option branch)
and the schema each model is checked on, with what it does with an unpooled history; and how a case is built.

test_models_contract.py drives every registered model through these cases, serving/test_export.py exports
each model's first variant, and each family's own test file (test_dlrm.py, test_zoo_logits_*.py,
test_behaviour_models.py, test_retrieval_models.py) reads its family's variants from here. A registered model
without variants runs with its defaults, under the test id ``<name>-defaults``."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from conftest import behaviour_schema, contract_schema, make_batch, planted_data

from ctrkit.models.base import CTRModel
from ctrkit.models.registry import create_model
from ctrkit.schema import Schema

Variants = dict[str, list[dict]]

# ---- DLRM (test_dlrm.py): every interaction arch ------------------------------------------------------------
DLRM_SMALL = {"dense_arch": (16,), "over_arch": (16,)}
DLRM: Variants = {
    "dlrm": [
        dict(DLRM_SMALL, interaction="dot"),
        dict(DLRM_SMALL, interaction="dcn", cross_type="full", cross_layers=2),
        dict(DLRM_SMALL, interaction="dcn", cross_type="low_rank", cross_layers=2, cross_rank=4),
        dict(DLRM_SMALL, interaction="dcn", cross_type="vector", cross_layers=2),
        dict(DLRM_SMALL, interaction="dcn", cross_type="low_rank_mixture", cross_layers=2, cross_rank=4,
             cross_experts=2),
        dict(DLRM_SMALL, interaction="projection", projection_branch1=(16, 3 * 8), projection_branch2=(16, 2 * 8)),
    ],
}

# ---- linear, factorisation, product and wide models (test_zoo_logits_linear_and_product.py) ------------------
LINEAR_AND_PRODUCT: Variants = {
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
        {"dnn_hidden": (16, 8), "use_dense": True},
        {"user_feature": "user", "item_feature": "item", "gmf_dim": 4, "mlp_dim": 6, "dnn_hidden": (8,),
         "use_dense": True},
    ],
    "pnn": [
        {"product": "inner", "product_units": 16, "dnn_hidden": (16,)},
        {"product": "outer", "product_units": 16, "dnn_hidden": (16,)},
        {"product": "both", "product_units": 8, "dnn_hidden": (8,), "dnn_batch_norm": True},
    ],
    "wide_deep": [
        {"dnn_hidden": (16,)},
        {"dnn_hidden": (16,), "crosses": (("user", "item"), ("item", "ctx")), "cross_buckets": 500},
    ],
}

# ---- cross, deep-FM and attention models (test_zoo_logits_deep_and_attention.py) ------------------------------
_DNN = {"dnn_hidden": (16,)}
DEEP_AND_ATTENTION: Variants = {
    "dcn": [
        {**_DNN, "cross_layers": 2},
        {"cross_layers": 1, "dnn_hidden": ()},
    ],
    "dcnv2": [
        {**_DNN, "cross_type": "full", "structure": "parallel", "cross_layers": 2},
        {**_DNN, "cross_type": "full", "structure": "stacked", "cross_layers": 2},
        {**_DNN, "cross_type": "low_rank_mixture", "structure": "parallel", "cross_layers": 2, "cross_rank": 4,
         "cross_experts": 2},
        {**_DNN, "cross_type": "low_rank_mixture", "structure": "stacked", "cross_layers": 2, "cross_rank": 4,
         "cross_experts": 1},
    ],
    "deepfm": [
        {**_DNN},
        {"dnn_hidden": (), "bias": False},
    ],
    "xdeepfm": [
        {**_DNN, "cin_layer_sizes": (8, 6), "split_half": True},
        {**_DNN, "cin_layer_sizes": (5, 3), "split_half": False, "cin_activation": "relu"},
    ],
    "nfm": [
        {**_DNN, "bi_dropout": 0.1},
        {"dnn_hidden": ()},
        {**_DNN, "bi_batch_norm": False},
    ],
    "afm": [
        {"att_dim": 4},
        {"att_dim": 4, "att_dropout": 0.1},
    ],
    "fibinet": [
        {**_DNN, "bilinear_type": "field_all", "senet_pooling": "mean"},
        {**_DNN, "bilinear_type": "field_each", "senet_pooling": "max", "reduction_ratio": 2.0},
        {**_DNN, "bilinear_type": "field_interaction", "senet_pooling": "mean"},
        {**_DNN, "bilinear_type": "field_interaction", "bilinear_shared": True},
    ],
    "autoint": [
        {"num_layers": 2, "num_heads": 2},
        {**_DNN, "num_layers": 1, "num_heads": 2, "head_dim": 3, "autoint_plus": True},
        {"num_layers": 1, "num_heads": 2, "dense_as_fields": False},  # dense values reach the head
    ],
}

# ---- user-behaviour models (test_behaviour_models.py) ---------------------------------------------------------
_BEHAVIOUR_SMALL = {"dnn_hidden": (16,), "dnn_activation": "relu"}
BEHAVIOUR: Variants = {
    "dnn": [{**_BEHAVIOUR_SMALL}],
    "din": [{**_BEHAVIOUR_SMALL, "att_hidden": (8,)},
            {"dnn_hidden": (16, 8), "att_hidden": (8, 4), "att_normalize": True, "mba_l2": 1e-3},
            {**_BEHAVIOUR_SMALL, "att_activation": "sigmoid"}],
    "dien": [{**_BEHAVIOUR_SMALL, "att_hidden": (8,), "aux_hidden": (8,)},
             {**_BEHAVIOUR_SMALL, "gru_type": "AGRU", "aux_loss_weight": 0.0},
             {**_BEHAVIOUR_SMALL, "gru_type": "AIGRU", "aux_loss_weight": 0.5, "att_normalize": False},
             {**_BEHAVIOUR_SMALL, "gru_type": "GRU", "aux_loss_weight": 0.0}],
    "dsin": [{**_BEHAVIOUR_SMALL, "num_heads": 2},
             {**_BEHAVIOUR_SMALL, "num_heads": 1, "merge_mode": "concat", "lstm_layers": 2, "lstm_res_layers": 1}],
    "bst": [{**_BEHAVIOUR_SMALL, "num_heads": 2}, {**_BEHAVIOUR_SMALL, "num_heads": 1, "num_layers": 2}],
}

# ---- retrieval models (test_retrieval_models.py) --------------------------------------------------------------
RETRIEVAL: Variants = {
    "two_tower": [{"dnn_hidden": (16,), "out_dim": 8},
                  {"dnn_hidden": (32,), "out_dim": 16, "similarity": "dot", "temperature": 1.0, "dnn_dropout": 0.1}],
    "youtube_dnn": [{"dnn_hidden": (16,)}, {"dnn_hidden": (16, 8), "dnn_dropout": 0.1, "temperature": 0.5}],
    "sasrec": [{"num_heads": 2}, {"num_layers": 1, "att_dropout": 0.0, "ffn_dim": 16}],
}

FAMILIES: dict[str, Variants] = {"dlrm": DLRM, "linear_and_product": LINEAR_AND_PRODUCT,
                                 "deep_and_attention": DEEP_AND_ATTENTION, "behaviour": BEHAVIOUR,
                                 "retrieval": RETRIEVAL}


def merge(families: dict[str, Variants]) -> Variants:
    out: Variants = {}
    for family in families.values():
        twice = set(out) & set(family)
        assert not twice, f"contract variants of {sorted(twice)} are defined in two families"
        out.update(family)
    return out


VARIANTS: Variants = merge(FAMILIES)

# The schema a model is checked on, where it is not the contract schema: every behaviour and retrieval model
# reads the behaviour builder's schema.
SCHEMAS: dict[str, Callable[[], Schema]] = {
    **dict.fromkeys(BEHAVIOUR, behaviour_schema), **dict.fromkeys(RETRIEVAL, behaviour_schema),
}

# What each model does with an unpooled (pooling "none") history: "ignores" it (the default: the zoo's
# field models read only pooled features, schema.pooled_keys), "uses" it (attention over the
# sequence) or "rejects" it with a ConfigError naming the feature.
UNPOOLED: dict[str, str] = {
    "din": "uses", "dnn": "uses", "bst": "uses", "dien": "rejects", "dsin": "rejects",
    **dict.fromkeys(RETRIEVAL, "uses"),
}


def schema_for(name: str) -> Schema:
    """The schema a model is checked on: the contract schema, or the behaviour builder's for the behaviour
    and retrieval models (SCHEMAS)."""
    return SCHEMAS.get(name, contract_schema)()


_DATA: dict[str, dict[str, np.ndarray]] = {}


def data_for(name: str) -> dict[str, np.ndarray]:
    """Planted-signal rows (3000) in the schema ``name`` is checked on, drawn once per schema."""
    factory = SCHEMAS.get(name, contract_schema)
    key = factory.__name__
    if key not in _DATA:
        _DATA[key] = planted_data(3000, seed=1, schema=factory())
    return _DATA[key]


def build(name: str, params: dict, seed: int = 0, data: dict | None = None,
          schema: Schema | None = None) -> CTRModel:
    """Create the model; a model that declares ``needs_prefit`` (GBDT+LR's trees) gets its prefit on
    the training rows, as the runner does."""
    torch.manual_seed(seed)
    schema = schema or schema_for(name)
    model = create_model(name, schema, **params)
    if model.needs_prefit:
        data = data if data is not None else data_for(name)
        model.prefit([make_batch(data, slice(s, s + 500), schema) for s in range(0, 2500, 500)])
    return model
