"""``train.warm_start_average: keep`` (training/warm_start.py ``load_grown_average``): a warm start on a grown
vocabulary continues the checkpoint's weight average as a resume of its run would. Reference: the checkpoint's own
run, continued for the same steps on known ids -- its trained weights and its average are the warm run's on the
old rows, for the fused and torchrec backends and rows reset by expiry; new rows average to their fresh value
while no step touches them. ``fresh`` (the default) starts a new average; mismatches are refused by name."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from conftest import contract_schema, make_batch, planted_data
from warm_cases import TRCH

from ctrkit.checkpoint import Checkpoint, TrainerState
from ctrkit.errors import CheckpointError, ConfigError
from ctrkit.jobs.warm_start import WarmStart, warm_trainer
from ctrkit.models.registry import create_model
from ctrkit.nn.embedding_interface import EmbeddingCollection
from ctrkit.training.averaging import WeightAverage
from ctrkit.training.config import Config, ModelConfig, TrainConfig
from ctrkit.training.optim import build_optimizers
from ctrkit.training.tasks import CTRTask
from ctrkit.training.warm_start import load_grown_optimizer, load_grown_weights, table_layout

DECAY = 0.9
CFG = TrainConfig(lr=0.05, sparse_optimizer="sparse_adam", ema_decay=DECAY, warm_start_average="keep")


def step(model, opt, average, batch) -> None:
    """One training step as the Trainer takes it with train.ema_decay (fixed dropout masks)."""
    model.train()
    opt.zero_grad()
    torch.manual_seed(11)
    CTRTask().bind(model).loss(model, batch)[0].backward()
    average.before_step()
    opt.step()
    average.after_step()


def weights(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def averaged(model, average) -> dict[str, torch.Tensor]:
    with average.applied_weights():
        return weights(model)


def old_run(schema, params, data, path):
    """deepfm trained 4 steps with the average, saved as the Trainer saves (a_t as weights, w_t in the state)."""
    torch.manual_seed(0)
    model = create_model("deepfm", schema, **params)
    opt = build_optimizers(model, CFG)
    average = WeightAverage(model, DECAY, opt.embedding_params)
    for s in range(4):
        step(model, opt, average, make_batch(data, slice(64 * s, 64 * (s + 1)), schema))
    with average.applied_weights():
        Checkpoint.of(model, schema=schema, model_params=params, optimizer=opt.state_dict(),
                      trainer=TrainerState(weight_average=average.state_dict())).save(path)
    return model, opt, average, Checkpoint.load(path)


@pytest.mark.parametrize("backend", ["fused", pytest.param("torchrec", marks=TRCH)])
@pytest.mark.parametrize("reset_ids", [[], [5, 9]])
def test_the_average_goes_on_as_the_checkpoints_run_would(backend, reset_ids, tmp_path) -> None:
    schema = contract_schema()
    params = {"dnn_hidden": (16,), "embedding_backend": backend}
    data = planted_data(500, seed=4, schema=schema)
    old, opt, average, ckpt = old_run(schema, params, data, tmp_path / "old.pt")
    bigger = replace(schema, sparse=[replace(f, vocab_size=f.vocab_size + 2 + i) for i, f in enumerate(schema.sparse)])
    reset = {"user": reset_ids}
    torch.manual_seed(7)
    new = create_model("deepfm", bigger, **params)
    load_grown_weights(new, ckpt, params, reset=reset)
    fresh = weights(new)  # a_t grown: new and reset rows at their fresh values
    new_opt = build_optimizers(new, CFG)
    load_grown_optimizer(new_opt, ckpt, table_layout(new, ckpt.weights, reset), dict.fromkeys(("dense", "sparse"), True))
    new_avg = WeightAverage(new, DECAY, new_opt.embedding_params)
    run = Config(model=ModelConfig(name="deepfm", params=params),
                 train=replace(CFG, warm_start=str(tmp_path / "old.pt"), warm_start_optimizer="fresh"))
    trainer = SimpleNamespace(module=new, model=new, optimizer=new_opt, average=new_avg)
    assert warm_trainer(trainer, WarmStart(ckpt, {"user": torch.tensor(reset_ids).numpy()}), run) == ["average"]
    assert new_avg.updates == 4
    known = {k: (v % 5 if k == "user" else v) for k, v in data.items()}  # off the reset rows 5, 9 and the new ones
    for s in range(4, 6):
        batch = make_batch(known, slice(64 * s, 64 * (s + 1)), schema)
        step(old, opt, average, batch)
        step(new, new_opt, new_avg, batch)
    first = snapshot(new, fresh)
    for got, want in ((snapshot(new), snapshot(old)), (snapshot(new, averaged(new, new_avg)),
                                                       snapshot(old, averaged(old, average)))):
        assert got.keys() == want.keys()
        for key, w in want.items():
            g = got[key]
            for r in range(g.shape[0]):  # naive per-row reference: the old run's row unless new or reset
                if r >= w.shape[0] or (key[-1] == "user" and r in reset_ids):
                    torch.testing.assert_close(g[r], first[key][r], rtol=1e-6, atol=1e-9, msg=f"{key} row {r} (fresh)")
                else:
                    torch.testing.assert_close(g[r], w[r], rtol=1e-5, atol=1e-7, msg=f"{key} row {r}")


def snapshot(model, values: dict[str, torch.Tensor] | None = None) -> dict[tuple[str, ...], torch.Tensor]:
    """Every table by (collection, table) and every other parameter by name, from ``values`` (parameter name ->
    tensor; default the model's weights): tables compared table by table (a grown fused weight shifts them)."""
    values = values or weights(model)
    names = {id(p): n for n, p in model.named_parameters()}
    out, in_tables = {}, set()
    for prefix, m in model.named_modules():
        if isinstance(m, EmbeddingCollection):
            for p, starts in m.table_rows():
                in_tables.add(names[id(p)])
                ends = sorted(starts.values()) + [p.shape[0]]
                for t, at in starts.items():
                    out[(prefix, t)] = values[names[id(p)]][at: ends[ends.index(at) + 1]]
    return {**out, **{(n,): v for n, v in values.items() if n not in in_tables}}


def test_mismatches_are_refused_by_name(tmp_path) -> None:
    schema = contract_schema()
    params = {"dnn_hidden": (16,)}
    *_, ckpt = old_run(schema, params, planted_data(300, seed=4, schema=schema), tmp_path / "old.pt")
    run = Config(model=ModelConfig(name="deepfm", params=params), train=replace(CFG, warm_start=str(tmp_path / "old.pt")))

    def warm(average, ck=ckpt):
        new = create_model("deepfm", schema, **params)
        load_grown_weights(new, ck, params)
        opt = build_optimizers(new, CFG)
        avg = WeightAverage(new, average, opt.embedding_params) if average else None
        return warm_trainer(SimpleNamespace(module=new, model=new, optimizer=opt, average=avg), WarmStart(ck), run)

    with pytest.raises(ConfigError, match="train.ema_decay"):
        warm(None)
    with pytest.raises(CheckpointError, match="ema_decay=0.9.*asks for 0.5"):
        warm(0.5)
    plain = Checkpoint.load(tmp_path / "old.pt")
    plain.trainer = None
    with pytest.raises(CheckpointError, match="holds none.*warm_start_average=fresh"):
        warm(DECAY, plain)
    shrunk = replace(run, train=replace(run.train, warm_start_shrink=0.5))
    with pytest.raises(ConfigError, match="warm_start_average=keep.*warm_start_shrink=0.5"):
        model = create_model("deepfm", schema, **params)
        avg = WeightAverage(model, DECAY, build_optimizers(model, CFG).embedding_params)
        warm_trainer(SimpleNamespace(module=model, model=model, optimizer=None, average=avg), WarmStart(ckpt), shrunk)
    fresh = replace(run, train=replace(run.train, warm_start_average="fresh"))
    new = create_model("deepfm", schema, **params)
    opt = build_optimizers(new, CFG)
    avg = WeightAverage(new, DECAY, opt.embedding_params)
    warm_trainer(SimpleNamespace(module=new, model=new, optimizer=opt, average=avg), WarmStart(ckpt), fresh)
    assert avg.updates == 0  # a new average


def test_start_averages_from_the_warm_start_weights_as_the_recursion_does(tmp_path) -> None:
    """``train.warm_start_average: start``: before any step the average is the warm-start weights (grown: new rows
    fresh); after each step every parameter, table rows included (touched or not), follows a <- d a + (1 - d) w, not
    debiased, against that recursion run step by step on the trained weights; a resume from its state goes on the
    same way; a run without ema_decay is refused."""
    schema = contract_schema()
    params = {"dnn_hidden": (16,)}
    *_, ckpt = old_run(schema, params, planted_data(300, seed=4, schema=schema), tmp_path / "old.pt")
    bigger = replace(schema, sparse=[replace(f, vocab_size=f.vocab_size + 3) for f in schema.sparse])
    torch.manual_seed(7)
    new = create_model("deepfm", bigger, **params)
    load_grown_weights(new, ckpt, params)
    opt = build_optimizers(new, CFG)
    avg = WeightAverage(new, DECAY, opt.embedding_params)
    run = Config(model=ModelConfig(name="deepfm", params=params),
                 train=replace(CFG, warm_start=str(tmp_path / "old.pt"), warm_start_average="start"))
    trainer = SimpleNamespace(module=new, model=new, optimizer=opt, average=avg)
    assert warm_trainer(trainer, WarmStart(ckpt), run)[:1] == ["average"]
    ref = weights(new)  # a_0 = w_0, the grown warm-start weights
    assert all(torch.equal(averaged(new, avg)[n], w) for n, w in ref.items())
    data = planted_data(400, seed=5, schema=bigger)  # ids up to the grown sizes: new rows get trained
    for s in range(3):
        step(new, opt, avg, make_batch(data, slice(64 * s, 64 * (s + 1)), bigger))
        ref = {n: DECAY * a + (1 - DECAY) * w for (n, a), w in zip(ref.items(), weights(new).values(), strict=True)}
    for n, a in averaged(new, avg).items():
        torch.testing.assert_close(a, ref[n], rtol=1e-5, atol=1e-7, msg=n)
    state = avg.state_dict()
    assert state["debias"] is False and state["updates"] == 3
    again = create_model("deepfm", bigger, **params)  # a resume: the model holds a_t, the state w_t
    with torch.no_grad():
        for p, a in zip(again.parameters(), ref.values(), strict=True):
            p.copy_(a)
    again_opt = build_optimizers(again, CFG)
    again_avg = WeightAverage(again, DECAY, again_opt.embedding_params)
    again_avg.load_state_dict(state)
    assert all(torch.equal(w, weights(new)[n]) for n, w in weights(again).items())  # training goes on from w_t
    step(again, again_opt, again_avg, make_batch(data, slice(192, 256), bigger))
    for (n, a), w in zip(averaged(again, again_avg).items(), weights(again).values(), strict=True):
        torch.testing.assert_close(a, DECAY * ref[n] + (1 - DECAY) * w, rtol=1e-5, atol=1e-7, msg=n)
    bare = SimpleNamespace(module=new, model=new, optimizer=opt, average=None)
    with pytest.raises(ConfigError, match="warm_start_average=start.*set train.ema_decay"):
        warm_trainer(bare, WarmStart(ckpt), run)
