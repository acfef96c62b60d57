"""train.ema_decay: the weights' debiased moving average against a loop over every step's weights,
lazily for embedding rows; evaluation and checkpoints hold it; resume stays exact; clear errors."""

from __future__ import annotations

import pytest
import torch
from trainer_doubles import MemLoader, TinyCTR, make_data, resume_after_kill, tiny_cfg, tiny_loaders

from ctrkit.checkpoint import Checkpoint
from ctrkit.errors import ConfigError, TrainingError
from ctrkit.metrics import roc_auc
from ctrkit.training.averaging import WeightAverage
from ctrkit.training.callbacks import Callback
from ctrkit.training.trainer import Trainer


class Record(Callback):
    """Every parameter (float64 copies) after every optimizer step, and the step of each evaluation."""

    def __init__(self) -> None:
        self.weights: list[dict[str, torch.Tensor]] = []

    def on_step(self, trainer, step, loss):
        assert not trainer.average.applied  # callbacks see the trained weights between steps
        self.weights.append({n: p.detach().double().clone() for n, p in trainer.model.named_parameters()})


def reference(weights: list[dict[str, torch.Tensor]], decay: float, t: int) -> dict[str, torch.Tensor]:
    """(1 - d) sum_{k<=t} d^(t-k) w_k / (1 - d^t), by a loop."""
    out = {n: torch.zeros_like(w) for n, w in weights[0].items()}
    for k in range(1, t + 1):
        for n, w in weights[k - 1].items():
            out[n] += (1 - decay) * decay ** (t - k) * w
    return {n: v / (1 - decay**t) for n, v in out.items()}


@pytest.mark.parametrize(("sparse_optimizer", "sparse_grad"),
                         [("sparse_adam", True), ("adagrad", True), ("rowwise_adagrad", True), ("adagrad", False)])
def test_average_is_the_debiased_ema_of_every_steps_weights(tmp_path, sparse_optimizer, sparse_grad):
    decay = 0.8
    torch.manual_seed(0)
    model = TinyCTR()
    model.emb.sparse = sparse_grad  # dense table gradients: the touched rows are the non-zero ones
    train = MemLoader(make_data(160, 0), 8, shuffle=True, seed=1)  # 8 rows a batch: most table rows idle
    valid = MemLoader(make_data(200, 1), 100)
    rec = Record()
    tr = Trainer(model, train, tiny_cfg(epochs=2, eval_every=7, ema_decay=decay, sparse_optimizer=sparse_optimizer),
                 valid_loader=valid, run_dir=tmp_path / "run", callbacks=[rec])
    assert set(tr.average.row_index) == {tr.average.names.index("emb.weight")}
    summary = tr.fit()
    steps = summary["steps"]
    assert steps == 40 and len(rec.weights) == steps
    # rows idle for many steps: the lazy catch-up is what makes the table match
    idle = (rec.weights[-1]["emb.weight"] == rec.weights[-12]["emb.weight"]).all(1)
    assert idle.sum() > 10
    want = reference(rec.weights, decay, steps)
    for name, p in model.named_parameters():  # fit() leaves the average in the model
        torch.testing.assert_close(p.double(), want[name], rtol=0, atol=2e-6, msg=name)
    # best.pt holds the average at the best evaluation, and its valid AUC is the one logged
    best = Checkpoint.load(tmp_path / "run" / "best.pt")
    at = best.trainer.progress.step
    assert at == summary["best_step"] and at in (7, 14, 21, 28, 35, 40)
    for name, w in reference(rec.weights, decay, at).items():
        torch.testing.assert_close(best.weights[name].double(), w, rtol=0, atol=2e-6, msg=name)
    fresh = TinyCTR()
    fresh.load_state_dict(best.weights)
    fresh.eval()
    with torch.no_grad():
        scores = torch.cat([fresh(b) for b in valid])
    labels = torch.cat([b.labels for b in valid])
    assert roc_auc(scores, labels) == pytest.approx(summary["best_metric"], abs=1e-9)
    # ... and the trained (not averaged) weights ride along for resume
    for name, w in rec.weights[at - 1].items():
        torch.testing.assert_close(best.trainer.weight_average["raw"][name].double(), w, rtol=0, atol=0)


def test_average_differs_from_the_trained_weights():
    """Guard for the test above: the average is not the last weights (the decay does something)."""
    torch.manual_seed(0)
    train, _ = tiny_loaders(n_train=320, bs=16)
    rec = Record()
    tr = Trainer(TinyCTR(), train, tiny_cfg(epochs=1, ema_decay=0.9), callbacks=[rec])
    tr.fit()
    diff = (tr.model.lin.weight.double() - rec.weights[-1]["lin.weight"]).abs().max()
    assert diff > 1e-3


@pytest.mark.parametrize("kill_at", [7, 25])  # mid-epoch 0, and mid-epoch 1 after an eval
def test_resume_with_averaging_is_exact(tmp_path, kill_at):
    cfg = tiny_cfg(epochs=2, eval_every=10, checkpoint_every=1, sparse_optimizer="sparse_adam", ema_decay=0.9)
    full, full_summary, resumed, summary, _ = resume_after_kill(tmp_path, cfg, kill_at)
    assert summary["steps"] == full_summary["steps"] == 32
    for (name, p), q in zip(full.model.named_parameters(), resumed.model.parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=0, atol=1e-6, msg=name)
    assert summary["best_metric"] == pytest.approx(full_summary["best_metric"], abs=1e-7)
    a, b = (Checkpoint.load(d / "best.pt").weights for d in (tmp_path / "full", tmp_path / "cut"))
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=0, atol=1e-6, msg=name)


def test_resume_refuses_a_changed_decay_or_a_checkpoint_without_averaging(tmp_path):
    train, valid = tiny_loaders(n_train=256)
    Trainer(TinyCTR(), train, tiny_cfg(epochs=1, ema_decay=0.9), valid_loader=valid, run_dir=tmp_path / "a").fit()
    Trainer(TinyCTR(), train, tiny_cfg(epochs=1), valid_loader=valid, run_dir=tmp_path / "b").fit()
    with pytest.raises(TrainingError, match=r"ema_decay=0.9; resume with that value"):
        Trainer(TinyCTR(), train, tiny_cfg(epochs=2), valid_loader=valid, resume_from=tmp_path / "a" / "last.pt")
    with pytest.raises(TrainingError, match=r"ema_decay=0.9, this run asks for 0.99"):
        Trainer(TinyCTR(), train, tiny_cfg(epochs=2, ema_decay=0.99), valid_loader=valid,
                resume_from=tmp_path / "a" / "last.pt")
    with pytest.raises(TrainingError, match=r"without weight averaging; resume with train.ema_decay=null"):
        Trainer(TinyCTR(), train, tiny_cfg(epochs=2, ema_decay=0.9), valid_loader=valid,
                resume_from=tmp_path / "b" / "last.pt")


@pytest.mark.parametrize("decay", [0.0, 1.0, 1.5, -0.1, True])
def test_decay_outside_0_1_is_a_config_error(decay):
    train, _ = tiny_loaders(n_train=64)
    with pytest.raises(ConfigError, match=r"train.ema_decay=.* must lie strictly between 0 and 1"):
        Trainer(TinyCTR(), train, tiny_cfg(ema_decay=decay))


def test_fit_twice_with_averaging_says_to_resume():
    train, _ = tiny_loaders(n_train=64)
    tr = Trainer(TinyCTR(), train, tiny_cfg(epochs=1, ema_decay=0.9))
    tr.fit()
    with pytest.raises(TrainingError, match="resume a new Trainer from the run's last.pt"):
        tr.fit()


def test_before_the_first_step_the_average_is_the_weights():
    model = TinyCTR()
    avg = WeightAverage(model, 0.99, [model.emb.weight])
    for p, a in zip(model.parameters(), avg.averaged(), strict=True):
        assert torch.equal(p, a)
