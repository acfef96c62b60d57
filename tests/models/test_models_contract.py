"""The contract every registered model keeps (DESIGN.md §5), driven by the registry."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from conftest import contract_schema, make_batch, planted_data
from sklearn.metrics import roc_auc_score

from ctrkit.models.registry import ConfigError, create_model, list_models

SMALL = {"dense_arch": (16,), "over_arch": (16,)}
# Variants exercised per model (small sizes keep the suite fast); models not listed use defaults.
VARIANTS: dict[str, list[dict]] = {
    "dlrm": [
        dict(SMALL, interaction="dot"),
        dict(SMALL, interaction="dcn", dcn_type="full", dcn_layers=2),
        dict(SMALL, interaction="dcn", dcn_type="low_rank", dcn_layers=2, dcn_rank=4),
        dict(SMALL, interaction="dcn", dcn_type="vector", dcn_layers=2),
        dict(SMALL, interaction="dcn", dcn_type="low_rank_mixture", dcn_layers=2, dcn_rank=4, dcn_experts=2),
        dict(SMALL, interaction="projection", projection_branch1=(16, 3 * 8), projection_branch2=(16, 2 * 8)),
    ],
}


for _extra in ("contract_variants_a", "contract_variants_b"):
    try:
        VARIANTS.update(__import__(_extra).VARIANTS)
    except ImportError:
        pass


def cases() -> list:
    out = []
    for name in list_models():
        for i, params in enumerate(VARIANTS.get(name, [{}])):
            out.append(pytest.param(name, params, id=f"{name}-{i}"))
    return out


def build(name: str, params: dict, seed: int = 0, data: dict | None = None) -> torch.nn.Module:
    """Create the model; models with a ``prefit(batches)`` step (e.g. GBDT+LR's trees) get it on the
    training rows, as the trainer does."""
    torch.manual_seed(seed)
    model = create_model(name, contract_schema(), **params)
    if hasattr(model, "prefit"):
        data = data if data is not None else planted_data(3000, seed=1)
        model.prefit([make_batch(data, slice(s, s + 500)) for s in range(0, 2500, 500)])
    return model


@pytest.fixture(scope="module")
def data() -> dict[str, np.ndarray]:
    return planted_data(3000, seed=1)


@pytest.mark.parametrize("name, params", cases())
def test_forward_shape_grads_and_consistency(name, params, data):
    model = build(name, params, data=data)
    batch = make_batch(data, slice(0, 64))
    model.train()
    logits = model(batch)
    assert logits.shape == (64,) and torch.isfinite(logits).all()
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, batch.labels)
    extra = getattr(model, "extra_losses", None)
    if extra is not None:
        loss = loss + extra(batch)
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing, f"{name}: parameters without gradient: {missing}"

    model.eval()
    with torch.no_grad():
        full = model(batch)
        again = model(batch)
        alone = torch.stack([model(make_batch(data, slice(i, i + 1)))[0] for i in (0, 17, 63)])
    assert torch.equal(full, again), "eval must be deterministic"
    torch.testing.assert_close(alone, full[[0, 17, 63]], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name, params", cases())
def test_checkpoint_round_trip(name, params, data):
    model = build(name, params, seed=0, data=data).eval()
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    other = build(name, params, seed=123, data=data).eval()
    other.load_state_dict(torch.load(buf, weights_only=True))
    batch = make_batch(data, slice(0, 32))
    with torch.no_grad():
        assert torch.equal(model(batch), other(batch))


@pytest.mark.parametrize("name", list_models())
def test_unknown_option_rejected(name):
    with pytest.raises(ConfigError, match=f"model {name!r} has no parameter 'no_such_option'"):
        create_model(name, contract_schema(), no_such_option=1)


@pytest.mark.slow
@pytest.mark.parametrize("name, params", cases())
def test_learns_planted_signal(name, params, data):
    model = build(name, params, data=data)
    emb = [p for p in model.parameters() if getattr(p, "is_embedding", False)]
    dense = [p for p in model.parameters() if not getattr(p, "is_embedding", False)]
    opts = [torch.optim.Adam(dense, lr=1e-2)] if dense else []
    if emb:
        opts.append(torch.optim.Adagrad(emb, lr=0.1))
    train_rows = np.arange(2500)
    rng = np.random.default_rng(0)
    model.train()
    for _ in range(6):
        perm = rng.permutation(train_rows)
        for s in range(0, len(perm), 128):
            batch = make_batch(data, perm[s:s + 128])
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(batch), batch.labels)
            for o in opts:
                o.zero_grad()
            loss.backward()
            for o in opts:
                o.step()
    model.eval()
    test = make_batch(data, slice(2500, 3000))
    with torch.no_grad():
        auc = roc_auc_score(test.labels.numpy(), model(test).numpy())
    assert auc > 0.75, f"{name} {params}: test AUC {auc:.3f} on a planted signal"
