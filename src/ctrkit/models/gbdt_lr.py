"""GBDT + LR (He et al., "Practical Lessons from Predicting Clicks on Ads at Facebook", ADKDD 2014;
seed 002 "GBDT + LR").

Idea: boosted trees learn feature combinations; the leaf each row falls into, per tree, becomes a
one-hot categorical feature, and a logistic regression is trained over those leaves:

    raw x (dense values + single-valued sparse ids) --LightGBM, T trees--> leaf l_t(x) per tree
    logit = b + Σ_t w_t[l_t(x)]   (+ the plain LR over x when ``with_linear``)

The trees are fitted once by :meth:`prefit` (the trainer calls it on the training batches); only
the leaf weights (a dim-1 table of ``num_leaves`` rows per tree, fused, an embedding table) and the
optional LR are trained. Sparse ids go to LightGBM as categorical features or as numbers
(``sparse_as``); multi-valued features and sequences are not given to the trees.

State: the LightGBM model string is kept in the uint8 buffer ``trees`` so ``state_dict`` round-trips
with no pickle; the booster is re-parsed lazily on the first forward after ``load_state_dict``.
``forward`` runs LightGBM ``predict(pred_leaf=True)`` on the batch's raw features (CPU, numpy).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from ctrkit.batch import Batch, KeyedJagged
from ctrkit.errors import NotFittedError
from ctrkit.models.base import CTRModel, ModelOutput
from ctrkit.models.registry import ConfigError, register_model
from ctrkit.nn.embedding_factory import make_embeddings
from ctrkit.nn.inputs import LinearTerm
from ctrkit.schema import Schema, TableSpec


def _lightgbm() -> Any:
    try:
        import lightgbm
    except ImportError:
        raise ConfigError("gbdt_lr needs lightgbm: pip install 'ctrkit[gbdt]' (or lightgbm>=4)") from None
    return lightgbm


@register_model("gbdt_lr")
class GBDTLR(CTRModel):
    """Tree options: ``num_trees``, ``num_leaves`` (max leaves per tree), ``tree_learning_rate``,
    ``min_data_in_leaf``, ``sparse_as`` ("categorical" | "numeric"), ``num_threads`` (0 = LightGBM's
    default), ``seed``. ``with_linear`` adds the plain LR over the original features."""

    needs_prefit = True  # the trees are fitted on the training rows before the LR is trained
    exportable = False  # forward runs LightGBM (numpy), not torch
    export_blocker = ("its forward finds each row's leaves with LightGBM trees (numpy, on the host), and LightGBM "
                      "trees are not torch ops, so neither TorchScript nor ONNX can hold them")

    def __init__(
        self,
        schema: Schema,
        *,
        num_trees: int = 100,
        num_leaves: int = 31,
        tree_learning_rate: float = 0.1,
        min_data_in_leaf: int = 20,
        sparse_as: Literal["categorical", "numeric"] = "categorical",
        with_linear: bool = False,
        num_threads: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if num_trees < 1 or num_leaves < 2:
            raise ConfigError(f"gbdt_lr: needs num_trees >= 1 and num_leaves >= 2, got {num_trees}, {num_leaves}")
        if sparse_as not in ("categorical", "numeric"):
            raise ConfigError(f"gbdt_lr: sparse_as {sparse_as!r} is not one of ('categorical', 'numeric')")
        self.num_trees, self.num_leaves = int(num_trees), int(num_leaves)
        self.tree_params = {
            "objective": "binary", "num_leaves": self.num_leaves, "learning_rate": float(tree_learning_rate),
            "min_data_in_leaf": int(min_data_in_leaf), "num_threads": int(num_threads), "seed": int(seed),
            "deterministic": True, "force_col_wise": True, "verbose": -1,
        }
        self.sparse_as = sparse_as
        self.num_dense = schema.num_dense
        self.tree_keys = [s.name for s in schema.sparse if not s.multi_valued]  # ids given to the trees
        if self.num_dense + len(self.tree_keys) == 0:
            raise ConfigError("gbdt_lr needs a dense or single-valued sparse feature to grow trees on")
        self.leaf_keys = [f"tree{t}" for t in range(self.num_trees)]
        self.leaf_weights = make_embeddings(  # one dim-1 table of num_leaves rows per tree
            tables=[TableSpec(k, self.num_leaves, 1, (k,)) for k in self.leaf_keys], init="zeros"
        )
        self.bias = nn.Parameter(torch.zeros(1))
        self.linear = LinearTerm(schema, bias=False) if with_linear else None
        self.register_buffer("trees", torch.zeros(0, dtype=torch.uint8))  # LightGBM model string
        self._booster: Any = None

    # ---- trees -----------------------------------------------------------------------------
    def raw_features(self, batch: Batch) -> np.ndarray:
        """The trees' input (B, Nd + S) float64: dense values, then each single-valued sparse
        feature's id (its first id; 0 = missing for an empty bag)."""
        cols = [batch.dense.detach().cpu().double()]
        for k in self.tree_keys:
            values, lengths, offsets = batch.sparse[k]
            first = values[offsets[:-1].clamp(max=max(values.numel() - 1, 0))] if values.numel() else lengths
            cols.append(torch.where(lengths > 0, first, 0).cpu().double().unsqueeze(1))
        return torch.cat(cols, dim=1).numpy()  # (B, Nd + S)

    def prefit(self, batches: Iterable[Batch]) -> GBDTLR:
        """Fit the trees on ``batches`` (labels and optional weights), store them in ``trees``."""
        batches = list(batches)
        if not batches:
            raise ConfigError("gbdt_lr.prefit needs at least one training batch to fit the trees on")
        lgb = _lightgbm()
        x = np.concatenate([self.raw_features(b) for b in batches])
        y = torch.cat([b.labels for b in batches]).cpu().numpy()
        weighted = all(b.weights is not None for b in batches)
        w = torch.cat([b.weights for b in batches]).cpu().numpy() if weighted else None
        cats = list(range(self.num_dense, x.shape[1])) if self.sparse_as == "categorical" else []
        data = lgb.Dataset(x, y, weight=w, categorical_feature=cats, free_raw_data=True)
        booster = lgb.train(self.tree_params, data, num_boost_round=self.num_trees)
        text = booster.model_to_string().encode("utf-8")
        self.trees = torch.frombuffer(bytearray(text), dtype=torch.uint8).to(self.bias.device)
        self._booster = booster
        return self

    @property
    def booster(self) -> Any:
        """The LightGBM booster, parsed from ``trees`` on first use."""
        if self.trees.numel() == 0:
            raise NotFittedError("gbdt_lr: the trees are not fitted; call model.prefit(train_batches) first "
                                 "(training through the ctrkit Trainer does this), or load a fitted checkpoint")
        if self._booster is None:
            text = bytes(self.trees.cpu().numpy()).decode("utf-8")
            self._booster = _lightgbm().Booster(model_str=text)
        return self._booster

    def leaf_indices(self, batch: Batch) -> torch.Tensor:
        """Leaf of each row in each tree -> (B, num_trees) int64 (trees LightGBM did not grow: 0)."""
        booster = self.booster
        leaves = np.zeros((len(batch), self.num_trees), dtype=np.int64)
        if len(batch):
            pred = booster.predict(self.raw_features(batch), pred_leaf=True).reshape(len(batch), -1)
            leaves[:, : pred.shape[1]] = pred
        return torch.from_numpy(leaves).to(batch.dense.device)

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any, **kwargs: Any) -> None:
        # the model string's length differs between fits: take the stored buffer's shape, re-parse lazily
        saved = state_dict.get(prefix + "trees")
        if saved is not None:
            self.trees = torch.empty_like(saved, device=self.trees.device)
            self._booster = None
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    # ---- LR over the leaves ------------------------------------------------------------------
    def forward(self, batch: Batch) -> ModelOutput:
        leaves = KeyedJagged.from_dense(self.leaf_keys, self.leaf_indices(batch))  # T one-hot features
        out = self.leaf_weights(leaves).stacked().sum(dim=(1, 2)) + self.bias  # (B, T, 1) -> (B,)
        if self.linear is not None:
            out = out + self.linear(batch)  # (B,)
        return ModelOutput(out, {})
