"""The model contract: what every ranking model is and declares, and what a retrieval model offers.

A ranking model is a :class:`CTRModel`: ``forward(batch)`` returns a :class:`ModelOutput`, always:
``logits (B,)`` and ``aux_losses`` (empty unless the model has auxiliary losses, e.g. DIEN's
next-behaviour loss in training). The type never depends on ``self.training``; :func:`logits_of` takes the
logits of it (and of plain logits ``(B,)``, for callers that hold a bare tensor). What the
trainer, the optimizers and the runner need to know about a model is declared on its class, never
probed with ``hasattr``:

- ``needs_prefit`` / ``prefit(batches)``: a step run once on the training batches before gradient
  training (GBDT+LR fits its trees there).
- ``exportable``: whether ``forward`` is pure torch (False when it calls LightGBM, say), so an
  exporter / server knows up front what it can trace; ``export_blocker`` says why not (the exporter's
  error message, :mod:`ctrkit.serving.export`).
- ``param_groups()``: named :class:`ParamGroup` s with a dedicated optimizer (Wide & Deep's "wide"
  part: FTRL when ``train.wide_optimizer=ftrl``) and/or penalties (MLR's L1 / L2 / L2,1) that the
  task adds to the loss and logs by name.
- ``embedding_parameters()``: the embedding tables, trained by the sparse-aware optimizer.
- ``model_name``: the registry key (set by ``@register_model``).
- ``renamed_options`` / ``renamed_values``: parameter names (old -> new) and values (parameter -> {old -> new})
  this model no longer takes; a config using one gets an error naming the new one, an old checkpoint is
  upgraded (:func:`ctrkit.models.registry.upgrade_params`).
- ``option_defaults``: this model's defaults for options of a shared option group where they differ
  from the group's (NCF's pyramid tower: ``{"dnn_hidden": (64, 32, 16)}``); see
  :mod:`ctrkit.models.registry`.

A retrieval model (two towers) satisfies the :class:`RetrievalModel` protocol: ``encode_query`` and
``encode_item`` map a batch to ``(B, D)`` vectors scored by a dot product. ctrkit's own retrieval models
derive from :class:`TwoTowerModel` (a ``CTRModel`` whose ``task_kind`` is "retrieval"), so the same
Trainer, checkpoints and contract test serve them; ``forward(batch)`` is then the logit of the row's own
(query, item) pair, ``<q, v> / temperature``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, Protocol, runtime_checkable

import torch
from torch import nn

from ctrkit.batch import Batch
from ctrkit.errors import ConfigError
from ctrkit.nn.embedding import EmbeddingCollection

if TYPE_CHECKING:
    from ctrkit.models._retrieval import RetrievalFields

GROUP_OPTIMIZERS = ("ftrl",)


class ModelOutput(NamedTuple):
    """Every ranking model's output (a tuple, so DDP / tracing pass it through).

    ``logits`` (B,); ``aux_losses`` name -> scalar, already weighted ({} when there are none): the task adds
    each to the main loss and logs it under its name.
    """

    logits: torch.Tensor
    aux_losses: dict[str, torch.Tensor]


def logits_of(output: torch.Tensor | ModelOutput) -> torch.Tensor:
    """The logits ``(B,)`` of a model's output (plain logits or a :class:`ModelOutput`)."""
    return output.logits if isinstance(output, ModelOutput) else output


@dataclass(eq=False)
class ParamGroup:
    """A named set of parameters with an optional dedicated optimizer and/or penalties.

    ``optimizer``: the dedicated optimizer the group is meant for ("ftrl"); the run config decides
    whether it is used (``train.wide_optimizer=ftrl`` for every group declaring "ftrl"), otherwise the
    group's parameters stay with the dense / embedding optimizers.

    Penalty (added to the loss by the task, logged as ``penalty/<name>``)::

        l1 · Σ|W| + l2 · Σ W² + l21 · Σ_rows sqrt(‖W_row‖² + 1e-12)

    summed over the group's parameters. A "row" is one slice along ``row_dims[i]`` of parameter i
    (default 0: one id of an embedding table [R, D]; 1 for an ``nn.Linear`` weight [out, in] whose
    rows in the group-lasso sense are its input features). The 1e-12 keeps the gradient of an
    all-zero row finite.
    """

    name: str
    params: Sequence[nn.Parameter]
    optimizer: str | None = None
    l1: float = 0.0
    l2: float = 0.0
    l21: float = 0.0
    row_dims: Sequence[int] | None = None
    _rows: tuple[int, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.params = list(self.params)
        if self.optimizer is not None and self.optimizer not in GROUP_OPTIMIZERS:
            raise ConfigError(f"parameter group {self.name!r}: optimizer {self.optimizer!r} is not one of "
                              f"{GROUP_OPTIMIZERS}")
        for key in ("l1", "l2", "l21"):
            value = float(getattr(self, key))
            if value < 0:
                raise ConfigError(f"parameter group {self.name!r}: {key} must be >= 0, got {value}")
            setattr(self, key, value)
        rows = tuple(self.row_dims) if self.row_dims is not None else (0,) * len(self.params)
        if len(rows) != len(self.params) or any(d not in (0, 1) for d in rows):
            raise ConfigError(f"parameter group {self.name!r}: row_dims needs one 0 or 1 per parameter "
                              f"({len(self.params)}), got {self.row_dims!r}")
        self._rows = rows

    @property
    def penalised(self) -> bool:
        return bool(self.l1 or self.l2 or self.l21)

    def penalty(self) -> torch.Tensor:
        """The group's penalty, a scalar (0 when l1 = l2 = l21 = 0)."""
        loss = self.params[0].new_zeros(()) if self.params else torch.zeros(())
        for p, row_dim in zip(self.params, self._rows):
            w = p.t() if row_dim == 1 else p  # (rows, ...)
            if self.l1:
                loss = loss + self.l1 * w.abs().sum()
            if self.l2:
                loss = loss + self.l2 * w.pow(2).sum()
            if self.l21:
                w2 = w.pow(2)
                per_row = w2.sum(dim=1) if w2.dim() == 2 else w2.reshape(w2.shape[0], -1).sum(dim=1)
                loss = loss + self.l21 * per_row.add(1e-12).sqrt().sum()
        return loss


class CTRModel(nn.Module):
    """Base class of every ranking model: ``forward(batch) -> ModelOutput(logits (B,), aux_losses)``.

    Subclasses declare their capabilities as class attributes / by overriding the methods below;
    the defaults describe a plain model (no prefit, exportable, no special parameter groups).
    """

    model_name: ClassVar[str] = ""  # the registry key, set by @register_model
    needs_prefit: ClassVar[bool] = False  # True: call prefit(train batches) before training
    exportable: ClassVar[bool] = True  # False: forward leaves torch (e.g. LightGBM inside)
    export_blocker: ClassVar[str] = ""  # why not, when exportable is False
    option_defaults: ClassVar[Mapping[str, Any]] = MappingProxyType({})  # option-group defaults that differ for this model
    renamed_options: ClassVar[Mapping[str, str]] = MappingProxyType({})  # old parameter name -> new
    renamed_values: ClassVar[Mapping[str, Mapping[Any, Any]]] = MappingProxyType({})  # parameter -> {old: new}
    task_kind: ClassVar[str] = "ranking"  # the task that trains it: "ranking" (CTRTask) or "retrieval" (RetrievalTask)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.needs_prefit and cls.prefit is CTRModel.prefit:
            raise TypeError(f"{cls.__qualname__} declares needs_prefit = True but does not define prefit()")

    def prefit(self, batches: Iterable[Batch]) -> CTRModel:
        """Fit what gradient training does not (run once on the training batches, one pass of the training
        loader, when ``needs_prefit``); returns self. A model without such a part has nothing to do."""
        return self

    def param_groups(self) -> list[ParamGroup]:
        """Named parameter groups with a dedicated optimizer and/or penalties (default: none)."""
        return []

    def embedding_parameters(self) -> Iterator[nn.Parameter]:
        """The embedding tables [R, D] of the model's embedding collections (each once), for the
        sparse-aware optimizer."""
        seen: set[int] = set()
        for m in self.modules():
            if isinstance(m, EmbeddingCollection):
                for p in m.embedding_parameters():
                    if id(p) not in seen:
                        seen.add(id(p))
                        yield p


@runtime_checkable
class RetrievalModel(Protocol):
    """A two-tower model: queries (users / contexts) and items embedded into one D-dim space,
    scored by ``<encode_query(q), encode_item(i)>``."""

    def encode_query(self, batch: Batch) -> torch.Tensor:
        """Query vectors (B, D) of the batch's query features."""
        ...

    def encode_item(self, batch: Batch) -> torch.Tensor:
        """Item vectors (B, D) of the batch's item features."""
        ...


class TwoTowerModel(CTRModel):
    """Base of ctrkit's retrieval models: a query tower and an item tower into one D-dim space.

    Subclasses set ``item_features`` (the single-valued sparse features that describe an item, the item
    id ``item_id_feature`` first: what an item catalogue supplies to :meth:`encode_item`) and
    ``temperature`` (τ), and implement :meth:`encode_query` / :meth:`encode_item`; ``encode_item`` reads
    only ``item_features`` from a batch, so a batch of catalogue items (no user side) works. Scores::

        s(q, i) = <encode_query(q), encode_item(i)> / τ        forward(batch).logits = s of each row's own pair (B,)
    """

    task_kind: ClassVar[str] = "retrieval"
    fields: RetrievalFields  # the schema's roles (ctrkit.models._retrieval.retrieval_fields)
    item_features: list[str]
    item_id_feature: str
    temperature: float

    def encode_query(self, batch: Batch) -> torch.Tensor:
        """Query vectors (B, D)."""
        raise NotImplementedError

    def encode_item(self, batch: Batch) -> torch.Tensor:
        """Item vectors (B, D) from the batch's ``item_features`` only."""
        raise NotImplementedError

    def encode_positions(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Query vectors at every step of the item history and its mask ((B, T, D), (B, T)), for per-position
        training on sequence rows; only models whose :meth:`position_training_error` is None have them."""
        raise NotImplementedError

    def position_training_error(self) -> str | None:
        """Why this model cannot train on sequence rows (None: it can, by :meth:`encode_positions`)."""
        return (f"{self.model_name or type(self).__name__} encodes one query per row, so it trains on per-prefix "
                "rows only: build its train store with --train-rows prefix (the default)")

    def forward(self, batch: Batch) -> ModelOutput:
        q, v = self.encode_query(batch), self.encode_item(batch)  # (B, D) each
        return ModelOutput((q * v).sum(-1) / self.temperature, {})  # (B,)
