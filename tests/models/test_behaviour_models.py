"""The user-behaviour models (din, dien, dsin, bst and the dnn baseline; their contract variants and schema in
contract_cases.py): what each reads of a behaviour schema, DIEN's auxiliary loss, clear errors, empty
histories, DIN's mini-batch-aware L2."""

from __future__ import annotations

import pytest
import torch
from conftest import behaviour_schema, make_batch, planted_data
from contract_cases import BEHAVIOUR

from ctrkit.models.base import ModelOutput, logits_of
from ctrkit.models.registry import ConfigError, create_model
from ctrkit.schema import Schema, SequenceFeature


@pytest.fixture(scope="module")
def data():
    return planted_data(300, seed=3, schema=behaviour_schema())


def _shuffled(data: dict, prefix: str) -> dict:
    """The same rows with other ids (same lengths) in every sequence whose name starts with ``prefix``."""
    out = dict(data)
    for k, v in data.items():
        if k.startswith(prefix) and not k.endswith(".lengths"):
            out[k] = (v * 7 + 3) % 10 + 2
    return out


@pytest.mark.parametrize("name, prefix, reads", [
    ("din", "hist_", True), ("din", "neg_", False), ("din", "sess_", False),
    ("dnn", "hist_", True), ("bst", "hist_", True), ("bst", "sess_", False),
    ("dien", "hist_", True), ("dien", "sess_", False),
    ("dsin", "sess_", True), ("dsin", "hist_", False),
])
def test_reads_what_it_should(name, prefix, reads, data):
    """Changing a role's ids changes the logits exactly when the model reads that role."""
    schema = behaviour_schema()
    torch.manual_seed(0)
    model = create_model(name, schema, **BEHAVIOUR[name][0]).eval()
    b = make_batch(data, slice(0, 64), schema)
    other = make_batch(_shuffled(data, prefix), slice(0, 64), schema)
    with torch.no_grad():
        same = torch.equal(logits_of(model(b)), logits_of(model(other)))
    assert same != reads


def test_dien_aux_loss_uses_the_negatives(data):
    schema = behaviour_schema()
    torch.manual_seed(0)
    model = create_model("dien", schema, **BEHAVIOUR["dien"][0]).train()
    b = make_batch(data, slice(0, 64), schema)
    out = model(b)
    assert isinstance(out, ModelOutput) and set(out.aux_losses) == {"aux"}
    other = model(make_batch(_shuffled(data, "neg_"), slice(0, 64), schema))
    assert not torch.equal(out.aux_losses["aux"], other.aux_losses["aux"])
    model.eval()
    assert model(b).aux_losses == {}  # no aux loss when scoring: the same ModelOutput type, empty


def test_dien_without_negatives_is_a_clear_error():
    s = behaviour_schema()
    schema = Schema(dense=s.dense, sparse=s.sparse, sequence=[q for q in s.sequence if not q.name.startswith("neg_")])
    with pytest.raises(ConfigError, match="neg_hist_item.*--aux-negatives"):
        create_model("dien", schema)
    create_model("dien", schema, aux_loss_weight=0.0)  # fine without the auxiliary loss


def test_no_history_is_a_clear_error():
    s = behaviour_schema()
    schema = Schema(dense=s.dense, sparse=s.sparse, sequence=[SequenceFeature("hist_item", 6, "item", "mean")])
    for name in ("din", "dien", "bst"):
        with pytest.raises(ConfigError, match=f"{name} needs a behaviour history"):
            create_model(name, schema)
    with pytest.raises(ConfigError, match="dsin needs session sequences"):
        create_model("dsin", schema)
    create_model("dnn", schema)  # the baseline works on any fields


def test_empty_history_scores(data):
    """A row with no behaviour at all (a new user) scores, finite, the same alone as in a batch."""
    schema = behaviour_schema()
    empty = dict(data)
    for k in data:
        if k.endswith(".lengths") and (k.startswith(("hist_", "neg_", "sess_"))):
            lengths = data[k].copy()
            seq = k.removesuffix(".lengths")
            offsets = [0, *lengths.cumsum()]
            keep = [v for i in range(len(lengths)) for v in data[seq][offsets[i]:offsets[i + 1]] if i != 0]
            lengths[0] = 0
            empty[k], empty[seq] = lengths, torch.tensor(keep, dtype=torch.int64).numpy()
    for name, variants in BEHAVIOUR.items():
        torch.manual_seed(0)
        model = create_model(name, schema, **variants[0]).eval()
        with torch.no_grad():
            full = logits_of(model(make_batch(empty, slice(0, 16), schema)))
            alone = logits_of(model(make_batch(empty, slice(0, 1), schema)))
        assert torch.isfinite(full).all(), name
        torch.testing.assert_close(alone, full[:1], rtol=1e-5, atol=1e-5)


def test_din_mba_l2_counts_and_penalises_rows_in_the_batch(data):
    schema = behaviour_schema()
    torch.manual_seed(0)
    model = create_model("din", schema, **BEHAVIOUR["din"][1])
    batches = [make_batch(data, slice(s, s + 100), schema) for s in (0, 100, 200)]
    model.prefit(batches)
    counts = model.frequency.counts("item")
    expected = torch.zeros_like(counts)
    for b in batches:
        for k in ("item", "hist_item"):
            expected += torch.bincount(b.sparse[k][0], minlength=counts.numel()).float()
    torch.testing.assert_close(counts, expected)
    b = batches[0]
    model.train()
    got = model(b).aux_losses["mba_l2"]
    ref = torch.zeros(())
    emb = model.embedding.embedding
    for table, keys in model.frequency.table_keys.items():
        ids = {int(i) for k in keys for i in b.sparse[k][0]} - {0}
        c = model.frequency.counts(table)
        for i in ids:
            row = emb.lookup(table, torch.tensor([i]))[0]
            ref = ref + row.pow(2).sum() / max(float(c[i]), 1.0)
    torch.testing.assert_close(got, 1e-3 * ref)
