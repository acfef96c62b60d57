"""Models read the roles a schema declares (sequence ``role`` / ``of`` / ``session``, ``shares``, groups and
``item_id``), not feature names; schemas of the previous release get the roles from their names, once."""

from __future__ import annotations

import pytest
import torch
from conftest import behaviour_schema, contract_schema, make_batch, planted_data

from ctrkit.models.base import logits_of
from ctrkit.models.registry import create_model
from ctrkit.retrieval.catalogue import history_of, item_feature_names
from ctrkit.schema import Schema, SchemaError, SequenceFeature, SparseFeature

# legacy name -> a name no rule could guess a role from
RENAME = {"hist_item": "clicked", "hist_cat": "clicked_kind", "neg_hist_item": "shown_item",
          "neg_hist_cat": "shown_kind", "sess_0_item": "early_items", "sess_0_cat": "early_kinds",
          "sess_1_item": "late_items", "sess_1_cat": "late_kinds"}


def declared_schema() -> Schema:
    """behaviour_schema() with every sequence renamed and its role declared."""
    legacy = behaviour_schema()
    seqs = [SequenceFeature(RENAME[q.name], q.max_len, q.shares, q.pooling, q.group, role=q.role,
                            of=RENAME.get(q.of) if q.of else None, session=q.session) for q in legacy.sequence]
    # negatives first, sessions late-first, histories last (in their order: it is their concatenation order)
    seqs.sort(key=lambda q: ({"negative": 0, "session": 1, "history": 2}[q.role or ""], -(q.session or 0)))
    return Schema(dense=legacy.dense, sparse=legacy.sparse, sequence=seqs)


def test_legacy_names_give_the_roles_once():
    s = behaviour_schema()
    roles = {q.name: (q.role, q.of, q.session) for q in s.sequence}
    assert roles["hist_item"] == ("history", None, None)
    assert roles["neg_hist_cat"] == ("negative", "hist_cat", None)
    assert roles["sess_1_item"] == ("session", None, 1)
    assert s.item_id == "item"
    old = s.to_dict()  # a schema.json of the previous release: no role keys, no item_id
    for q in old["sequence"]:
        del q["role"], q["of"], q["session"]
    del old["item_id"]
    assert Schema.from_dict(old) == s


@pytest.mark.parametrize("name", ["din", "dien", "dsin", "bst"])
def test_behaviour_models_read_declared_roles(name):
    """The same model on the legacy-named store and on a store declaring the roles under other names: the same
    fields and, with the same seed, the same logits (the roles, not the names, decide what is read)."""
    legacy, declared = behaviour_schema(), declared_schema()
    data = planted_data(200, seed=3, schema=legacy)
    renamed = {RENAME.get(k.removesuffix(".lengths"), k.removesuffix(".lengths")) + (".lengths" if k.endswith(
        ".lengths") else ""): v for k, v in data.items()}
    torch.manual_seed(0)
    a = create_model(name, legacy).eval()
    torch.manual_seed(0)
    b = create_model(name, declared).eval()
    fa, fb = a.fields, b.fields
    assert [RENAME[h] for h in fa.histories] == fb.histories and fb.targets == fa.targets == ["item", "cat"]
    assert [RENAME[n] for n in fa.negatives] == fb.negatives
    assert [[RENAME[k] for k in s] for s in fa.sessions] == fb.sessions
    with torch.no_grad():
        torch.testing.assert_close(logits_of(b(make_batch(renamed, slice(0, 64), declared))),
                                   logits_of(a(make_batch(data, slice(0, 64), legacy))))


def test_a_sequence_named_like_a_negative_is_a_history_when_declared():
    s = behaviour_schema(sessions=0)
    seqs = [SequenceFeature("neg_hist_item" if q.name == "hist_item" else q.name, q.max_len, q.shares, q.pooling,
                            role="history") for q in s.sequence if q.role == "history"]
    schema = Schema(dense=s.dense, sparse=s.sparse, sequence=seqs)
    assert create_model("din", schema).fields.histories == ["neg_hist_item", "hist_cat"]


def test_declarations_are_checked():
    s = behaviour_schema(sessions=0)
    bad = [SequenceFeature("x", 6, "item", "none", role="negative", of="nothing")]
    with pytest.raises(SchemaError, match="'of' must name a history"):
        Schema(dense=s.dense, sparse=s.sparse, sequence=bad)
    with pytest.raises(SchemaError, match="role 'session'"):
        Schema(dense=s.dense, sparse=s.sparse, sequence=[SequenceFeature("x", 6, "item", "none", role="session")])
    with pytest.raises(SchemaError, match="role 'clicks' is not one of"):
        Schema(dense=s.dense, sparse=s.sparse, sequence=[SequenceFeature("x", 6, "item", "none", role="clicks")])
    with pytest.raises(SchemaError, match="item_id 'user'"):
        Schema(dense=s.dense, sparse=s.sparse, item_id="user")


def test_retrieval_item_id_is_declared():
    """The catalogue's item id is the schema's item_id, not a feature named 'item' nor the first of the group."""
    c = contract_schema()
    sparse = [SparseFeature("genre", 12, 8, group="item"), SparseFeature("movie", 40, 8, group="item"),
              *(f for f in c.sparse if f.group != "item")]
    seqs = [SequenceFeature("watched", 6, "movie", "none", role="history")]
    schema = Schema(dense=c.dense, sparse=sparse, sequence=seqs, item_id="movie")
    assert item_feature_names(schema) == ["movie", "genre"]
    assert history_of(schema, "movie") == "watched"
    model = create_model("sasrec", schema)
    assert model.item_id_feature == "movie" and model.history_key == "watched"
