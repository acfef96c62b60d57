"""Id dropout (``train.id_dropout``, data/pipeline/id_dropout.py): the ids dropped to the rare id 1 are those of a
naive per-id reference over the same draws, only of the keys named, never 0 or 1; the draw is a function of
(seed, epoch, position), so a loader resumed mid-epoch yields the same batches; bad options name the key and the
fix; and in `ctrkit train` the rare row of a min_freq-1 table, untouched without it, is trained with it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest
import torch
import yaml
from conftest import contract_schema, make_batch, planted_data

from ctrkit.checkpoint import Checkpoint
from ctrkit.cli import main
from ctrkit.data.pipeline.id_dropout import IdDropout
from ctrkit.data.storage.loader import BatchLoader
from ctrkit.data.storage.store import Store, write_store
from ctrkit.errors import ConfigError
from ctrkit.schema import Schema, SparseFeature


def naive(batch, d: IdDropout, epoch: int, position: int) -> list[list[int]]:
    """Per-id loop: id j of key k drops to 1 when draw j < rate[k] and the id is > 1."""
    u = torch.rand(int(batch.sparse.values.numel()), generator=d.generator(epoch, position)).tolist()
    out, j = [], 0
    for k in batch.sparse.keys:
        ids = batch.sparse[k][0].tolist()
        p = d.rates.get(k, 0.0)
        out.append([1 if (u[j + i] < p and v > 1) else v for i, v in enumerate(ids)])
        j += len(ids)
    return out


def test_drops_the_named_keys_as_a_naive_reference() -> None:
    schema = contract_schema()
    batch = make_batch(planted_data(3000, seed=1), slice(None))
    batch.sparse.values[:40] = torch.arange(40) % 2  # some missing (0) and rare (1) ids: never changed
    before = batch.sparse.values.clone()
    d = IdDropout({"user": 0.3, "tags": 0.5}, schema.sparse_keys, seed=7)
    out = d(batch, epoch=2, position=5)
    assert torch.equal(batch.sparse.values, before)  # the input batch is left as it was
    assert [out.sparse[k][0].tolist() for k in out.sparse.keys] == naive(batch, d, 2, 5)
    for k in out.sparse.keys:
        v, w = batch.sparse[k][0], out.sparse[k][0]
        changed = v != w
        assert torch.all(w[changed] == 1) and torch.all(v[changed] > 1)
        assert torch.equal(batch.sparse[k][1], out.sparse[k][1])  # lengths as they were
        if k not in d.rates:
            assert not changed.any()
    share = float((out.sparse["user"][0] == 1).float().mean())
    assert abs(share - 0.3) < 4 * np.sqrt(0.3 * 0.7 / 3000) + 40 / 3000  # about p of the user ids, 4 sigma
    again = d(batch, epoch=2, position=5)
    other = d(batch, epoch=2, position=6)
    assert torch.equal(again.sparse.values, out.sparse.values)  # the same (epoch, position): the same draw
    assert not torch.equal(other.sparse.values, out.sparse.values)
    assert not torch.equal(d(batch, epoch=2, position=5, rank=1).sparse.values, out.sparse.values)  # another rank


def test_zero_rates_leave_batches_alone_and_bad_options_name_the_fix() -> None:
    keys = contract_schema().sparse_keys
    assert not IdDropout({}, keys) and not IdDropout({"user": 0.0}, keys)
    with pytest.raises(ConfigError, match=r"train.id_dropout: 'usr' is not a sparse key.*did you mean 'user'"):
        IdDropout({"usr": 0.1}, keys)
    with pytest.raises(ConfigError, match=r"train.id_dropout.user=1.0: a probability in \[0, 1\)"):
        IdDropout({"user": 1.0}, keys)


def test_a_loader_resumed_mid_epoch_drops_the_same_ids(tmp_path: Path) -> None:
    n = 500
    schema = Schema(sparse=[SparseFeature("u", 100, 4), SparseFeature("i", 50, 4)])
    rows = np.arange(n)
    path = write_store(tmp_path / "s", schema, {"label": (rows % 2).astype("f4"), "u": (2 + rows % 98).astype("i8"),
                                                 "i": (2 + rows % 48).astype("i8")},
                       {"label": "label", "u": "sparse", "i": "sparse"})

    def loader() -> BatchLoader:
        b = BatchLoader(Store(path), 64, seed=3, prefetch=0)
        b.id_dropout = IdDropout({"u": 0.5}, schema.sparse_keys, seed=11)
        return b

    first = loader()
    first.set_epoch(1)
    full = [b.sparse.values.clone() for b in first]
    assert sum(int((v[: len(v) // 2] == 1).sum()) for v in full) > 0.4 * n  # u dropped, about half
    part = loader()
    part.set_epoch(1)
    it = iter(part)
    for _ in range(3):
        next(it)
    state = part.state_dict()
    resumed = loader()
    resumed.load_state_dict(state)
    assert all(torch.equal(a, b.sparse.values) for a, b in zip(full[3:], resumed, strict=True))


def _rare_row(run: Path, table: str) -> torch.Tensor:
    w = Checkpoint.load(run / "last.pt").weights
    key = next(k for k in w if k.endswith(f"tables.{table}") and "linear" not in k)
    return w[key][1].clone()


def test_train_trains_the_rare_row_only_with_id_dropout(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    n = 600
    user, item = rng.integers(0, 40, n), rng.integers(0, 30, n)
    label = (rng.random(n) < 1 / (1 + np.exp(-(item % 3 - 1.0)))).astype(int)
    pacsv.write_csv(pa.table({"label": label, "user_id": [f"u{x}" for x in user], "item_id": [f"i{x}" for x in item]}),
                    tmp_path / "rows.csv")
    spec = {"label": "label", "sparse": [{"name": "user_id", "group": "user"}, {"name": "item_id", "group": "item"}],
            "options": {"min_freq": 1}}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    assert main(["preprocess", "table", str(tmp_path / "rows.csv"), "--schema", str(tmp_path / "spec.yaml"), "--out",
                 str(tmp_path / "st"), "--split", "0.8,0.2", "--embedding-dim", "4"]) == 0
    train = tmp_path / "st" / "train"
    assert not np.any(np.load(train / "user_id.npy") == 1)  # min_freq 1: no training row holds the rare id

    def run(name: str, *extra: str) -> Path:
        assert main(["train", "--config", "configs/movielens/deepfm.yaml", "--quiet", f"--data.train={train}",
                     f"--data.valid={tmp_path / 'st' / 'test'}", "--data.test=null", f"--run.dir={tmp_path}",
                     f"--run.name={name}", "--train.epochs=1", "--data.batch_size=64", "--train.ema_decay=null",
                     "--train.progress=false", *extra]) == 0
        return tmp_path / name

    plain, dropped = run("plain"), run("dropped", "--train.id_dropout={user_id: 0.3}")
    init = _rare_row(plain, "user_id")
    cfg = json.loads((dropped / "summary.json").read_text())["config"]["train"]
    assert cfg["id_dropout"] == {"user_id": 0.3}
    assert torch.equal(_rare_row(dropped, "item_id"), _rare_row(plain, "item_id"))  # same start, not dropped
    moved = (_rare_row(dropped, "user_id") - init).abs().max()
    assert moved > 1e-3, f"the rare user row moved by {moved} only"  # trained (it starts at N(0, 1e-4^2))
    assert main(["train", "--config", "configs/movielens/deepfm.yaml", "--quiet", f"--data.train={train}",
                 "--data.valid=null", "--data.test=null", f"--run.dir={tmp_path}", "--run.name=bad",
                 "--train.id_dropout={user: 0.3}"]) == 2
