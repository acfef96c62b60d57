"""Sparse-aware optimizers: RowWiseAdagrad vs a per-row loop, sparse == dense gradients, touched-row
L2, exact resume through state_dict; groups from the model's declarations (embedding tables, "wide")."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from ctrkit.errors import ConfigError
from ctrkit.models.base import CTRModel, ParamGroup, logits_of
from ctrkit.training.config import TrainConfig
from ctrkit.training.optim import (
    LazyAdam,
    OptimizerSet,
    RowWiseAdagrad,
    build_dense_optimizer,
    build_optimizers,
    coalesce_rows,
    split_parameters,
)


class Tiny(CTRModel):
    def __init__(self, rows: int = 30, dim: int = 4, sparse: bool = True) -> None:
        super().__init__()
        self.emb = nn.EmbeddingBag(rows, dim, mode="sum", sparse=sparse)
        self.lin = nn.Linear(dim, 1)

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.lin(self.emb(ids, offsets)).squeeze(1)

    def embedding_parameters(self):
        yield self.emb.weight


def _batches(n: int = 4, rows: int = 30, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(0, rows // 2, (24,), generator=g)  # half the rows never touched, duplicates
        offsets = torch.arange(0, 24, 3)
        y = torch.randint(0, 2, (8,), generator=g).float()
        out.append((ids, offsets, y))
    return out


def _run(model, opt, batches):
    for ids, offsets, y in batches:
        opt.zero_grad(set_to_none=True)
        nn.functional.binary_cross_entropy_with_logits(model(ids, offsets), y).backward()
        opt.step()


# counting (R <= 4 x lookups: fewer rows than ids, and more), torch's coalesce() (more than 4x), edge
@pytest.mark.parametrize("rows, lookups", [(7, 40), (30, 12), (50, 12), (5, 5)])
def test_coalesce_rows_equals_torch_coalesce(rows, lookups):
    g = torch.Generator().manual_seed(rows)
    ids = torch.randint(0, rows, (lookups,), generator=g)
    grad = torch.sparse_coo_tensor(ids[None], torch.randn(lookups, 3, generator=g, dtype=torch.float64), (rows, 3),
                                   check_invariants=True)
    got, want = coalesce_rows(grad), grad.coalesce()
    assert got.is_coalesced() and torch.equal(got.indices(), want.indices())
    torch.testing.assert_close(got.values(), want.values())
    assert coalesce_rows(got) is got  # already coalesced: returned as is
    dense = torch.randn(4, 3)
    assert coalesce_rows(dense) is dense


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_coalesce_rows_native_sum_equals_index_add(dtype, monkeypatch):
    """The counting path's row sums by the native loop (nn/embedding_update.py) are index_add_'s floats."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 40, (300,), generator=g)
    grad = torch.sparse_coo_tensor(ids[None], torch.randn(300, 16, generator=g, dtype=dtype) * 1e3, (100, 16))
    native = coalesce_rows(grad)
    monkeypatch.setenv("CTRKIT_NATIVE_KERNELS", "0")
    plain = coalesce_rows(grad)
    assert torch.equal(native.indices(), plain.indices()) and torch.equal(native.values(), plain.values())


def test_rowwise_adagrad_matches_per_row_loop():
    torch.manual_seed(0)
    model = Tiny()
    W = model.emb.weight.detach().clone().double()
    acc = torch.zeros(W.shape[0], dtype=torch.float64)
    opt = RowWiseAdagrad([model.emb.weight], lr=0.1, eps=1e-8)
    for ids, offsets, y in _batches():
        opt.zero_grad()
        nn.functional.binary_cross_entropy_with_logits(model(ids, offsets), y).backward()
        grad = model.emb.weight.grad
        assert grad.is_sparse and not grad.is_coalesced()
        dense_grad = grad.to_dense().double()
        opt.step()
        for r in range(W.shape[0]):  # naive reference, one row at a time
            if r not in ids.tolist():
                continue
            g = dense_grad[r]
            acc[r] += (g * g).mean()
            W[r] -= 0.1 * g / (acc[r].sqrt() + 1e-8)
    torch.testing.assert_close(model.emb.weight.detach().double(), W, rtol=1e-5, atol=1e-6)
    assert torch.equal(opt.state[model.emb.weight]["sum"].double() > 0, acc > 0)


@pytest.mark.parametrize("sparse_opt", ["adagrad", "rowwise_adagrad", "sparse_adam", "sgd"])
@pytest.mark.parametrize("l2", [0.0, 0.05])
def test_sparse_and_dense_gradients_agree(sparse_opt, l2):
    cfg = TrainConfig(lr=0.05, sparse_optimizer=sparse_opt, embedding_l2=l2, dense_optimizer="adam")
    torch.manual_seed(1)
    a = Tiny(sparse=True)
    b = Tiny(sparse=False)
    b.load_state_dict(a.state_dict())
    before = a.emb.weight.detach().clone()
    oa, ob = build_optimizers(a, cfg), build_optimizers(b, cfg)
    _run(a, oa, _batches())
    _run(b, ob, _batches())
    torch.testing.assert_close(a.emb.weight, b.emb.weight, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(a.lin.weight, b.lin.weight, rtol=1e-5, atol=1e-6)
    # rows 15.. were never in a batch: unchanged, L2 included (mini-batch aware)
    assert torch.equal(a.emb.weight[15:], before[15:])
    assert not torch.equal(a.emb.weight[:15], before[:15])


@pytest.mark.parametrize("layout", ["sparse", "dense"])
@pytest.mark.parametrize("maximize", [False, True])
@pytest.mark.parametrize("rows", [300, 30, 7])  # coalesced by torch's sort / by counting (24 ids a batch)
def test_lazy_adam_is_torch_sparse_adam_bit_for_bit(rows, maximize, layout, monkeypatch):
    """LazyAdam's weights and moments equal torch.optim.SparseAdam's exactly, step after step, on batches with
    duplicate ids and untouched rows (both given the gradient coalesced once, as OptimizerSet does; LazyAdam
    also given it as a dense tensor, a small table's gradient, whose zero rows are the untouched ones); its
    state dict loads into torch's optimizer and back. The dense gradient takes the torch path here: the native
    kernel's sqrt is correctly rounded where ATen's may not be, so it is compared in tests/nn/test_embedding_update.py
    (bit for bit with a correctly rounded sqrt, within rounding of ATen's)."""
    monkeypatch.setenv("CTRKIT_NATIVE_KERNELS", "0")
    torch.manual_seed(4)
    a = Tiny(rows=rows)
    b = copy.deepcopy(a)
    ours = LazyAdam([a.emb.weight], lr=0.05, betas=(0.8, 0.99), maximize=maximize)
    ref = torch.optim.SparseAdam([b.emb.weight], lr=0.05, betas=(0.8, 0.99), maximize=maximize)
    for ids, offsets, y in _batches(5, rows=rows):
        for model, opt in ((a, ours), (b, ref)):
            opt.zero_grad(set_to_none=True)
            nn.functional.binary_cross_entropy_with_logits(model(ids % rows, offsets), y).backward()
            model.emb.weight.grad = coalesce_rows(model.emb.weight.grad)
            if opt is ours and layout == "dense":
                model.emb.weight.grad = model.emb.weight.grad.to_dense()
            opt.step()
        assert torch.equal(a.emb.weight, b.emb.weight)
    s_ours, s_ref = ours.state[a.emb.weight], ref.state[b.emb.weight]
    assert s_ours["step"] == s_ref["step"] == 5
    assert torch.equal(s_ours["exp_avg"], s_ref["exp_avg"]) and torch.equal(s_ours["exp_avg_sq"], s_ref["exp_avg_sq"])
    ref.load_state_dict(ours.state_dict())  # the same state dict format as torch's (checkpoints)
    ours.load_state_dict(ref.state_dict())


def test_touched_row_l2_formula_with_sgd():
    torch.manual_seed(2)
    model = Tiny()
    cfg = TrainConfig(lr=0.1, sparse_optimizer="sgd", dense_optimizer="sgd", embedding_l2=0.3)
    opt = build_optimizers(model, cfg)
    ids, offsets, y = _batches(1)[0]
    W0 = model.emb.weight.detach().clone()
    opt.zero_grad()
    nn.functional.binary_cross_entropy_with_logits(model(ids, offsets), y).backward()
    g = model.emb.weight.grad.to_dense()
    opt.step()
    touched = torch.zeros(W0.shape[0], dtype=torch.bool)
    touched[ids] = True
    expected = torch.where(touched[:, None], W0 - 0.1 * (g + 0.3 * W0), W0)
    torch.testing.assert_close(model.emb.weight.detach(), expected)


@pytest.mark.parametrize("sparse_opt", ["adagrad", "rowwise_adagrad", "sparse_adam", "sgd"])
@pytest.mark.parametrize("dense_opt", ["adam", "adamw", "sgd", "adagrad"])
def test_state_dict_resume_is_exact(sparse_opt, dense_opt):
    cfg = TrainConfig(lr=0.05, sparse_optimizer=sparse_opt, dense_optimizer=dense_opt, weight_decay=0.01)
    torch.manual_seed(3)
    ref = Tiny()
    resumed = copy.deepcopy(ref)
    batches = _batches(6)
    o_ref = build_optimizers(ref, cfg)
    _run(ref, o_ref, batches)

    o1 = build_optimizers(resumed, cfg)
    _run(resumed, o1, batches[:3])
    state = copy.deepcopy({"model": resumed.state_dict(), "optim": o1.state_dict()})
    fresh = Tiny()
    fresh.load_state_dict(state["model"])
    o2 = build_optimizers(fresh, cfg)
    o2.load_state_dict(state["optim"])
    _run(fresh, o2, batches[3:])
    for p, q in zip(ref.parameters(), fresh.parameters()):
        assert torch.equal(p, q)


def test_split_and_set_shapes():
    model = Tiny()
    dense, emb = split_parameters(model)
    assert emb == [model.emb.weight] and dense == [model.lin.weight, model.lin.bias]
    model.lin.bias.requires_grad_(False)  # frozen parameters are in no group
    assert split_parameters(model)[0] == [model.lin.weight]
    model.lin.bias.requires_grad_(True)
    opt = build_optimizers(model, TrainConfig())
    assert isinstance(opt, OptimizerSet) and opt.embedding_params == [model.emb.weight]
    with pytest.raises(ValueError, match="no sparse part"):
        opt.load_state_dict({"dense": opt.dense.state_dict(), "sparse": None})


def test_embedding_tables_are_the_declared_ones():
    """A zoo model's sparse group is exactly its declared embedding_parameters() (its collections' tables)."""
    from conftest import contract_schema

    from ctrkit.models.registry import create_model
    from ctrkit.nn.embedding import EmbeddingCollection

    model = create_model("deepfm", contract_schema(), dnn_hidden=(8,))
    tables = {id(p) for m in model.modules() if isinstance(m, EmbeddingCollection) for p in m.embedding_parameters()}
    assert tables and {id(p) for p in model.embedding_parameters()} == tables
    opt = build_optimizers(model, TrainConfig())
    assert {id(p) for p in opt.embedding_params} == tables
    assert {id(p) for p in opt.dense_params} == {id(p) for p in model.parameters()} - tables


def test_build_optimizers_needs_a_ctr_model():
    with pytest.raises(ConfigError, match="needs a ctrkit CTRModel"):
        build_optimizers(nn.Linear(2, 1), TrainConfig())


def wide_group(model: CTRModel) -> ParamGroup:
    (group,) = [g for g in model.param_groups() if g.name == "wide"]
    return group


def test_wide_part_trained_with_ftrl_l1_gives_exact_zeros():
    """train.wide_optimizer=ftrl puts wide_deep's "wide" group in an FTRL optimizer (and nowhere else)."""
    from conftest import contract_schema, make_batch, planted_data

    from ctrkit.models.registry import create_model
    from ctrkit.training.config import TrainConfig
    from ctrkit.training.ftrl import FTRL
    from ctrkit.training.optim import build_optimizers

    torch.manual_seed(0)
    model = create_model("wide_deep", contract_schema(), dnn_hidden=(8,), crosses=(("user", "item"),))
    cfg = TrainConfig(wide_optimizer="ftrl", ftrl_l1=5.0, ftrl_alpha=0.1)
    opt = build_optimizers(model, cfg)
    assert wide_group(model).optimizer == "ftrl"
    wide = {id(p) for p in wide_group(model).params}
    assert isinstance(opt.wide, FTRL)
    assert {id(p) for g in opt.wide.param_groups for p in g["params"]} == wide
    assert not wide & {id(p) for p in opt.dense_params + opt.embedding_params}
    data = planted_data(512)
    for s in range(0, 512, 64):
        batch = make_batch(data, slice(s, s + 64))
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits_of(model(batch)), batch.labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    wide_values = torch.cat([p.detach().reshape(-1) for p in wide_group(model).params])
    assert (wide_values == 0).float().mean() > 0.5  # strong L1: most wide weights exactly zero
    state = opt.state_dict()
    assert state["wide"] is not None
    build_optimizers(model, cfg).load_state_dict(state)
    # without wide_optimizer=ftrl the wide part stays with the dense / embedding optimizers
    default = build_optimizers(model, TrainConfig())
    assert default.wide is None and wide <= {id(p) for p in default.dense_params + default.embedding_params}


def test_ftrl_needs_a_wide_part():
    from conftest import contract_schema

    from ctrkit.models.registry import ConfigError, create_model
    from ctrkit.training.config import TrainConfig
    from ctrkit.training.optim import build_optimizers

    model = create_model("lr", contract_schema())
    with pytest.raises(ConfigError, match="wide_optimizer=ftrl needs a model with a wide part.*'lr' declares none"):
        build_optimizers(model, TrainConfig(wide_optimizer="ftrl"))


class TwoGroups(Tiny):
    """Two declared groups: one for FTRL (named other than "wide"), one with a penalty only."""

    def param_groups(self) -> list[ParamGroup]:
        return [ParamGroup("first_order", [self.lin.bias], optimizer="ftrl"), ParamGroup("reg", [self.lin.weight], l2=1.0)]


def test_ftrl_takes_the_groups_that_declare_it_whatever_their_name():
    from ctrkit.training.ftrl import FTRL

    model = TwoGroups()
    opt = build_optimizers(model, TrainConfig(wide_optimizer="ftrl"))
    assert isinstance(opt.wide, FTRL)
    assert [id(p) for g in opt.wide.param_groups for p in g["params"]] == [id(model.lin.bias)]
    assert id(model.lin.weight) in {id(p) for p in opt.dense_params}  # a penalty alone keeps the dense optimizer
    assert id(model.lin.bias) not in {id(p) for p in opt.dense_params + opt.embedding_params}


@pytest.mark.parametrize("sparse,optimizer", [(False, "sparse_adam"), (True, "adagrad"), (True, "sparse_adam")])
def test_sparse_steps_print_no_torch_invariants_warning(sparse, optimizer):
    """Sparse gradients (and dense ones that SparseAdam gets as row-sparse) must not print torch's "Sparse
    invariant checks are implicitly disabled" warning into a user's run (torch's sparse Adagrad did, for
    the default optimizer). A fresh interpreter each time, since torch warns once per process."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import torch, warnings
        from torch import nn
        from ctrkit.models.base import CTRModel
        from ctrkit.training.config import TrainConfig
        from ctrkit.training.optim import build_optimizers

        class Dense(CTRModel):
            def __init__(self):
                super().__init__()
                self.emb = nn.EmbeddingBag(10, 4, mode="sum", sparse=SPARSE)
            def forward(self, ids, offsets):
                return self.emb(ids, offsets).sum(1)
            def embedding_parameters(self):
                yield self.emb.weight

        m = Dense()
        opt = build_optimizers(m, TrainConfig(sparse_optimizer="OPTIMIZER"))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            m(torch.tensor([1, 2, 3]), torch.tensor([0, 2])).sum().backward()
            opt.step()
        print(len([w for w in caught if "invariant" in str(w.message)]))
    """).replace("SPARSE", str(sparse)).replace("OPTIMIZER", optimizer)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0", out.stdout + out.stderr


@pytest.mark.parametrize("name, cls", [("adam", torch.optim.Adam), ("adamw", torch.optim.AdamW)])
def test_dense_optimizer_is_fused_and_matches_the_per_parameter_loop(name, cls):
    """Adam / AdamW use torch's fused kernel on the CPU, with the same updates as torch's plain loop."""
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 1))
    fused = copy.deepcopy(ref)
    opt = build_dense_optimizer(name, list(fused.parameters()), lr=0.05, weight_decay=0.01)
    assert opt.param_groups[0]["fused"] is True
    plain = cls(ref.parameters(), lr=0.05, weight_decay=0.01, foreach=False)
    x, y = torch.randn(16, 5), torch.rand(16, 1)
    for _ in range(5):
        for m, o in ((ref, plain), (fused, opt)):
            o.zero_grad(set_to_none=True)
            nn.functional.binary_cross_entropy_with_logits(m(x), y).backward()
            o.step()
    for a, b in zip(ref.parameters(), fused.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
