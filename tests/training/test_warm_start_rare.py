"""``train.warm_start_new_rows: rare`` and ``train.warm_start_optimizer`` (training/warm_start.py ``new_rows_from_rare``): after a warm start's tables
grow, every new row and every row expiry reset holds a copy of its table's row 1 (the rare row), for the fused and
torchrec backends; the checkpoint's other rows stay as they were, and a warm start without it keeps fresh rows. ``warm_start_optimizer: fresh`` leaves the optimizers without the
checkpoint's states, ``keep`` (the default) loads them."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from conftest import contract_schema, planted_data
from warm_cases import TRCH, trained_checkpoint

from ctrkit.jobs.warm_start import WarmStart, warm_trainer
from ctrkit.models.registry import create_model
from ctrkit.nn.embedding_interface import EmbeddingCollection
from ctrkit.training.config import Config, ModelConfig, TrainConfig
from ctrkit.training.optim import build_optimizers
from ctrkit.training.warm_start import load_grown_weights, new_rows_from_rare


def tables(model) -> dict[tuple[str, str], torch.Tensor]:
    return {(p, t): m.table_weight(t).detach().clone() for p, m in model.named_modules()
            if isinstance(m, EmbeddingCollection) for t in m.tables}


@pytest.mark.parametrize("backend", ["fused", pytest.param("torchrec", marks=TRCH)])
@pytest.mark.parametrize("reset_ids", [[5, 9], []])  # [] : table user grows by one row alone
def test_new_and_reset_rows_start_from_the_rare_row(backend, reset_ids, tmp_path) -> None:
    schema = contract_schema()
    params = {"dnn_hidden": (16,), "embedding_backend": backend}
    old, _, ckpt = trained_checkpoint("deepfm", schema, params, TrainConfig(lr=0.05), planted_data(300, seed=2, schema=schema),
                                      tmp_path / "old.pt")
    bigger = replace(schema, sparse=[replace(f, vocab_size=f.vocab_size + 1 + i) for i, f in enumerate(schema.sparse)])
    reset = {"user": reset_ids}

    def warm(rare: bool) -> dict[tuple[str, str], torch.Tensor]:
        torch.manual_seed(7)
        new = create_model("deepfm", bigger, **params)
        grown = load_grown_weights(new, ckpt, params, reset=reset)
        if rare:
            n = new_rows_from_rare(new, grown, reset)
            assert n == sum(b - a for a, b in grown.values()) + len(reset_ids) * sum(1 for k in grown if k.endswith("tables.user"))
        return tables(new)

    before, fresh, after = tables(old), warm(False), warm(True)
    for key, w in before.items():
        table = key[1]
        moved = set(range(w.shape[0], after[key].shape[0])) | set(reset.get(table, ()))
        assert after[key].shape[0] > w.shape[0]
        for r in range(after[key].shape[0]):  # naive per-row reference
            if r in moved:
                assert torch.equal(after[key][r], w[1]), (key, r)  # the checkpoint's rare row
            else:
                assert torch.equal(after[key][r], w[r] if r < w.shape[0] else fresh[key][r]), (key, r)
        assert not any(torch.equal(fresh[key][r], w[1]) for r in range(w.shape[0], fresh[key].shape[0]) if w[1].any())


@pytest.mark.parametrize("choice", ["keep", "fresh"])
def test_warm_start_optimizer_keeps_or_drops_the_checkpoints_states(choice, tmp_path) -> None:
    schema = contract_schema()
    params = {"dnn_hidden": (16,)}
    cfg = TrainConfig(lr=0.05, sparse_optimizer="sparse_adam", warm_start_optimizer=choice)
    _, _, ckpt = trained_checkpoint("deepfm", schema, params, cfg, planted_data(300, seed=2, schema=schema),
                                    tmp_path / "old.pt")
    ckpt.config = {"train": {"dense_optimizer": cfg.dense_optimizer, "sparse_optimizer": cfg.sparse_optimizer}}
    torch.manual_seed(7)
    new = create_model("deepfm", schema, **params)
    load_grown_weights(new, ckpt, params)
    opt = build_optimizers(new, cfg)
    run = Config(model=ModelConfig(name="deepfm", params=params), train=replace(cfg, warm_start=str(tmp_path / "old.pt")))
    loaded = warm_trainer(SimpleNamespace(module=new, model=new, optimizer=opt), WarmStart(ckpt), run)
    states = sum(len(o.state) for o in (opt.dense, opt.sparse) if o is not None)
    if choice == "keep":
        assert loaded == ["dense", "sparse"] and states > 0  # the checkpoint's Adam moments
    else:
        assert loaded == [] and states == 0  # as a fresh optimizer: no state before its first step
