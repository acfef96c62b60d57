"""Options every model takes about its tables (embedding_dim / embedding_dims / embedding_backend) and the
renamed options: the store's dim is only a default, the backend reaches the factory, an old option name is
an error naming the new one while an old checkpoint's params are upgraded."""

from __future__ import annotations

import glob
from pathlib import Path

import pytest
import torch
import yaml
from conftest import behaviour_schema, contract_schema, make_batch, planted_data

from ctrkit.cli import main
from ctrkit.errors import ConfigError
from ctrkit.jobs.tune_space import load_search_space
from ctrkit.models.base import logits_of
from ctrkit.models.registry import create_model, model_params, upgrade_params
from ctrkit.nn.embedding import EmbeddingCollection
from ctrkit.nn.embedding_factory import make_embeddings
from ctrkit.training.config import read_config_file

REPO = Path(__file__).resolve().parents[2]


def table_dims(model: torch.nn.Module) -> dict[str, int]:
    return {t.name: t.embedding_dim for m in model.modules() if isinstance(m, EmbeddingCollection)
            for t in m.tables.values() if t.embedding_dim > 1}  # dim-1 tables: first-order weights


@pytest.mark.parametrize("name", ["deepfm", "dlrm", "dcnv2", "autoint"])
@pytest.mark.parametrize("dim", [4, 16])
def test_embedding_dim_is_the_models(name, dim):
    schema = contract_schema()  # its tables are 8 wide
    data = planted_data(64, seed=1, schema=schema)
    model = create_model(name, schema, embedding_dim=dim).eval()
    assert set(table_dims(model).values()) == {dim}
    with torch.no_grad():
        out = logits_of(model(make_batch(data, slice(0, 32), schema)))
    assert out.shape == (32,) and torch.isfinite(out).all()


def test_embedding_dims_per_table_for_a_behaviour_model():
    schema = behaviour_schema()
    data = planted_data(64, seed=2, schema=schema)
    model = create_model("din", schema, embedding_dim=6, embedding_dims={"cat": 3}).eval()
    dims = table_dims(model)
    assert dims["cat"] == 3 and all(d == 6 for t, d in dims.items() if t != "cat")
    assert model.embedding.target_dim == 6 + 3  # [e(item); e(cat)]
    with torch.no_grad():
        assert torch.isfinite(logits_of(model(make_batch(data, slice(0, 16), schema)))).all()


def test_bad_embedding_options_are_config_errors():
    schema = contract_schema()
    with pytest.raises(ConfigError, match=r"embedding_dims names tables \['nope'\]"):
        create_model("deepfm", schema, embedding_dims={"nope": 4})
    with pytest.raises(ConfigError, match="embedding_dim"):
        create_model("deepfm", schema, embedding_dim=0)
    with pytest.raises(ConfigError, match="embedding_backend='sharded'.*valid: fused, torchrec"):
        create_model("deepfm", schema, embedding_backend="sharded")
    create_model("deepfm", schema, embedding_backend="fused")
    assert {"embedding_dim", "embedding_dims", "embedding_backend"} <= set(model_params("sasrec"))


def test_the_factory_uses_the_backend_of_the_model_being_built():
    from ctrkit.errors import LayerConfigError
    from ctrkit.nn.embedding import embedding_backend

    with pytest.raises(LayerConfigError, match="'sharded' is not available; supported: fused, torchrec"):
        make_embeddings(contract_schema(), backend="sharded")
    with pytest.raises(LayerConfigError, match="'sharded' is not available"), embedding_backend("sharded"):
        pass


@pytest.mark.parametrize("name, old, new, value", [
    ("dlrm", "dcn_type", "cross_type", "full"), ("dlrm", "dcn_rank", "cross_rank", 4),
    ("dcnv2", "rank", "cross_rank", 4), ("dcnv2", "experts", "cross_experts", 2),
    ("dcnv2", "mix_activation", "cross_activation", "relu"), ("afm", "attention_dropout", "att_dropout", 0.1),
    ("afm", "attention_dim", "att_dim", 4), ("autoint", "attention_layers", "num_layers", 2),
    ("sasrec", "dropout", "att_dropout", 0.1), ("two_tower", "tower_hidden", "dnn_hidden", [8]),
    ("two_tower", "dropout", "dnn_dropout", 0.1), ("youtube_dnn", "tower_hidden", "dnn_hidden", [8]),
])
def test_an_old_option_name_names_the_new_one(name, old, new, value):
    schema = behaviour_schema()
    with pytest.raises(ConfigError, match=f"no parameter '{old}': it was renamed; use '{new}'"):
        create_model(name, schema, **{old: value})
    assert upgrade_params(name, {old: value}) == {new: value}  # what a checkpoint of the previous release said


def test_an_old_option_value_names_the_new_one():
    with pytest.raises(ConfigError, match="cross_type='mix' was renamed; use cross_type='low_rank_mixture'"):
        create_model("dcnv2", contract_schema(), cross_type="mix")
    assert upgrade_params("dcnv2", {"cross_type": "matrix", "rank": 8}) == {"cross_type": "full", "cross_rank": 8}


def test_tune_can_search_the_embedding_dim(tmp_path):
    space = tmp_path / "s.search.yaml"
    space.write_text("params:\n  model.params.embedding_dim: {choices: [8, 16, 64]}\n")
    base = read_config_file(REPO / "configs/criteo/deepfm.yaml")
    assert load_search_space(space, base).params["model.params.embedding_dim"].choices == [8, 16, 64]
    space.write_text("params:\n  model.params.embedding_dim: {choices: [8, 0]}\n")
    with pytest.raises(ConfigError, match="embedding_dim"):
        load_search_space(space, base)


def test_the_same_store_trains_at_two_dims(tmp_path):
    """`ctrkit synth --embedding-dim 16` writes a store; deepfm trains on it at D = 8 and D = 16, and each
    checkpoint rebuilds its model at its own D."""
    from ctrkit.checkpoint import Checkpoint

    for split, seed in (("train", 0), ("valid", 1)):
        assert main(["synth", "--rows", "600", "--seed", str(seed), "--max-cardinality", "40", "--embedding-dim",
                     "16", "--out", str(tmp_path / split)]) == 0
    cfg = {"data": {"train": str(tmp_path / "train"), "valid": str(tmp_path / "valid"), "batch_size": 128},
           "model": {"name": "deepfm", "params": {"dnn_hidden": [8]}},
           "train": {"epochs": 1, "metrics": ["auc"]}, "run": {"dir": str(tmp_path / "runs")}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    for dim in (8, 16):
        assert main(["train", "--config", str(tmp_path / "c.yaml"), f"--model.params.embedding_dim={dim}",
                     f"--run.name=d{dim}", "--quiet"]) == 0
        ckpt = glob.glob(str(tmp_path / "runs" / f"d{dim}*" / "best.pt"))[0]
        saved = Checkpoint.load(ckpt)
        model, schema = saved.build_model(), saved.schema
        assert set(table_dims(model).values()) == {dim} and schema.embedding_dim("C1") == 16
