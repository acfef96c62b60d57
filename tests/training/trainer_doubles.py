"""Test doubles for the Trainer tests (test_trainer.py, test_rundir.py, test_averaging.py): a tiny CTR model,
an in-memory loader with the BatchLoader protocol on a planted signal, a small TrainConfig, a callback that
kills a run at a given step, and a run killed and resumed from its last.pt."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ctrkit.batch import Batch, KeyedJagged
from ctrkit.checkpoint import Checkpoint
from ctrkit.models.base import CTRModel
from ctrkit.training.callbacks import Callback
from ctrkit.training.config import TrainConfig
from ctrkit.training.trainer import Trainer

VOCAB = 50
KEYS = ["c0", "c1"]


class MemLoader:
    """In-memory loader with the BatchLoader protocol; order depends only on (seed, epoch)."""

    def __init__(self, data: dict[str, torch.Tensor], batch_size: int, shuffle: bool = False, seed: int = 0,
                 drop_last: bool = False) -> None:
        self.data, self.batch_size, self.shuffle, self.seed, self.drop_last = data, batch_size, shuffle, seed, drop_last
        self.n = data["labels"].shape[0]
        self.epoch, self.pos = 0, 0

    def __len__(self) -> int:
        return self.n // self.batch_size if self.drop_last else -(-self.n // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.pos = epoch, 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.pos = state["epoch"], state["pos"]

    def __iter__(self):
        if self.shuffle:
            order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed * 1000 + self.epoch))
        else:
            order = torch.arange(self.n)
        while self.pos < len(self):
            idx = order[self.pos * self.batch_size : (self.pos + 1) * self.batch_size]
            self.pos += 1
            d = self.data
            yield Batch(dense=d["dense"][idx], sparse=KeyedJagged.from_dense(KEYS, d["ids"][idx]),
                        labels=d["labels"][idx], group_ids=d["groups"][idx])
        self.pos = 0


def make_data(n: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    effect = torch.randn(VOCAB, generator=torch.Generator().manual_seed(123)) * 1.5  # planted, shared
    ids = torch.randint(0, VOCAB, (n, 2), generator=g)
    dense = torch.randn(n, 2, generator=g)
    logit = effect[ids[:, 0]] + dense[:, 0]
    labels = (torch.rand(n, generator=g) < torch.sigmoid(logit)).float()
    return {"ids": ids, "dense": dense, "labels": labels, "groups": torch.randint(0, 20, (n,), generator=g)}


class TinyCTR(CTRModel):
    """EmbeddingBag (sparse grads, declared as the embedding table) over both keys + dropout + Linear."""

    def __init__(self, dim: int = 8, dropout: float = 0.2) -> None:
        super().__init__()
        self.emb = nn.EmbeddingBag(2 * VOCAB, dim, mode="sum", sparse=True)
        self.drop = nn.Dropout(dropout)
        self.lin = nn.Linear(2 * dim + 2, 1)

    def forward(self, batch: Batch) -> torch.Tensor:
        B = batch.labels.shape[0]
        ids = batch.sparse.values.view(2, B).t() + torch.tensor([0, VOCAB])  # (B, 2) rows of one table
        e = self.emb(ids.reshape(-1), torch.arange(0, 2 * B), ).view(B, -1)  # (B, 2D)
        return self.lin(self.drop(torch.cat([e, batch.dense], 1))).squeeze(1)

    def embedding_parameters(self):
        yield self.emb.weight


def tiny_cfg(**kw) -> TrainConfig:
    base = {"lr": 0.02, "embedding_lr": 0.1, "progress": False, "log_every": 5, "seed": 7}
    base.update(kw)
    return TrainConfig(**base)


def tiny_loaders(n_train: int = 1200, n_valid: int = 600, bs: int = 64, shuffle: bool = True):
    return (MemLoader(make_data(n_train, 0), bs, shuffle=shuffle, seed=3),
            MemLoader(make_data(n_valid, 1), 256))



class Crash(Callback):
    def __init__(self, at: int) -> None:
        self.at = at

    def on_step(self, trainer, step, loss):
        if step == self.at:
            raise KeyboardInterrupt(f"killed at step {step}")



def resume_after_kill(tmp_path, cfg: TrainConfig, kill_at: int):
    """One run straight through (tmp_path/full) and one killed at step ``kill_at`` and resumed from its
    last.pt (tmp_path/cut, model built from another seed) -> (full trainer, its summary, resumed trainer, its
    summary, the run() that builds a trainer)."""

    def run(run_dir, callbacks=(), resume=None, init_seed=0):
        torch.manual_seed(init_seed)
        train, valid = tiny_loaders(n_train=1000)
        return Trainer(TinyCTR(), train, cfg, valid_loader=valid, run_dir=run_dir, callbacks=callbacks,
                       resume_from=resume)

    full = run(tmp_path / "full")
    full_summary = full.fit()
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "cut", callbacks=[Crash(kill_at)]).fit()
    assert Checkpoint.load(tmp_path / "cut" / "last.pt").trainer.progress.step == kill_at
    resumed = run(tmp_path / "cut", resume=tmp_path / "cut" / "last.pt", init_seed=99)
    return full, full_summary, resumed, resumed.fit(), run
