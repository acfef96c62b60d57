"""The model contract (models/base.py): ParamGroup penalties against the direct formula, declared
capabilities, embedding tables collected from the model's collections, the RetrievalModel protocol."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ctrkit.batch import Batch
from ctrkit.errors import ConfigError
from ctrkit.models.base import CTRModel, ModelOutput, ParamGroup, RetrievalModel, logits_of
from ctrkit.nn.embedding_factory import make_embeddings
from ctrkit.schema import TableSpec


def penalty_by_loops(mats: list[torch.Tensor], l1: float, l2: float, l21: float) -> float:
    """The penalty over matrices already laid out as (rows, ...), with python loops over the entries."""
    total = 0.0
    for w in mats:
        rows = w.reshape(w.shape[0], -1).tolist()
        for row in rows:
            total += l1 * sum(abs(x) for x in row) + l2 * sum(x * x for x in row)
            total += l21 * (sum(x * x for x in row) + 1e-12) ** 0.5
    return total


@pytest.mark.parametrize("l1, l2, l21", [(0.1, 0.0, 0.0), (0.0, 0.2, 0.0), (0.0, 0.0, 0.3), (0.1, 0.2, 0.3)])
def test_penalty_equals_the_direct_formula(l1, l2, l21):
    g = torch.Generator().manual_seed(0)
    table = nn.Parameter(torch.randn(7, 4, generator=g))  # rows = ids
    linear = nn.Parameter(torch.randn(4, 3, generator=g))  # nn.Linear weight (out, in): rows = inputs
    bias = nn.Parameter(torch.randn(5, generator=g))  # 1-D: every entry is a row
    group = ParamGroup("g", [table, linear, bias], l1=l1, l2=l2, l21=l21, row_dims=[0, 1, 0])
    expected = penalty_by_loops([table, linear.t(), bias[:, None]], l1, l2, l21)
    assert float(group.penalty().detach()) == pytest.approx(expected, rel=1e-5)
    assert group.penalised


def test_penalty_of_an_all_zero_row_has_a_finite_gradient():
    w = nn.Parameter(torch.zeros(3, 2))
    ParamGroup("z", [w], l21=1.0).penalty().backward()
    assert torch.isfinite(w.grad).all()


def test_group_without_penalty_is_zero_and_bad_options_are_config_errors():
    p = nn.Parameter(torch.ones(2, 2))
    group = ParamGroup("wide", [p], optimizer="ftrl")
    assert not group.penalised and float(group.penalty().detach()) == 0.0
    with pytest.raises(ConfigError, match="optimizer 'adam' is not one of"):
        ParamGroup("x", [p], optimizer="adam")
    with pytest.raises(ConfigError, match="l21 must be >= 0"):
        ParamGroup("x", [p], l21=-1.0)
    with pytest.raises(ConfigError, match="row_dims needs one 0 or 1 per parameter"):
        ParamGroup("x", [p], row_dims=[0, 1])


class Tiny(CTRModel):
    """Two collections, one of them registered twice (shared): its tables count once."""

    def __init__(self) -> None:
        super().__init__()
        self.a = make_embeddings(tables=[TableSpec("a", 5, 2, ("fa",))])
        self.b = make_embeddings(tables=[TableSpec("b", 6, 3, ("fb",)), TableSpec("c", 4, 3, ("fc",))])
        self.b_again = self.b
        self.head = nn.Linear(2, 1)

    def forward(self, batch: Batch) -> torch.Tensor:
        return self.head(batch.dense).squeeze(1)


def test_defaults_and_embedding_parameters_from_the_collections():
    model = Tiny()
    assert not Tiny.needs_prefit and Tiny.exportable and model.param_groups() == []
    assert model.prefit([]) is model
    tables = list(model.embedding_parameters())
    expected = [*model.a.embedding_parameters(), *model.b.embedding_parameters()]
    assert [id(p) for p in tables] == [id(p) for p in expected]
    assert all(p is not model.head.weight for p in tables)


def test_needs_prefit_without_prefit_is_refused_at_class_definition():
    with pytest.raises(TypeError, match="needs_prefit = True but does not define prefit"):
        class Broken(CTRModel):
            needs_prefit = True


def test_logits_of_and_model_output():
    logits = torch.randn(4)
    out = ModelOutput(logits, {"aux": torch.tensor(0.5)})
    assert logits_of(out) is logits and logits_of(logits) is logits
    assert out.aux_losses["aux"] == 0.5 and isinstance(out, tuple)


def test_retrieval_protocol():
    class TwoTower(nn.Module):
        def encode_query(self, batch: Batch) -> torch.Tensor:
            return batch.dense

        def encode_item(self, batch: Batch) -> torch.Tensor:
            return batch.dense

    assert isinstance(TwoTower(), RetrievalModel)
    assert not isinstance(Tiny(), RetrievalModel)
