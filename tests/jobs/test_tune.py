"""ctrkit tune: trials are run directories, pruning, best.yaml, resume after a kill, search-space checks."""

from __future__ import annotations

import fcntl
import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ctrkit.cli import main
from ctrkit.data.sources.criteo import preprocess_criteo
from ctrkit.errors import ConfigError
from ctrkit.jobs.demo import SAMPLE
from ctrkit.jobs.train import train_from_config
from ctrkit.jobs.tune_space import default_space_path, load_search_space
from ctrkit.training.config import load_config, read_config_file

optuna = pytest.importorskip("optuna")
from optuna.trial import TrialState

REPO = Path(__file__).resolve().parents[2]
CONFIG = str(REPO / "configs" / "criteo" / "deepfm.yaml")
GOOD, BAD = 3e-3, 1e-7  # learning rates: one learns within an epoch, the other leaves the random model


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    d = tmp_path_factory.mktemp("tune_data")
    with gzip.open(SAMPLE, "rt") as f:
        (d / "rows.tsv").write_text("".join(next(f) for _ in range(2000)))
    return preprocess_criteo(d / "rows.tsv", d / "criteo", split="0.7,0.3", seed=0, min_freq=4, embedding_dim=4,
                             progress=False)


def _overrides(stores, epochs=3):
    # embedding_lr null: the embeddings follow train.lr, so a trial's one learning rate decides it
    return [f"--data.train={stores['train']}", f"--data.valid={stores['test']}", "--data.test=null",
            "--model.params.dnn_hidden=[8]", f"--train.epochs={epochs}", "--train.embedding_lr=null",
            "--train.early_stopping.patience=0", "--train.threads=1"]


def _space(path, params, pruner="{kind: median, startup_trials: 1, warmup_evals: 0}"):
    path.write_text(f"metric: auc\npruner: {pruner}\nparams:\n" + "".join(f"  {k}: {v}\n" for k, v in params.items()))
    return path


def _study(root):
    return optuna.load_study(study_name="criteo-deepfm", storage=f"sqlite:///{root / 'study.db'}")


@pytest.fixture(scope="module")
def study(stores, tmp_path_factory):
    """4 trials over two learning rates; the median pruner stops a BAD trial once a GOOD one has finished. The
    first two trials are queued (GOOD, then BAD) so that the pruning does not hang on the sampler's draws."""
    d = tmp_path_factory.mktemp("tune")
    (d / "s").mkdir()
    queued = optuna.create_study(storage=f"sqlite:///{d / 's' / 'study.db'}", study_name="criteo-deepfm",
                                 direction="maximize")
    for lr in (GOOD, BAD):
        queued.enqueue_trial({"train.lr": lr})
    space = _space(d / "space.yaml", {"train.lr": "{choices: [3.0e-3, 1e-7]}"})  # the same lr: the same run
    args = ["tune", "--config", CONFIG, "--trials", "4", "--space", str(space), "--out", str(d / "s"),
            "--seed", "3", "--log", "tensorboard", *_overrides(stores)]
    return d / "s", args


def test_trials_are_run_directories_and_the_objective_is_the_best_valid_auc(study, capsys):
    root, args = study
    assert main(args) == 0
    out = capsys.readouterr().out
    s = _study(root)
    done = [t for t in s.trials if t.state == TrialState.COMPLETE]
    assert len(done) + len([t for t in s.trials if t.state == TrialState.PRUNED]) == 4
    for t in done:
        run = root / "trials" / f"trial-{t.number}"
        assert t.user_attrs["run_dir"] == str(run)
        for name in ("config.yaml", "metrics.jsonl", "summary.json", "best.pt", "tensorboard"):
            assert (run / name).exists(), (t.number, name)
        cfg = load_config(run / "config.yaml")
        assert cfg.train.lr == t.params["train.lr"] and cfg.run.name == f"trial-{t.number}"
        summary = json.loads((run / "summary.json").read_text())
        valid_aucs = [r["auc"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
                      if r["kind"] == "eval"]
        assert t.value == summary["best"]["value"] == max(valid_aucs)
    assert f"best: trial {s.best_trial.number}, valid auc={s.best_value:.6f}" in out


def test_bad_trials_are_pruned_once_a_good_one_has_finished(study):
    root, _ = study
    trials = sorted(_study(root).trials, key=lambda t: t.number)
    assert trials[1].state == TrialState.PRUNED  # the queued BAD one
    for i, t in enumerate(trials):
        good_before = any(p.params["train.lr"] == GOOD and p.state == TrialState.COMPLETE for p in trials[:i])
        should_prune = t.params["train.lr"] == BAD and good_before
        assert (t.state == TrialState.PRUNED) == should_prune, (t.number, t.params, t.state)
        if t.state == TrialState.PRUNED:  # stopped at its first evaluation, of the 3 epochs it had
            assert len(t.intermediate_values) == 1
            run = root / "trials" / f"trial-{t.number}"  # a finished run directory all the same
            summary = json.loads((run / "summary.json").read_text())
            assert summary["epochs"] == 1 and summary["stopped_by"].startswith("pruned by ctrkit tune: valid auc=")
            assert summary["best"]["value"] == t.intermediate_values[0]
            assert (run / "report.html").is_file() and (run / "best.pt").is_file()
            assert "(stopped: pruned by ctrkit tune" in (run / "report.html").read_text()


def test_best_yaml_loads_and_retrains_to_the_best_trials_value(study, tmp_path):
    root, _ = study
    s = _study(root)
    best = load_config(root / "best.yaml")
    for key, value in s.best_params.items():
        section, *rest = key.split(".")
        node = getattr(best, section)
        for part in rest[:-1]:
            node = getattr(node, part) if not isinstance(node, dict) else node[part]
        got = node[rest[-1]] if isinstance(node, dict) else getattr(node, rest[-1])
        assert got == value, key
    assert best.run.dir == "runs" and best.run.name is None  # the config's own run block, not the trial's
    best = load_config(root / "best.yaml", [f"run.dir={tmp_path}", "run.name=again"])
    assert train_from_config(best, progress=False)["best"]["value"] == s.best_value  # same seed: same run


def test_a_finished_study_is_not_run_again_and_a_changed_setup_is_refused(study, capsys, caplog):
    root, args = study
    n = len(_study(root).trials)
    assert main(args) == 0 and len(_study(root).trials) == n
    assert main([*args, "--train.threads=2"]) == 0  # how fast is not what: the same study
    assert main([*args, "--train.lr=0.5"]) == 2
    assert "holds a study of another setup (config.train differ)" in caplog.text


def test_one_tune_per_study_dir(study, caplog):
    root, args = study
    fd = os.open(root / ".lock", os.O_RDWR | os.O_CREAT, 0o644)  # held as another tune would: also when run alone
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert main(args) == 2
    finally:
        os.close(fd)
    assert "is in use by another ctrkit tune" in caplog.text


def test_refuses_to_replace_a_best_yaml_it_did_not_write(stores, tmp_path, caplog):
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "best.yaml").write_text("mine: true\n")
    space = _space(tmp_path / "space.yaml", {"train.lr": f"{{choices: [{GOOD}]}}"})
    rc = main(["tune", "--config", CONFIG, "--trials", "1", "--space", str(space), "--out",
               str(tmp_path / "s"), *_overrides(stores)])
    assert rc == 2 and "was not written by ctrkit tune" in caplog.text
    assert (tmp_path / "s" / "best.yaml").read_text() == "mine: true\n"
    assert not (tmp_path / "s" / "study.db").exists()


@pytest.mark.slow
def test_resume_after_a_kill_fails_the_running_trial_and_finishes_the_study(stores, tmp_path):
    root = tmp_path / "s"
    space = _space(tmp_path / "space.yaml", {"train.lr": "{low: 1.0e-3, high: 1.0e-2, log: true}"},
                   pruner="{kind: none}")
    args = ["tune", "--config", CONFIG, "--trials", "3", "--space", str(space), "--out", str(root), "--seed",
            "0", *_overrides(stores, epochs=12)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "ctrkit.cli", *args], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:  # kill it in the middle of trial 1: once its metrics.jsonl has a record
        deadline = time.monotonic() + 300
        while not (root / "trials" / "trial-1" / "metrics.jsonl").is_file():
            assert proc.poll() is None and time.monotonic() < deadline, "the study ended before trial 1 trained"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    s = _study(root)
    assert [t.state for t in s.trials] == [TrialState.COMPLETE, TrialState.RUNNING]  # as the kill left it
    killed = s.trials[1].params

    assert main(args) == 0
    trials = _study(root).trials
    assert trials[1].state == TrialState.FAIL and "stopped" in trials[1].user_attrs
    assert [t.state for t in trials].count(TrialState.COMPLETE) == 3 and len(trials) == 4
    assert trials[2].params == killed  # the killed trial's parameters ran again, as trial 2
    assert (root / "trials" / "trial-3" / "summary.json").is_file()


@pytest.mark.parametrize("params, message", [
    ({"train.lrr": "{low: 0.001, high: 0.01}"}, "unknown config key 'train.lrr' (did you mean 'lr'?)"),
    ({"model.params.dnn_dropuot": "{low: 0.0, high: 0.5}"}, "parameter 'dnn_dropuot' (did you mean 'dnn_dropout'?)"),
    ({"train.lr": "{lo: 0.001, high: 0.01}"}, "'params.train.lr.lo' in 'params.train.lr' (did you mean 'low'?)"),
    ({"train.epochs": "{low: 1, high: 4}"}, "expects int >= 1, got 1.0; write int: true"),
    ({"train": "{low: 1, high: 4}"}, "'train' is a block of the config"),
    ({"train.lr": "{low: 0.0, high: 0.01, log: true}"}, "a log range needs low > 0"),
    ({"train.lr": "{low: -1.0, high: 0.01}"}, "the value -1.0 makes a bad config: config key 'train.lr' expects float > 0"),
    ({"model.params.dnn_hidden": "{choices: [[64], 32]}"}, "the value 32 makes a bad config"),
])
def test_a_bad_search_space_names_the_key_and_the_fix(tmp_path, params, message):
    space = _space(tmp_path / "s.yaml", params)
    with pytest.raises(ConfigError, match="search space .*s.yaml") as e:
        load_search_space(space, read_config_file(CONFIG))
    assert message in str(e.value)


SPACES = sorted((REPO / "configs").glob("*/*.search.yaml"))


@pytest.mark.parametrize("space", SPACES, ids=[f"{p.parent.name}/{p.name}" for p in SPACES])
def test_every_shipped_search_space_fits_its_config(space):
    config = space.with_name(space.name.removesuffix(".search.yaml") + ".yaml")
    assert default_space_path(config) == space
    assert load_search_space(space, read_config_file(config)).params


def test_shipped_search_spaces():
    assert {f"{p.parent.name}/{p.name}" for p in SPACES} >= {"criteo/deepfm.search.yaml",
                                                             "movielens/deepfm.search.yaml"}
