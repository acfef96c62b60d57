"""Tasks: what a model is trained to do, i.e. its loss and its evaluation.

The :class:`~ctrkit.training.trainer.Trainer` knows nothing about labels or metrics: each step it calls
``task.loss(module, batch) -> (loss, logs)`` and at each evaluation ``task.evaluate(module, loader)``.
A task is bound once to the unwrapped model (``task.bind(model)``) to take what it needs from the
model's declarations (its penalised parameter groups); ``module`` is what the trainer steps (the
model itself, or a DDP / torchrec wrapper around it).

:class:`CTRTask`, click-through prediction::

    out    = model(batch)                       # logits (B,) or ModelOutput(logits, aux_losses)
    bce    = BCEWithLogits(logits, labels, weights)           (float32, outside autocast)
    loss   = bce + Σ aux_losses + Σ_groups penalty(group)
    logs   = {"bce", each aux loss by name, "penalty/<group>"}   (empty when loss is just bce)

evaluated with :class:`~ctrkit.metrics.MetricSet` on ``sigmoid(logits)`` (AUC, LogLoss, GAUC with
the batches' group ids, ...).

:class:`RetrievalTask`, two-tower retrieval (a :class:`~ctrkit.models.base.TwoTowerModel`), each row a
(query, positive item) pair::

    q, v  = model.encode_query(batch), model.encode_item(batch)            (B, D) each
    loss  = in-batch softmax (log-Q corrected) | sampled softmax (k negatives, uniform or ∝ count^α)
            | full softmax over the catalogue          (ctrkit.retrieval.losses; weights honoured)

On sequence rows (``per_position``: one row per user sequence, :func:`~ctrkit.retrieval.catalogue.sequence_rows`)
every history step is a query and the item after it its positive (Kang & McAuley's per-position training)::

    H, mask = model.encode_positions(batch)       (B, T, D), (B, T)       position t sees steps <= t (causal)
    q, pos  = H[t], item after step t             over the real steps whose item is in the catalogue   (n, D)
    loss    = the same softmax, each position one example (a row's weight on each of its positions)

evaluated by full ranking: every row's query against every catalogue item, the user's training items
excluded (:mod:`ctrkit.retrieval.catalogue`), HR@K / NDCG@K / MRR.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from typing import Any

import numpy as np
import torch
from torch import nn

from ctrkit.batch import Batch
from ctrkit.data.sources.behaviour_sequences import owned_positions
from ctrkit.errors import ConfigError, TrainingError
from ctrkit.metrics import MetricSet
from ctrkit.models.base import CTRModel, ModelOutput, ParamGroup, TwoTowerModel
from ctrkit.models.scoring import probabilities, scoring
from ctrkit.retrieval.batching import batch_rows, length_groups
from ctrkit.retrieval.catalogue import (
    ItemCatalogue,
    SeenItems,
    check_ranking_metrics,
    encode_catalogue,
    exclusion_pairs,
    position_targets,
    ranking_metrics,
    target_ranks,
)
from ctrkit.retrieval.losses import (
    cross_batch_softmax_loss,
    full_softmax_loss,
    in_batch_softmax_loss,
    sampled_softmax_loss,
)

Gather = Callable[[list[Any]], list[Any]]  # per-batch results of this process -> of every process, in batch order
PRECISIONS = ("fp32", "bf16")
SAMPLE_WEIGHTS = ("all", "positives")
RETRIEVAL_LOSSES = ("in_batch", "sampled", "full")
SAMPLINGS = ("uniform", "frequency")


class Task:
    """The loss and the evaluation of one learning problem (subclass and override all three)."""

    metric_names: list[str]
    precision: str = "fp32"

    def _autocast(self, device: torch.device) -> Any:
        """bf16 autocast of the forward on ``device`` when ``precision`` is "bf16"."""
        if self.precision == "bf16":
            return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
        return nullcontext()

    def bind(self, model: CTRModel) -> Task:
        """Take what the task needs from the unwrapped model's declarations; returns self."""
        return self

    def loss(self, model: nn.Module, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(scalar loss to minimise, named parts to log: auxiliary losses, penalties, ...)."""
        raise NotImplementedError

    def evaluate(self, model: nn.Module, loader: Iterable[Batch], gather: Gather | None = None) -> dict[str, float]:
        """Metrics of ``model`` over every batch of ``loader``. ``gather`` (a multi-process run's
        :meth:`~ctrkit.training.distributed.DistContext.gather_batches`) turns this process's per-batch results
        into every process's, in one process's batch order, before the metrics are computed."""
        raise NotImplementedError


class CTRTask(Task):
    """Binary click prediction: BCE with logits (sample weights honoured) + the model's auxiliary
    losses + its parameter groups' penalties; metrics from :class:`~ctrkit.metrics.MetricSet`.

    ``precision="bf16"`` runs the model's forward under autocast; the loss stays float32.

    ``sample_weight="positives"``: the batch's weights apply to positive rows only, negatives weigh 1 -- the
    YouTubeDNN ranking model's weighted logistic regression (seed 002, 精排 / 加权交叉熵: positives weighted
    by watch time), ``mean_i [(y_i w_i + 1 - y_i) · BCE_i]``; its odds e^{logit} then estimate the expected
    watch time. "all" (default): ``mean_i [w_i · BCE_i]``.
    """

    def __init__(self, metrics: Sequence[str] = ("auc", "logloss"), *, precision: str = "fp32",
                 sample_weight: str = "all") -> None:
        if precision not in PRECISIONS:
            raise ConfigError(f"CTRTask: precision {precision!r} is not one of {PRECISIONS}")
        if sample_weight not in SAMPLE_WEIGHTS:
            raise ConfigError(f"CTRTask: sample_weight {sample_weight!r} is not one of {SAMPLE_WEIGHTS}")
        self.sample_weight = sample_weight
        MetricSet(metrics)  # unknown metric names fail here, not at the first evaluation
        self.metric_names = list(metrics)
        self.precision = precision
        self._penalised: list[ParamGroup] | None = None  # set by bind()

    def bind(self, model: CTRModel) -> CTRTask:
        if not isinstance(model, CTRModel):
            raise ConfigError(f"CTRTask trains a ctrkit CTRModel; got {type(model).__name__} "
                              "(derive it from ctrkit.models.base.CTRModel)")
        self._penalised = [g for g in model.param_groups() if g.penalised]
        return self

    def loss(self, model: nn.Module, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        if self._penalised is None:
            raise TrainingError("CTRTask.loss: call task.bind(model) first (it collects the model's penalties)")
        with self._autocast(batch.labels.device):
            out = model(batch)  # (B,) or ModelOutput
        aux = out.aux_losses if isinstance(out, ModelOutput) else None
        logits = out.logits if aux is not None else out
        w = batch.weights
        if w is not None and self.sample_weight == "positives":
            w = batch.labels * w + (1.0 - batch.labels)
        bce = nn.functional.binary_cross_entropy_with_logits(logits.float(), batch.labels, weight=w)
        if not aux and not self._penalised:
            return bce, {}
        loss = bce
        logs = {"bce": bce.detach()}
        for name, value in (aux or {}).items():
            loss = loss + value
            logs[name] = value.detach()
        for group in self._penalised:
            penalty = group.penalty()
            loss = loss + penalty
            logs[f"penalty/{group.name}"] = penalty.detach()
        return loss, logs

    def evaluate(self, model: nn.Module, loader: Iterable[Batch], gather: Gather | None = None) -> dict[str, float]:
        """Metrics on ``loader`` (the model in eval mode, put back as it was afterwards)."""
        ms = MetricSet(self.metric_names)
        groups = "gauc" in self.metric_names
        parts = []  # per batch: (probabilities, labels, weights, groups) on the host
        with scoring(model):
            for batch in loader:
                with self._autocast(batch.labels.device):
                    out = model(batch)
                parts.append(tuple(None if t is None else t.detach().cpu() for t in (
                    probabilities(out), batch.labels, batch.weights, batch.group_ids if groups else None)))
        for p, y, w, g in (gather(parts) if gather is not None else parts):
            ms.update(p, y, w, g)
        if len(ms) == 0:
            raise TrainingError("evaluation data is empty: the loader yielded no rows")
        return ms.compute()


class RetrievalTask(Task):
    """Two-tower retrieval over ``catalogue`` (see the module docstring).

    ``loss``: "in_batch" (``log_q``: subtract log of each item's share of the training targets), "sampled"
    (``num_negatives`` per batch drawn by ``sampling``: "uniform" or "frequency" ∝ count^``alpha``; ``log_q``
    subtracts the proposal's log probability; accidental hits removed) or "full". ``seen``: the training
    items excluded from every user's ranking (None: nothing excluded but each row's own history).
    ``eval_chunk``: catalogue items scored at a time. The towers are called on the model ``bind`` was given;
    under several processes the loss runs inside the DDP-wrapped :class:`~ctrkit.training.distributed.TaskStep`.
    ``gather_items`` (set by :func:`~ctrkit.training.distributed.wrap_for_training` with
    ``train.distributed.gather_negatives``): the in-batch negatives are every process's batch items.
    ``per_position``: the training rows are sequence rows, every history step a query (module docstring);
    ``window`` (max_len, stride) of their store: a row's loss is on the positions it owns
    (:func:`~ctrkit.data.sources.behaviour_sequences.owned_positions`; None: every position).
    """

    def __init__(self, catalogue: ItemCatalogue, *, seen: SeenItems | None = None, loss: str = "in_batch",
                 log_q: bool = True, num_negatives: int = 100, sampling: str = "uniform", alpha: float = 0.75,
                 metrics: Sequence[str] = ("hr@10", "hr@50", "ndcg@10", "mrr"), precision: str = "fp32",
                 eval_chunk: int = 65536, per_position: bool = False,
                 window: tuple[int, int] | None = None) -> None:
        for what, value, valid in (("loss", loss, RETRIEVAL_LOSSES), ("sampling", sampling, SAMPLINGS),
                                   ("precision", precision, PRECISIONS)):
            if value not in valid:
                raise ConfigError(f"RetrievalTask: {what} {value!r} is not one of {valid}")
        if num_negatives < 1 or alpha < 0:
            raise ConfigError(f"RetrievalTask: num_negatives must be >= 1 and alpha >= 0, got {num_negatives}, "
                              f"{alpha}")
        check_ranking_metrics(list(metrics))
        self.catalogue, self.seen = catalogue, seen
        self.loss_kind, self.log_q, self.num_negatives = loss, log_q, int(num_negatives)
        self.metric_names = list(metrics)
        self.precision, self.eval_chunk, self.per_position = precision, int(eval_chunk), bool(per_position)
        self.window = window
        counts = torch.as_tensor(catalogue.counts, dtype=torch.float64)
        self._log_share = (counts / counts.sum().clamp_min(1)).clamp_min(1e-12).log()  # (N,) in-batch log Q
        proposal = torch.ones_like(counts) if sampling == "uniform" else counts.pow(alpha)
        self._proposal = proposal / proposal.sum()  # (N,) sampled-softmax proposal
        self._log_proposal = self._proposal.log()
        self._model: TwoTowerModel | None = None
        self._history: str | None = None  # the model's item history (hist_item): excluded from each row's ranking
        self.gather_items: Callable[..., tuple[torch.Tensor, ...]] | None = None

    def bind(self, model: CTRModel) -> RetrievalTask:
        if not isinstance(model, TwoTowerModel):
            raise ConfigError(f"RetrievalTask trains a retrieval model (a TwoTowerModel: two_tower, youtube_dnn, "
                              f"sasrec); got {type(model).__name__}")
        missing = [f for f in model.item_features if f not in self.catalogue.features]
        if missing:
            raise ConfigError(f"the item catalogue lacks the item features {missing} that "
                              f"{model.model_name or type(model).__name__} reads; it has {list(self.catalogue.features)}")
        why = model.position_training_error() if self.per_position else None
        if why is not None:
            raise ConfigError(f"the training store holds sequence rows (one per user sequence, the loss at every "
                              f"position): {why}")
        self._model = model
        f = model.fields
        item = model.item_id_feature
        self._history = f.histories[f.history_items.index(item)] if item in f.history_items else None
        return self

    def _targets(self, model: TwoTowerModel, batch: Batch) -> torch.Tensor:
        """Catalogue rows (B,) of the rows' items (-1: not in the catalogue)."""
        return self.catalogue.rows_of(batch.sparse[model.item_id_feature][0])

    def _position_queries(self, m: TwoTowerModel, batch: Batch) -> tuple[torch.Tensor, torch.Tensor,
                                                                          torch.Tensor | None]:
        """Sequence rows -> (queries (n, D), their positives' catalogue rows (n,), weights (n,) or None) over the
        real history steps whose next item is in the catalogue and that the row owns; the rows run in groups of
        similar length (:mod:`ctrkit.retrieval.batching`: the same values, less padding)."""
        assert self._history is not None
        groups = length_groups(batch.sparse[self._history][1])
        parts = [self._group_queries(m, batch if len(groups) == 1 else batch_rows(batch, g)) for g in groups]
        q, rows, w = zip(*parts)
        return torch.cat(q), torch.cat(rows), None if w[0] is None else torch.cat(w)

    def _group_queries(self, m: TwoTowerModel, batch: Batch) -> tuple[torch.Tensor, torch.Tensor,
                                                                       torch.Tensor | None]:
        assert self._history is not None
        h, mask = m.encode_positions(batch)  # (B, T, D), (B, T)
        nxt = position_targets(batch.sparse, self._history, m.item_id_feature, h.shape[1])  # (B, T)
        rows = self.catalogue.rows_of(nxt)  # (B, T); -1: padding, or a rare / unseen item
        keep = mask & (rows >= 0)
        if self.window is not None:  # overlapping windows: each target on the one row that owns it
            keep &= owned_positions(mask.sum(1), mask.shape[1], max_len=self.window[0], stride=self.window[1])
        w = batch.weights
        return h[keep], rows[keep], None if w is None else w.unsqueeze(1).expand_as(keep)[keep]

    def loss(self, model: nn.Module, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        m = self._model
        if m is None:
            raise TrainingError("RetrievalTask.loss: call task.bind(model) first")
        if self.per_position:
            return self._position_loss(m, batch), {}
        rows = self._targets(m, batch)  # (B,) catalogue rows of the positives
        keep = rows >= 0  # a rare / unseen target (id 1) is no item: left out of the loss
        with self._autocast(batch.labels.device):
            q = m.encode_query(batch)  # (B, D)
            if self.loss_kind == "in_batch" and self.gather_items is not None:
                return self._cross_batch_loss(q, m.encode_item(batch), rows, keep, batch.weights), {}
            if self.loss_kind == "in_batch":
                v = m.encode_item(batch)  # (B, D)
            elif self.loss_kind == "sampled":
                neg = torch.multinomial(self._proposal, self.num_negatives, replacement=True)  # (K,)
                v_all = m.encode_item(self.catalogue.batch(torch.cat([rows.clamp(min=0).cpu(), neg]), q.device))
                v, v_neg = v_all[:len(batch)], v_all[len(batch):]  # (B, D), (K, D)
            else:
                v_all = m.encode_item(self.catalogue.batch(None, q.device))  # (N, D)
        weights = batch.weights
        if not bool(keep.all()):
            q, rows = q[keep], rows[keep]
            v = v[keep] if self.loss_kind != "full" else None
            weights = weights[keep] if weights is not None else None
            if not len(rows):
                return q.sum() * 0.0, {}
        t = m.temperature
        if self.loss_kind == "in_batch":
            log_q = self._log_share.to(q.device)[rows] if self.log_q else None
            loss = in_batch_softmax_loss(q, v, rows, temperature=t, log_q=log_q, weights=weights)
        elif self.loss_kind == "sampled":
            lq, neg = self._log_proposal.to(q.device), neg.to(q.device)
            loss = sampled_softmax_loss(q, v, rows, v_neg, neg, temperature=t,
                                        log_q_pos=lq[rows] if self.log_q else None,
                                        log_q_neg=lq[neg] if self.log_q else None, weights=weights)
        else:
            loss = full_softmax_loss(q, v_all, rows, temperature=t, weights=weights)
        return loss, {}

    def _position_loss(self, m: TwoTowerModel, batch: Batch) -> torch.Tensor:
        """The loss of sequence rows: every real step a query, the item after it the positive (module docstring)."""
        t = m.temperature
        with self._autocast(batch.labels.device):
            q, rows, weights = self._position_queries(m, batch)  # (n, D), (n,), (n,) | None
            if self.loss_kind == "in_batch" and self.gather_items is not None:  # in the collective even when n = 0
                v = m.encode_item(self.catalogue.batch(rows, q.device)) if len(rows) else q.new_zeros(0, q.shape[1])
                return self._cross_batch_loss(q, v, rows, torch.ones_like(rows, dtype=torch.bool), weights)
            if not len(rows):
                return q.sum() * 0.0
            if self.loss_kind == "full":
                v = m.encode_item(self.catalogue.batch(None, q.device))  # (N, D)
            elif self.loss_kind == "sampled":
                neg = torch.multinomial(self._proposal, self.num_negatives, replacement=True)  # (K,)
                v_all = m.encode_item(self.catalogue.batch(torch.cat([rows.cpu(), neg]), q.device))
                v, v_neg = v_all[:len(rows)], v_all[len(rows):]  # (n, D), (K, D)
            else:
                v = m.encode_item(self.catalogue.batch(rows, q.device))  # (n, D)
        if self.loss_kind == "full":
            return full_softmax_loss(q, v, rows, temperature=t, weights=weights)
        if self.loss_kind == "sampled":
            lq, neg = self._log_proposal.to(q.device), neg.to(q.device)
            return sampled_softmax_loss(q, v, rows, v_neg, neg, temperature=t,
                                        log_q_pos=lq[rows] if self.log_q else None,
                                        log_q_neg=lq[neg] if self.log_q else None, weights=weights)
        log_q = self._log_share.to(q.device)[rows] if self.log_q else None
        return in_batch_softmax_loss(q, v, rows, temperature=t, log_q=log_q, weights=weights)

    def _cross_batch_loss(self, q: torch.Tensor, v: torch.Tensor, rows: torch.Tensor, keep: torch.Tensor,
                          weights: torch.Tensor | None) -> torch.Tensor:
        """In-batch softmax against the items of every process's batch (``gather_items``)."""
        assert self.gather_items is not None
        cols = torch.where(keep, rows, -1)  # an item out of the catalogue is no candidate
        v_all, col_all, first = self.gather_items(v, cols)  # (C, D), (C,), where this process's rows start
        mine = keep.nonzero().squeeze(1)
        log_q = self._log_share.to(q.device)[col_all.clamp(min=0)] if self.log_q else None
        w = weights[mine] if weights is not None else None
        if not len(mine):
            return q.sum() * 0.0 + v_all.sum() * 0.0  # still in the collective, with a zero loss
        return cross_batch_softmax_loss(q[mine], rows[mine], first + mine, v_all, col_all,
                                        temperature=self._model.temperature, log_q=log_q, weights=w)

    def exclusions(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(row, catalogue row) pairs to mask: the user's training items and the row's own item history."""
        return exclusion_pairs(self.catalogue, self.seen, batch, self._history)

    def ranks(self, model: nn.Module, loader: Iterable[Batch], gather: Gather | None = None) -> np.ndarray:
        """0-based full-ranking rank of every row's item (inf: a miss that cannot be ranked); ``gather``: as in
        :meth:`Task.evaluate`."""
        m = self._model
        if m is None:
            raise TrainingError("RetrievalTask.evaluate: call task.bind(model) first")
        out = []
        with scoring(m):
            vectors = None
            for batch in loader:
                if vectors is None:
                    with self._autocast(batch.labels.device):
                        vectors = encode_catalogue(m, self.catalogue, batch.labels.device, self.eval_chunk)  # (N, D)
                with self._autocast(batch.labels.device):
                    q = m.encode_query(batch).float()  # (B, D)
                scores = q @ vectors.t()  # (B, N)
                out.append(target_ranks(scores, self._targets(m, batch), self.exclusions(batch)).cpu().numpy())
        if gather is not None:
            out = gather(out)
        return np.concatenate(out) if out else np.zeros(0)

    def evaluate(self, model: nn.Module, loader: Iterable[Batch], gather: Gather | None = None) -> dict[str, float]:
        """Full-ranking metrics of the rows of ``loader`` (one query and its true item per row)."""
        r = self.ranks(model, loader, gather)
        if len(r) == 0:
            raise TrainingError("evaluation data is empty: the loader yielded no rows")
        return ranking_metrics(r, self.metric_names)


def ranking_task(config: Any, metrics: Sequence[str] | None = None) -> CTRTask:
    """The :class:`CTRTask` of a train config (``TrainConfig``): ``metrics`` (default ``config.metrics``) plus the
    early-stopping metric when early stopping is on, at the config's precision and sample weighting."""
    es = config.early_stopping
    names = list(metrics if metrics is not None else config.metrics)
    if es.patience > 0 and es.metric not in names:
        names.append(es.metric)
    return CTRTask(names, precision=config.precision, sample_weight=config.sample_weight)
