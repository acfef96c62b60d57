"""The contract every registered model keeps (DESIGN.md §5-6), driven by the registry.

The cases (each family's variants, the schema each model is checked on, what it does with an unpooled history)
are in contract_cases.py; a registered model without variants runs with its defaults, under the test id
``<name>-defaults``.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from conftest import contract_schema, make_batch, planted_data
from contract_cases import UNPOOLED, VARIANTS, build, data_for, schema_for
from next_item import learns_next_item
from sklearn.metrics import roc_auc_score

from ctrkit.models.base import CTRModel, ModelOutput, logits_of
from ctrkit.models.registry import ConfigError, create_model, get_model_class, list_models
from ctrkit.schema import Schema, SequenceFeature
from ctrkit.training.tasks import CTRTask


def cases() -> list:
    out = []
    for name in list_models():
        if name not in VARIANTS:
            out.append(pytest.param(name, {}, id=f"{name}-defaults"))
            continue
        for i, params in enumerate(VARIANTS[name]):
            out.append(pytest.param(name, params, id=f"{name}-{i}"))
    return out


def test_variants_name_registered_models():
    assert set(VARIANTS) <= set(list_models()), sorted(set(VARIANTS) - set(list_models()))


@pytest.mark.parametrize("name", list_models())
def test_declarations(name):
    """A CTRModel with its registry name; groups and tables are the model's own parameters."""
    cls = get_model_class(name)
    assert issubclass(cls, CTRModel) and cls.model_name == name
    model = build(name, VARIANTS.get(name, [{}])[0])
    params = {id(p) for p in model.parameters()}
    tables = [id(p) for p in model.embedding_parameters()]
    assert tables and len(set(tables)) == len(tables) and set(tables) <= params
    names = [g.name for g in model.param_groups()]
    assert len(set(names)) == len(names)
    for g in model.param_groups():
        assert g.params and {id(p) for p in g.params} <= params, f"{name}: group {g.name!r}"
    assert isinstance(cls.exportable, bool) and isinstance(cls.needs_prefit, bool)
    if not cls.needs_prefit:
        assert model.prefit([]) is model  # nothing to fit


@pytest.mark.parametrize("name, params", cases())
def test_forward_loss_grads_and_consistency(name, params):
    data, schema = data_for(name), schema_for(name)
    model = build(name, params, data=data)
    batch = make_batch(data, slice(0, 64), schema)
    model.train()
    task = CTRTask().bind(model)
    torch.manual_seed(5)  # the same dropout masks for the task's forward and the reference one
    loss, logs = task.loss(model, batch)
    torch.manual_seed(5)
    out = model(batch)
    assert isinstance(out, ModelOutput), f"{name}: forward returns ModelOutput in training"
    logits = logits_of(out)
    assert logits.shape == (64,) and torch.isfinite(logits).all()
    aux = out.aux_losses
    penalties = {f"penalty/{g.name}": g.penalty() for g in model.param_groups() if g.penalised}
    bce = torch.nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)
    expected = bce + sum(aux.values(), torch.zeros(())) + sum(penalties.values(), torch.zeros(()))
    torch.testing.assert_close(loss, expected)
    assert set(logs) == ({"bce", *aux, *penalties} if aux or penalties else set())
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing, f"{name}: parameters without gradient: {missing}"

    model.eval()
    with torch.no_grad():
        assert isinstance(model(batch), ModelOutput), f"{name}: forward returns ModelOutput in eval too"
        full = logits_of(model(batch))
        again = logits_of(model(batch))
        alone = torch.stack([logits_of(model(make_batch(data, slice(i, i + 1), schema)))[0] for i in (0, 17, 63)])
    assert torch.equal(full, again), "eval must be deterministic"
    torch.testing.assert_close(alone, full[[0, 17, 63]], rtol=1e-5, atol=1e-5)


def unpooled_schema() -> Schema:
    """The contract schema plus a history kept unpooled (pooling "none"), as sequence models read it."""
    s = contract_schema()
    return Schema(dense=s.dense, sparse=s.sparse,
                  sequence=[*s.sequence, SequenceFeature("hist_seq", 5, shares="item", pooling="none")])


@pytest.mark.parametrize("name", list_models())
def test_unpooled_history(name):
    """Every model ignores, uses or rejects (ConfigError naming the feature) an unpooled history."""
    schema = unpooled_schema()
    data = planted_data(600, seed=4, schema=schema)
    params = VARIANTS.get(name, [{}])[0]
    expect = UNPOOLED.get(name, "ignores")
    if expect == "rejects":
        with pytest.raises(ConfigError, match="hist_seq"):
            build(name, params, data=data, schema=schema)
        return
    model = build(name, params, data=data, schema=schema)
    batch = make_batch(data, slice(0, 64), schema)
    loss, _ = CTRTask().bind(model).loss(model, batch)
    assert torch.isfinite(loss)
    loss.backward()
    shuffled = dict(data, hist_seq=(data["hist_seq"] * 7 + 3) % 38 + 2)  # other item ids, same lengths
    model.eval()
    with torch.no_grad():
        same = torch.equal(logits_of(model(batch)), logits_of(model(make_batch(shuffled, slice(0, 64), schema))))
    assert same == (expect == "ignores"), f"{name} should {expect.rstrip('s')} the unpooled history"


@pytest.mark.parametrize("name", list_models())
def test_no_dense_features(name):
    """Every model trains on a schema without dense features (batch.dense is (B, 0)): finite loss, a gradient
    for every parameter, and each row's logit independent of its batch."""
    base = schema_for(name)
    schema = Schema(dense=[], sparse=base.sparse, sequence=base.sequence)
    data = dict(data_for(name))
    data["dense"] = data["dense"][:, :0]
    model = build(name, VARIANTS.get(name, [{}])[0], data=data, schema=schema)
    batch = make_batch(data, slice(0, 64), schema)
    assert batch.dense.shape == (64, 0)
    loss, _ = CTRTask().bind(model).loss(model, batch)
    assert torch.isfinite(loss)
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing, f"{name}: parameters without gradient: {missing}"
    model.eval()
    with torch.no_grad():
        assert isinstance(model(batch), ModelOutput), f"{name}: forward returns ModelOutput in eval too"
        full = logits_of(model(batch))
        alone = torch.stack([logits_of(model(make_batch(data, slice(i, i + 1), schema)))[0] for i in (0, 17, 63)])
    assert full.shape == (64,) and torch.isfinite(full).all()
    torch.testing.assert_close(alone, full[[0, 17, 63]], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name, params", cases())
def test_checkpoint_round_trip(name, params):
    data = data_for(name)
    model = build(name, params, seed=0, data=data).eval()
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    other = build(name, params, seed=123, data=data).eval()
    other.load_state_dict(torch.load(buf, weights_only=True))
    batch = make_batch(data, slice(0, 32), schema_for(name))
    with torch.no_grad():
        assert torch.equal(logits_of(model(batch)), logits_of(other(batch)))


@pytest.mark.parametrize("name", list_models())
def test_unknown_option_rejected(name):
    with pytest.raises(ConfigError, match=f"model {name!r} has no parameter 'no_such_option'"):
        create_model(name, schema_for(name), no_such_option=1)


@pytest.mark.slow
@pytest.mark.parametrize("name, params", cases())
def test_learns_planted_signal(name, params):
    if get_model_class(name).task_kind == "retrieval":  # its task is next-item retrieval, not click labels
        before, after = learns_next_item(name, params)
        assert before["hr@5"] < 0.4 and after["hr@5"] > 0.9, f"{name} {params}: {before} -> {after}"
        return
    data, schema = data_for(name), schema_for(name)
    model = build(name, params, data=data)
    task = CTRTask().bind(model)
    tables = {id(p) for p in model.embedding_parameters()}
    emb = [p for p in model.parameters() if id(p) in tables]
    dense = [p for p in model.parameters() if id(p) not in tables]
    opts = [torch.optim.Adam(dense, lr=1e-2)] if dense else []
    if emb:
        opts.append(torch.optim.Adagrad(emb, lr=0.1))
    train_rows = np.arange(2500)
    rng = np.random.default_rng(0)
    model.train()
    for _ in range(6):
        perm = rng.permutation(train_rows)
        for s in range(0, len(perm), 128):
            loss, _ = task.loss(model, make_batch(data, perm[s:s + 128], schema))
            for o in opts:
                o.zero_grad()
            loss.backward()
            for o in opts:
                o.step()
    model.eval()
    test = make_batch(data, slice(2500, 3000), schema)
    metrics = task.evaluate(model, [test])  # eval mode kept
    with torch.no_grad():
        auc = roc_auc_score(test.labels.numpy(), logits_of(model(test)).numpy())
    assert metrics["auc"] == pytest.approx(auc, abs=1e-6)
    assert auc > 0.75, f"{name} {params}: test AUC {auc:.3f} on a planted signal"
