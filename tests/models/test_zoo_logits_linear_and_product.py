"""The linear, factorisation, product and wide models of the zoo (lr, fm, ffm, mlr, gbdt_lr, ncf, pnn,
wide_deep): bad options give a ConfigError naming the model and option, and each logit equals a hand
computation from its parts (loops over fields and pairs); the zoo's embedding_init_std, MLR's penalty group,
GBDT+LR's leaves against LightGBM, Wide&Deep's FTRL group. Their contract variants are in contract_cases.py."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch
from conftest import contract_schema, make_batch, planted_data

from ctrkit.batch import Batch, KeyedJagged
from ctrkit.models.base import logits_of
from ctrkit.models.registry import ConfigError, create_model
from ctrkit.schema import DenseFeature, Schema, SparseFeature
from ctrkit.training.ftrl import FTRL
from ctrkit.training.tasks import CTRTask

D = 3
VOCAB = {"a": 5, "b": 7, "c": 4}
GROUP = {"a": "user", "b": "item", "c": "context"}


def tiny_schema(dims: dict[str, int] | None = None, keys: tuple[str, ...] = ("a", "b", "c")) -> Schema:
    dims = dims or {}
    return Schema(
        dense=[DenseFeature("x0"), DenseFeature("x1")],
        sparse=[SparseFeature(k, VOCAB[k], dims.get(k, D), group=GROUP[k]) for k in keys],
    )


def tiny_batch(n: int = 6, seed: int = 0, keys: tuple[str, ...] = ("a", "b", "c")) -> tuple[Batch, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = np.stack([rng.integers(0, VOCAB[k], n) for k in keys], axis=1)  # (B, F)
    dense = torch.as_tensor(rng.normal(size=(n, 2)), dtype=torch.float32)
    batch = Batch(dense, KeyedJagged.from_dense(list(keys), torch.as_tensor(ids)), torch.zeros(n))
    return batch, ids


def randomise(model: torch.nn.Module, seed: int = 0) -> None:
    """Non-zero values everywhere (zero-initialised first-order tables would hide mistakes)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)


@torch.no_grad()
def linear_by_loops(model_linear, batch: Batch, ids: np.ndarray, keys=("a", "b", "c")) -> list[float]:
    out = []
    for r in range(len(ids)):
        s = float(model_linear.bias) if model_linear.bias is not None else 0.0
        for f, k in enumerate(keys):
            s += float(model_linear.ebc.table_weight(k)[ids[r, f], 0])
        if model_linear.dense is not None:
            s += sum(float(model_linear.dense.weight[0, j] * batch.dense[r, j]) for j in range(2))
        out.append(s)
    return out


# ---- bad options --------------------------------------------------------------------------------
@pytest.mark.parametrize("name, params, match", [
    ("pnn", {"product": "cross"}, "pnn: unknown product='cross'"),
    ("pnn", {"product_units": 0}, "pnn: product_units"),
    ("mlr", {"regions": 0}, "mlr: regions"),
    ("mlr", {"l1": -1.0}, "mlr: l1"),
    ("mlr", {"init_std": 0.0}, "mlr: init_std"),
    ("deepfm", {"embedding_init_std": 0.0}, "deepfm: embedding_init_std must be > 0"),
    ("xdeepfm", {"embedding_init_std": -1e-4}, "xdeepfm: embedding_init_std must be > 0"),
    ("gbdt_lr", {"sparse_as": "onehot"}, "gbdt_lr: unknown sparse_as='onehot'"),
    ("gbdt_lr", {"num_leaves": 1}, "gbdt_lr: needs num_trees >= 1 and num_leaves >= 2"),
    ("wide_deep", {"crosses": (("user", "tags"),)}, "wide_deep: crosses entry"),
    ("wide_deep", {"crosses": (("user", "nope"),)}, "wide_deep: crosses entry"),
    ("wide_deep", {"crosses": (("user", "item"), ("user", "item"))}, "wide_deep: crosses lists"),
    ("wide_deep", {"cross_buckets": 0}, "wide_deep: cross_buckets"),
    ("ncf", {"user_feature": "nope"}, "ncf: user_feature='nope'"),
    ("ncf", {"user_feature": "item"}, "ncf: user_feature and item_feature are both 'item'"),
    ("ffm", {"embedding_dim": 0}, "ffm: embedding dims must be >= 1"),
])
def test_bad_option_names_model_and_option(name, params, match):
    with pytest.raises(ConfigError, match=match):
        create_model(name, contract_schema(), **params)


def test_ffm_needs_two_sparse_fields():
    with pytest.raises(ConfigError, match="ffm needs at least 2 sparse fields"):
        create_model("ffm", tiny_schema(keys=("a",)))


@pytest.mark.parametrize("name", ["fm", "ffm", "pnn"])
def test_unequal_dims_rejected_by_fm_like_models(name):
    with pytest.raises(ConfigError, match=f"{name} needs one embedding dim"):
        create_model(name, tiny_schema(dims={"b": 5}))
    if name == "ffm":  # ffm re-creates its tables: choosing D fixes it
        create_model("ffm", tiny_schema(dims={"b": 5}), embedding_dim=2)


def test_ncf_without_user_or_item_group():
    with pytest.raises(ConfigError, match="ncf needs a item id.*item_feature"):
        create_model("ncf", tiny_schema(keys=("a", "c")))
    with pytest.raises(ConfigError, match="ncf needs a user id.*user_feature"):
        create_model("ncf", tiny_schema(keys=("b", "c")))
    model = create_model("ncf", tiny_schema(keys=("b", "c")), user_feature="c")  # named option works
    assert (model.user, model.item) == ("c", "b")


def test_gbdt_lr_forward_before_prefit_says_how_to_fix():
    model = create_model("gbdt_lr", contract_schema(), num_trees=3)
    batch = make_batch(planted_data(8), slice(0, 8))
    with pytest.raises(RuntimeError, match=r"not fitted; call model.prefit\(train_batches\)"):
        logits_of(model(batch))


# ---- hand computations ----------------------------------------------------------------------------
def test_lr_logit_is_bias_plus_weights():
    model = create_model("lr", tiny_schema())
    randomise(model)
    batch, ids = tiny_batch()
    torch.testing.assert_close(logits_of(model(batch)), torch.tensor(linear_by_loops(model.linear, batch, ids)))


@pytest.mark.parametrize("dense_interaction", [True, False])
def test_fm_logit_is_bias_linear_and_pairwise_sum(dense_interaction):
    model = create_model("fm", tiny_schema(), dense_interaction=dense_interaction)
    randomise(model, 1)
    batch, ids = tiny_batch()
    expected = linear_by_loops(model.linear, batch, ids)
    for r in range(len(ids)):
        vecs = [model.embedding.ebc.table_weight(k)[ids[r, f]] for f, k in enumerate("abc")]
        if dense_interaction:
            vecs += [model.dense_vectors[j] * batch.dense[r, j] for j in range(2)]
        for i in range(len(vecs)):
            for j in range(i + 1, len(vecs)):
                expected[r] += float(sum(vecs[i][d] * vecs[j][d] for d in range(D)).detach())
    torch.testing.assert_close(logits_of(model(batch)), torch.tensor(expected), rtol=1e-5, atol=1e-5)


def test_ffm_logit_uses_field_aware_vectors():
    model = create_model("ffm", tiny_schema(), embedding_dim=2)
    randomise(model, 2)
    batch, ids = tiny_batch()
    F, Dv = 5, 2  # 3 sparse + 2 dense fields

    def v(r: int, i: int, j: int) -> torch.Tensor:  # v_{i, f_j} x_i
        if i < 3:
            return model.embedding.table_weight("abc"[i])[ids[r, i]].view(F, Dv)[j]
        return model.dense_vectors[i - 3, j] * batch.dense[r, i - 3]

    expected = linear_by_loops(model.linear, batch, ids)
    for r in range(len(ids)):
        for i in range(F):
            for j in range(i + 1, F):
                expected[r] += float((v(r, i, j) * v(r, j, i)).sum().detach())
    torch.testing.assert_close(logits_of(model(batch)), torch.tensor(expected), rtol=1e-5, atol=1e-5)


def test_mlr_equals_explicit_mixture_and_is_stable():
    model = create_model("mlr", tiny_schema(), regions=4)
    randomise(model, 3)
    batch, ids = tiny_batch()
    m = 4
    out = logits_of(model(batch))
    with torch.no_grad():  # the reference reads parameters as plain numbers
        for r in range(len(ids)):
            s = [float(model.bias[c]) for c in range(2 * m)]
            for c in range(2 * m):
                s[c] += sum(float(model.sparse.table_weight(k)[ids[r, f], c]) for f, k in enumerate("abc"))
                s[c] += sum(float(model.dense.weight[c, j] * batch.dense[r, j]) for j in range(2))
            gate = [math.exp(u) for u in s[:m]]
            p = sum(g / sum(gate) / (1 + math.exp(-w)) for g, w in zip(gate, s[m:]))
            assert float(out[r]) == pytest.approx(math.log(p / (1 - p)), rel=1e-4, abs=1e-4)
    with torch.no_grad():  # p within 1e-40 of 0 or 1: the log-space logit stays finite and exact-ish
        model.bias[m:] = 100.0
        assert torch.isfinite(logits_of(model(batch))).all() and (logits_of(model(batch)) > 90).all()
        model.bias[m:] = -100.0
        assert (logits_of(model(batch)) < -90).all()


FIELD_EMBEDDING_MODELS = ("afm", "autoint", "dcn", "dcnv2", "deepfm", "fibinet", "fm", "nfm", "pnn", "wide_deep",
                          "xdeepfm")


@pytest.mark.parametrize("name", FIELD_EMBEDDING_MODELS)
def test_embedding_init_std_sets_the_field_embeddings_start(name):
    """N(0, std^2) at the given std (the zoo default 0.01, the MovieLens configs' 1e-4); null: torchrec's
    U(±sqrt(1/rows)) start, which for a 3-row table reaches far beyond either."""
    def table(model):
        weights = [p.detach().reshape(-1) for p in model.embedding.ebc.parameters()]
        return torch.cat(weights)

    torch.manual_seed(0)
    stds = {std: float(table(create_model(name, contract_schema(), embedding_init_std=std)).std())
            for std in (1e-4, 0.01)}
    assert 0.8e-4 < stds[1e-4] < 1.2e-4 and 0.8e-2 < stds[0.01] < 1.2e-2
    assert float(table(create_model(name, contract_schema())).std()) == pytest.approx(stds[0.01], rel=0.2)
    uniform = table(create_model(name, contract_schema(), embedding_init_std=None))
    assert float(uniform.abs().max()) > 0.1  # U(±sqrt(1/n)) with small tables: far wider than N(0, 0.01^2)


def test_mlr_init_std_starts_every_region_weight_small():
    torch.manual_seed(0)
    small = create_model("mlr", tiny_schema(), regions=4, init_std=1e-4)
    weights = torch.cat([small.sparse.table_weight(k).reshape(-1) for k in "abc"] + [small.dense.weight.reshape(-1)])
    assert 0.5e-4 < float(weights.detach().std()) < 2e-4 and float(weights.detach().abs().max()) < 1e-3
    default = create_model("mlr", tiny_schema(), regions=4)  # uniform tables: far larger starting weights
    assert float(default.sparse.table_weight("a").detach().abs().max()) > 1e-2
    batch, _ = tiny_batch()
    torch.testing.assert_close(logits_of(small(batch)), torch.zeros(len(batch)), rtol=0, atol=1e-3)  # every logit starts ~0


def test_mlr_penalty_group_formula_and_task_loss():
    """The "regions" group's penalty is l1·Σ|W| + l2·ΣW² + l21·Σ_rows‖W_row‖₂ over the id tables (a row =
    one id's 2m weights) and the dense weights (a row = one dense value's 2m weights); the task adds it."""
    model = create_model("mlr", tiny_schema(), regions=2, l1=0.1, l2=0.2, l21=0.3)
    randomise(model, 9)
    batch, _ = tiny_batch()
    (group,) = model.param_groups()
    assert group.name == "regions" and group.optimizer is None and group.penalised
    ws = [model.sparse.table_weight(k) for k in "abc"] + [model.dense.weight.t()]  # each (rows, 2m)
    expected = sum(0.1 * float(w.abs().sum()) + 0.2 * float((w**2).sum())
                   + 0.3 * sum(float(torch.linalg.vector_norm(row)) for row in w) for w in ws)
    assert float(group.penalty().detach()) == pytest.approx(expected, rel=1e-5)
    loss, logs = CTRTask().bind(model).loss(model, batch)
    bce = torch.nn.functional.binary_cross_entropy_with_logits(logits_of(model(batch)), batch.labels)
    assert set(logs) == {"bce", "penalty/regions"}
    torch.testing.assert_close(loss, bce + group.penalty())
    # no penalty by default: the group is declared but adds nothing to the loss
    plain = create_model("mlr", tiny_schema())
    assert not plain.param_groups()[0].penalised and float(plain.param_groups()[0].penalty().detach()) == 0.0
    assert CTRTask().bind(plain).loss(plain, batch)[1] == {}


def test_gbdt_lr_declares_prefit_and_is_not_exportable():
    from ctrkit.models.gbdt_lr import GBDTLR

    assert GBDTLR.needs_prefit and not GBDTLR.exportable  # LightGBM runs inside forward


def test_gbdt_lr_leaves_match_lightgbm_and_state_dict_round_trips():
    lgb = pytest.importorskip("lightgbm")
    schema = contract_schema()
    data = planted_data(1200, seed=3)
    model = create_model("gbdt_lr", schema, num_trees=6, num_leaves=5, num_threads=1)
    model.prefit([make_batch(data, slice(s, s + 400)) for s in range(0, 1200, 400)])
    randomise(model, 4)
    batch = make_batch(data, slice(0, 50))
    # the trees' input by hand: dense values, then the single-valued sparse ids
    x = np.array([list(data["dense"][r]) + [data[k][r] for k in ("user", "item", "cat", "ctx")]
                  for r in range(50)], dtype=np.float64)
    booster = lgb.Booster(model_str=bytes(model.trees.numpy()).decode())
    leaves = booster.predict(x, pred_leaf=True)
    assert leaves.shape == (50, 6)
    np.testing.assert_array_equal(model.leaf_indices(batch).numpy(), leaves)
    expected = [float(model.bias) + sum(float(model.leaf_weights.table_weight(f"tree{t}")[leaves[r, t], 0])
                                        for t in range(6)) for r in range(50)]
    with torch.no_grad():
        torch.testing.assert_close(logits_of(model(batch)), torch.tensor(expected))
    # an unfitted model takes the trees (a buffer of another length) from a checkpoint
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    fresh = create_model("gbdt_lr", schema, num_trees=6, num_leaves=5, num_threads=1)
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    with torch.no_grad():
        assert torch.equal(logits_of(fresh(batch)), logits_of(model(batch)))


def test_ncf_is_neumf():
    model = create_model("ncf", tiny_schema(), gmf_dim=2, mlp_dim=3, dnn_hidden=(4,))
    randomise(model, 5)
    batch, ids = tiny_batch()
    assert (model.user, model.item) == ("a", "b")  # first sparse feature of groups user / item
    wu, wi = model.embedding.table_weight("ncf_a"), model.embedding.table_weight("ncf_b")
    lin, head = model.head.tower.layers[0], model.head.out
    out = logits_of(model(batch))
    for r in range(len(ids)):
        u, i = wu[ids[r, 0]], wi[ids[r, 1]]
        gmf = [float(u[d] * i[d]) for d in range(2)]
        x = torch.cat([u[2:], i[2:]])
        h = [max(0.0, float(lin.bias[o] + sum(lin.weight[o, c] * x[c] for c in range(6)))) for o in range(4)]
        z = float(head.bias) + sum(float(head.weight[0, c]) * v for c, v in enumerate(gmf + h))
        assert float(out[r]) == pytest.approx(z, rel=1e-5, abs=1e-5)


def test_pnn_inner_product_layer_then_dense_concat():
    model = create_model("pnn", tiny_schema(), product="inner", product_units=4, dnn_hidden=(3,))
    randomise(model, 6)
    batch, ids = tiny_batch()
    prod, lin, head = model.product, model.deep.tower.layers[0], model.deep.out
    out = logits_of(model(batch))
    for r in range(len(ids)):
        e = [model.embedding.ebc.table_weight(k)[ids[r, f]] for f, k in enumerate("abc")]
        z = torch.cat(e)
        pairs = [float(e[i] @ e[j]) for i in range(3) for j in range(i + 1, 3)]
        l1 = [max(0.0, float(prod.bias[n] + prod.linear_z.weight[n] @ z
                             + sum(prod.linear_inner.weight[n, p] * pairs[p] for p in range(3))))
              for n in range(4)]
        x = l1 + [float(batch.dense[r, 0]), float(batch.dense[r, 1])]  # continuous features join l_1
        h = [max(0.0, float(lin.bias[o] + sum(lin.weight[o, c] * x[c] for c in range(6)))) for o in range(3)]
        expected = float(head.bias) + sum(float(head.weight[0, c]) * h[c] for c in range(3))
        assert float(out[r]) == pytest.approx(expected, rel=1e-4, abs=1e-5)


def test_wide_deep_cross_ids_wide_plus_deep_and_ftrl_group():
    schema = tiny_schema()
    model = create_model("wide_deep", schema, dnn_hidden=(4,), crosses=(("a", "b"), ("b", "c")),
                         cross_buckets=30)
    randomise(model, 7)
    batch, ids = tiny_batch(n=40, seed=8)
    # (a, b): 5 * 7 = 35 > 30 buckets -> Knuth hash of a * 7 + b; (b, c): 28 <= 30 -> exact b * 4 + c
    got = model.cross_features(batch)
    for r in range(40):
        k = int(ids[r, 0]) * 7 + int(ids[r, 1])
        h = (k * 0x9E3779B97F4A7C15) % (1 << 64)
        assert int(got["a_x_b"][0][r]) == (h >> 16) % (1 << 47) % 30
        assert int(got["b_x_c"][0][r]) == int(ids[r, 1]) * 4 + int(ids[r, 2])
    expected = linear_by_loops(model.linear, batch, ids)
    for r in range(40):
        for key in ("a_x_b", "b_x_c"):
            expected[r] += float(model.cross_weights.table_weight(key)[got[key][0][r], 0])
    deep_in = torch.cat([model.embedding.concat(batch), batch.dense], dim=1)
    deep = model.deep.out(model.deep.tower(deep_in)).squeeze(1)
    torch.testing.assert_close(logits_of(model(batch)), torch.tensor(expected) + deep, rtol=1e-5, atol=1e-5)

    # the wide part alone goes to FTRL with L1, the rest to Adam / Adagrad
    (wide,) = model.param_groups()
    assert wide.name == "wide" and wide.optimizer == "ftrl" and not wide.penalised
    assert {id(p) for p in wide.params} == {
        id(p) for p in [*model.linear.parameters(), *model.cross_weights.parameters()]
    }
    labels = torch.as_tensor((ids[:, 0] % 2 == 0).astype(np.float32))
    touched = torch.as_tensor(np.unique(ids[:, 0]))
    nonzero = {l1: ftrl_wide_deep(schema, batch, labels, l1)(touched) for l1 in (0.0, 5.0)}
    assert nonzero[0.0] == len(touched) and nonzero[5.0] < len(touched)  # L1: exact zeros


def ftrl_wide_deep(schema: Schema, batch: Batch, labels: torch.Tensor, l1: float):
    """Train wide_deep 5 steps with FTRL(l1) on the wide part; -> f(rows) = non-zero weights of feature a."""
    torch.manual_seed(0)
    model = create_model("wide_deep", schema, dnn_hidden=(4,), crosses=(("a", "b"),), cross_buckets=30)
    (group,) = model.param_groups()
    wide = list(group.params)
    tables = {id(p) for p in model.embedding_parameters()}
    rest = [p for p in model.parameters() if all(p is not w for w in wide)]
    opts = [FTRL(wide, alpha=0.5, l1=l1),
            torch.optim.Adam([p for p in rest if id(p) not in tables], lr=1e-2),
            torch.optim.Adagrad([p for p in rest if id(p) in tables], lr=0.1)]
    for _ in range(5):
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits_of(model(batch)), labels)
        for opt in opts:
            opt.zero_grad()
        loss.backward()
        for opt in opts:
            opt.step()
    weights = model.linear.ebc.table_weight("a")[:, 0].detach()
    return lambda rows: int((weights[rows] != 0).sum())
