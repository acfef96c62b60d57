"""Data parallel on this machine, for real: torchrun workers on loopback with gloo (issue 26's tests a, b, c, e, f).

One-process and two-process runs of the same config (deepfm on the bundled Criteo sample, global batch 256) train
on the same rows per step, so their losses and metrics agree to float rounding; the distributed evaluation is the
one-process evaluation; a checkpoint of a two-process run is an ordinary checkpoint; two "nodes" of one process
each are the same run; a worker killed mid-run stops the job with one line, and a restart resumes exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from ddp_workers import evaluate_share, free_port, kill_module

from ctrkit.checkpoint import Checkpoint
from ctrkit.data.sources.criteo import preprocess_criteo
from ctrkit.jobs.demo import SAMPLE
from ctrkit.jobs.evaluate import evaluate_checkpoint

pytestmark = pytest.mark.slow
TIMEOUT = 120  # seconds for one run of a few seconds: a hang fails the test instead of the suite


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    d = tmp_path_factory.mktemp("ddp")
    return d, preprocess_criteo(SAMPLE, d / "criteo", split="0.8,0.1,0.1", seed=0, min_freq=8, embedding_dim=8)


def _overrides(d: Path, st: dict, name: str, *extra: str) -> list[str]:
    return [f"data.train={st['train']}", f"data.valid={st['valid']}", f"data.test={st['test']}",
            "data.batch_size=256", "data.eval_batch_size=512", "train.epochs=2", "train.early_stopping.patience=0",
            "train.log_every=5", "train.metrics=[auc,logloss]", f"run.dir={d / 'runs'}", f"run.name={name}", *extra]


def _env(pythonpath: Path | None = None) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = os.pathsep.join([*([str(pythonpath)] if pythonpath else []), src,
                                         *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    return env


def _ctrkit(args: list[str], env: dict[str, str] | None = None, ok: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run([sys.executable, "-m", "ctrkit", *args], capture_output=True, text=True, timeout=TIMEOUT,
                       env=env or _env(), check=False)
    if ok:
        assert p.returncode == 0, p.stderr[-3000:]
    return p


def _train(d, st, name, *launch, extra=(), env=None, ok=True) -> subprocess.CompletedProcess:
    return _ctrkit(["train", "--config", "configs/criteo/deepfm.yaml", "--quiet", *launch,
                    *_overrides(d, st, name, *extra)], env, ok)


def _records(run: Path) -> tuple[list[dict], list[dict]]:
    rec = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rec if r["kind"] == "train"], [r for r in rec if r["kind"] == "eval"]


@pytest.fixture(scope="module")
def runs(stores):
    """The same run on one process, on two through `python -m torch.distributed.run` directly, and on two
    through `ctrkit train --nproc-per-node 2`."""
    d, st = stores
    _train(d, st, "one")
    torchrun = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "ctrkit",
         "train", "--config", "configs/criteo/deepfm.yaml", "--quiet", *_overrides(d, st, "torchrun")],
        capture_output=True, text=True, timeout=TIMEOUT, env=_env(), check=False)
    assert torchrun.returncode == 0, torchrun.stderr[-3000:]
    launched = _train(d, st, "two", "--nproc-per-node", "2")
    return d, st, launched


def test_two_processes_train_the_one_process_run(runs):
    """(a) Same global batch and seed: the logged losses agree to float rounding at every step, so do the
    evaluations, and the final test AUC is within 0.001 (here: within 1e-6)."""
    d, _, _ = runs
    one, two = (json.loads((d / "runs" / n / "summary.json").read_text()) for n in ("one", "two"))
    assert two["environment"]["processes"] == 2 and two["environment"]["backend"] == "gloo"
    assert one["environment"]["processes"] == 1
    assert two["samples"] == one["samples"] and two["steps"] == one["steps"] == 2 * 26
    for name in ("torchrun", "two"):
        (t1, e1), (t2, e2) = _records(d / "runs" / "one"), _records(d / "runs" / name)
        assert [r["step"] for r in t2] == [r["step"] for r in t1] and len(e2) == len(e1) == 2  # written once
        np.testing.assert_allclose([r["loss"] for r in t2], [r["loss"] for r in t1], rtol=1e-5)
        np.testing.assert_allclose([r["auc"] for r in e2], [r["auc"] for r in e1], atol=1e-6)
    assert abs(two["test"]["auc"] - one["test"]["auc"]) < 1e-3


def test_only_rank_0_writes_and_prints(runs):
    d, _, launched = runs
    run = d / "runs" / "two"
    assert sorted(p.name for p in run.iterdir() if p.name != ".lock") == sorted(
        ["best.pt", "config.yaml", "last.pt", "metrics.jsonl", "predictions.npz", "report", "report.html", "summary.json"])
    assert launched.stdout.count("test with best.pt") == 1
    assert "[rank 1] INFO" not in launched.stderr  # the other ranks log warnings only


def test_a_two_process_checkpoint_is_an_ordinary_checkpoint(runs):
    """(c) best.pt of the two-process run loads in one process and scores the test split to the metrics the
    two-process run reported."""
    d, st, _ = runs
    summary = json.loads((d / "runs" / "two" / "summary.json").read_text())
    _, metrics = evaluate_checkpoint(str(d / "runs" / "two" / "best.pt"), st["test"])
    assert metrics["auc"] == summary["test"]["auc"]
    assert metrics["logloss"] == pytest.approx(summary["test"]["logloss"], rel=1e-12)


@pytest.mark.parametrize("world", [2, 3])
def test_distributed_evaluation_is_the_one_process_evaluation(runs, tmp_path, world):
    """(b) The ranks' round-robin shares, gathered back into batch order, give exactly the metrics of one
    process over the same batches (3 ranks: unequal shares)."""
    d, st, _ = runs
    ckpt = str(d / "runs" / "two" / "best.pt")
    metrics = ["auc", "logloss", "accuracy"]
    out = tmp_path / "m.npy"
    mp.start_processes(evaluate_share, args=(world, free_port(), ckpt, st["test"], metrics, 128, str(out)),
                       nprocs=world, start_method="spawn")
    got = np.load(out, allow_pickle=True).item()
    c = Checkpoint.load(ckpt)
    model = c.build_model()
    from ctrkit.data.storage.loader import BatchLoader
    from ctrkit.training.tasks import CTRTask

    want = CTRTask(metrics).bind(model).evaluate(
        model, BatchLoader(st["test"], 128, shuffle=False, prefetch=0, pipeline=c.feature_pipeline()))
    assert got == want


def test_two_nodes_of_one_process_each(runs):
    """(e) torchrun --nnodes 2 --node-rank 0/1 against 127.0.0.1: the two-process run."""
    d, st, _ = runs
    port = str(free_port())
    launch = ["--nproc-per-node", "1", "--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", port]
    cmd = [sys.executable, "-m", "ctrkit", "train", "--config", "configs/criteo/deepfm.yaml", "--quiet",
           *_overrides(d, st, "nodes")]
    nodes = [subprocess.Popen([*cmd, *launch, "--node-rank", str(r)], env=_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=TIMEOUT) for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    _, e_nodes = _records(d / "runs" / "nodes")
    _, e_two = _records(d / "runs" / "two")
    np.testing.assert_allclose([r["auc"] for r in e_nodes], [r["auc"] for r in e_two], atol=1e-9)


def test_a_killed_rank_stops_the_job_with_one_line(runs, tmp_path):
    """(f) Rank 1 killed at step 30: the job fails with exit 2 and one line naming the rank and the step."""
    d, st, _ = runs
    p = _train(d, st, "killed", "--nproc-per-node", "2", env=_env(kill_module(tmp_path / "k", 1, 30)), ok=False)
    assert p.returncode == 2
    errors = [line for line in p.stderr.splitlines() if line.startswith("ERROR ctrkit")]
    assert len(errors) == 1 and "rank 1 was killed by signal SIGKILL" in errors[0], p.stderr[-2000:]
    assert "step 26" in errors[0] and "--resume" in errors[0]


def test_a_restart_resumes_exactly(runs, tmp_path):
    """(f) With --max-restarts 1 the killed job restarts from last.pt (step 26, the end of epoch 1) and ends with
    the weights of the run that was never killed."""
    d, st, _ = runs
    _train(d, st, "restarted", "--nproc-per-node", "2", "--max-restarts", "1",
           env=_env(kill_module(tmp_path / "k", 1, 30)))
    a = Checkpoint.load(d / "runs" / "restarted" / "last.pt").weights
    b = Checkpoint.load(d / "runs" / "two" / "last.pt").weights
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)
    summary = json.loads((d / "runs" / "restarted" / "summary.json").read_text())
    assert summary["steps"] == 52


def test_retrieval_towers_train_through_ddp_with_negatives_from_every_rank(tmp_path):
    """Two-tower retrieval on two processes with train.distributed.gather_negatives: every rank's items are the
    in-batch negatives of every query, so the run is the one-process run (no dropout: ranks draw their own
    masks) -- the same losses and the same gathered full-ranking metrics."""
    from conftest import write_log

    from ctrkit.data.sources.behaviour import preprocess_behaviour

    st = preprocess_behaviour(write_log(tmp_path / "log.csv", n_users=120, n_items=60, per_user=10),
                              tmp_path / "beh", attr_cols=["cat:cate"], time_col="time", embedding_dim=8)
    common = ["train", "--config", "configs/ml100k_retrieval/two_tower.yaml", "--quiet", f"data.train={st['train']}",
              f"data.valid={st['valid']}", f"data.test={st['test']}", "train.epochs=2", "data.batch_size=128",
              "train.early_stopping.patience=0", "train.log_every=2", "model.params.dnn_dropout=0",
              f"run.dir={tmp_path / 'runs'}"]
    _ctrkit([*common, "run.name=one"])
    _ctrkit([*common, "run.name=two", "--nproc-per-node", "2", "train.distributed.gather_negatives=true"])
    (t1, e1), (t2, e2) = _records(tmp_path / "runs" / "one"), _records(tmp_path / "runs" / "two")
    assert len(t1) == len(t2) > 3
    np.testing.assert_allclose([r["loss"] for r in t2], [r["loss"] for r in t1], rtol=1e-5)
    for a, b in zip(e1, e2):
        assert {k: b[k] for k in ("hr@10", "ndcg@10", "mrr")} == pytest.approx(
            {k: a[k] for k in ("hr@10", "ndcg@10", "mrr")}, abs=1e-6)
