"""Hyper-parameter search: ``ctrkit tune --config C --trials N`` runs an Optuna study (TPE, pruning) over a config.

The search space is YAML beside the config (``deepfm.search.yaml`` for ``deepfm.yaml``; or ``--space``)::

    metric: auc                  # the objective, best valid value of a trial (default: train.early_stopping.metric)
    pruner: {kind: median, startup_trials: 3, warmup_evals: 1}   # or {kind: none}
    params:                      # config key paths, as in overrides
      train.lr: {low: 1.0e-4, high: 1.0e-2, log: true}       # also step: 0.1, int: true (train.epochs)
      model.params.dnn_hidden: {choices: [[256, 128], [400, 400, 400]]}

Each key is checked first (an unknown one names the closest) and a config built with each range end and choice.
The study directory (``--out``, default ``<run.dir>/tune/<dataset>-<model>``) holds ``study.db`` (SQLite:
rerun the command to resume), ``trials/trial-<n>/`` (normal run dirs) and ``best.yaml`` (``ctrkit train --config``).

- The objective is a trial's best *valid* metric (``summary["best"]["value"]``; tune makes the metric
  ``train.early_stopping.metric``, by which best.pt is chosen); test is never looked at.
- A trial reports the metric after each evaluation at step = its index (0, 1, ...): epoch by epoch, any batch size.
  A pruned trial ends as an early-stopped run does (``Trainer.stop``): its directory has summary.json (with
  ``stopped_by`` saying when it was pruned) and report.html like a complete trial's.
- TPE samples at random for its first ``min(10, max(2, N // 2))`` trials, seeded ``seed + trials so far``.
- ``--trials N`` counts finished (complete or pruned) trials, resumed ones too. One tune per study directory
  (a lock): a RUNNING trial found at start was left by a killed process; it is marked FAIL and run again. A
  resumed study keeps its config and search space; a TrainingError (a non-finite loss) fails one trial only.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import logging
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ctrkit.errors import ConfigError, JobError, TrainingError
from ctrkit.io import atomic_file
from ctrkit.jobs.train import train_from_config
from ctrkit.jobs.tune_space import (
    SearchSpace,
    default_space_path,
    load_search_space,
    suggest_value,
    with_values,
)
from ctrkit.metrics import higher_is_better
from ctrkit.training.callbacks import Callback
from ctrkit.training.config import Config, apply_overrides, config_from_dict, config_to_dict, read_config_file
from ctrkit.training.rundir import RunLock
from ctrkit.typecheck import PositiveFloat, PositiveInt, Seed, cli_type

log = logging.getLogger(__name__)

BEST_MARK = "# written by ctrkit tune"  # the first line of a best.yaml that tune may replace


# ---- the study ---------------------------------------------------------------------------------------------
@dataclass
class TuneResult:
    study: str
    storage: Path
    metric: str
    best: Any  # the best optuna FrozenTrial: number, value, user_attrs "values" and "run_dir"
    best_config: Path
    counts: dict[str, int]  # trials by state: complete, pruned, fail, finished (complete + pruned)


class _PruneOnEval(Callback):
    """Reports the valid ``metric`` of every evaluation to the trial; stops the run when the pruner says so
    (``pruned`` says why), so that a pruned trial is a finished run directory too: summary.json, report."""

    def __init__(self, trial: Any, metric: str) -> None:
        self.trial, self.metric, self.evals = trial, metric, 0
        self.pruned: str | None = None

    def on_eval(self, trainer: Any, metrics: dict[str, float]) -> None:
        value, index = metrics.get(self.metric), self.evals
        self.evals += 1
        if value is None or not math.isfinite(value) or self.pruned is not None:
            return
        self.trial.report(value, index)
        if self.trial.should_prune():
            self.pruned = f"valid {self.metric}={value:.6f} at evaluation {index} (step {trainer.step})"
            trainer.stop(f"pruned by ctrkit tune: {self.pruned}")


def _check_best_file(path: Path) -> None:
    if path.exists() and (not path.is_file() or not path.read_text().startswith(BEST_MARK)):
        raise JobError(f"{path} exists and was not written by ctrkit tune; move it away or choose another "
                       "--out (tune only replaces its own best.yaml)")


def _check_same_setup(study: Any, setup: dict[str, Any], study_dir: Path) -> None:
    """A resumed study goes on with the config and search space it started with (stored in the study)."""
    setup, old = json.loads(json.dumps(setup)), study.user_attrs.get("setup")
    if old is None:
        study.set_user_attr("setup", setup)
    elif old != setup:
        keys = [f"{part}.{k}" for part, new in setup.items() for k in new.keys() | old[part].keys()
                if new.get(k) != old[part].get(k)]
        raise JobError(f"--out {study_dir} holds a study of another setup ({', '.join(sorted(keys))} differ); "
                       "resume it with its config, overrides and search space, or choose another --out")


def _fail_stale_trials(study: Any, storage: Any, n_params: int) -> None:
    """Trials left RUNNING by a killed ``ctrkit tune``: FAIL, their parameters queued to run again."""
    from optuna.trial import TrialState

    study_id = storage.get_study_id_from_name(study.study_name)
    waiting = [t.params for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,))]
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, t.number)
        storage.set_trial_user_attr(trial_id, "stopped", "left RUNNING by a process that ended; a later run failed it")
        storage.set_trial_state_values(trial_id, TrialState.FAIL)
        again = len(t.params) == n_params and t.params not in waiting
        if again:
            study.enqueue_trial(t.params)
            waiting.append(t.params)
        log.warning("trial %d was left RUNNING by a tune that stopped (killed?): marked FAIL%s", t.number,
                    "; its parameters run again as a new trial" if again else "")


def tune(config: str | Path, trials: int, *, space: str | Path | None = None, study_dir: str | Path | None = None,
         timeout: float | None = None, seed: int = 0, overrides: Sequence[str] = ()) -> TuneResult:
    """Run (or resume) the study of ``config`` until it holds ``trials`` finished trials; see the module docstring."""
    try:
        import optuna
    except ImportError as e:
        raise JobError(f"ctrkit tune needs Optuna ({e}); pip install 'ctrkit[tune]'") from None
    if trials < 1:
        raise ConfigError(f"--trials must be >= 1, got {trials}")
    base = apply_overrides(read_config_file(config), list(overrides))
    cfg = config_from_dict(copy.deepcopy(base))
    if not cfg.data.valid:
        raise ConfigError("data.valid is not set: tune's objective is the best valid metric; give a valid store")
    spec = load_search_space(Path(space) if space is not None else default_space_path(config), base)
    metric = spec.metric or cfg.train.early_stopping.metric
    base = with_values(base, {"train.early_stopping.metric": metric,
                              "train.metrics": list(dict.fromkeys([*cfg.train.metrics, metric]))})
    cfg = config_from_dict(copy.deepcopy(base))
    name = f"{Path(config).resolve().parent.name}-{Path(config).stem}"  # criteo-deepfm
    root = Path(study_dir) if study_dir is not None else Path(cfg.run.dir) / "tune" / name
    root.mkdir(parents=True, exist_ok=True)
    _check_best_file(root / "best.yaml")
    try:  # one tune per study directory: a RUNNING trial found at start is stale
        lock = RunLock(root).acquire()
    except TrainingError:
        pid = (root / ".lock").read_text().strip() or "?"
        raise JobError(f"--out {root} is in use by another ctrkit tune (pid {pid}); wait for it or choose "
                       "another --out") from None
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # tune logs each trial itself
    try:
        return _run_study(name, root, base, cfg, spec, trials, timeout, seed)
    finally:
        optuna.logging.set_verbosity(level)
        lock.release()


def _run_study(name: str, root: Path, base: dict[str, Any], cfg: Config, spec: SearchSpace, trials: int,
               timeout: float | None, seed: int) -> TuneResult:
    import optuna

    db, trials_dir, best_path = root / "study.db", root / "trials", root / "best.yaml"
    if not db.exists() and trials_dir.is_dir() and any(trials_dir.iterdir()):
        raise JobError(f"--out {root} holds trials but no study.db; choose another --out")
    storage = optuna.storages.RDBStorage(f"sqlite:///{db.resolve()}")
    if others := [n for n in optuna.study.get_all_study_names(storage) if n != name]:
        raise JobError(f"--out {root} holds the study {others[0]!r}, not {name!r}; choose another --out")
    es = cfg.train.early_stopping
    maximise = higher_is_better(es.metric) if es.mode == "auto" else es.mode == "max"
    p = spec.pruner
    pruner = (optuna.pruners.MedianPruner(n_startup_trials=p.startup_trials, n_warmup_steps=p.warmup_evals)
              if p.kind == "median" else optuna.pruners.NopPruner())
    study = optuna.create_study(storage=storage, study_name=name, load_if_exists=True,
                                direction="maximize" if maximise else "minimize", pruner=pruner)
    setup = {k: v for k, v in config_to_dict(cfg).items() if k != "run"}  # run.*: where, not what
    setup["train"].pop("threads")  # how fast, not what
    _check_same_setup(study, {"config": setup, "space": dataclasses.asdict(spec)}, root)
    _fail_stale_trials(study, storage, len(spec.params))
    study.sampler = optuna.samplers.TPESampler(seed=seed + len(study.trials),
                                               n_startup_trials=min(10, max(2, trials // 2)))
    remaining = trials - _count(study)["finished"]
    log.info("study %s in %s: %d trials finished, %d to run; objective: best valid %s (%s)", name, db,
             trials - remaining, max(remaining, 0), es.metric, "max" if maximise else "min")

    def objective(trial: Any) -> float:
        values = {key: suggest_value(trial, key, s) for key, s in spec.params.items()}
        run_dir = trials_dir / f"trial-{trial.number}"
        trial.set_user_attr("values", values)
        trial.set_user_attr("run_dir", str(run_dir))
        log.info("trial %d: %s", trial.number, _fmt_values(values))
        trial_cfg = config_from_dict(with_values(base, {**values, "run.dir": str(trials_dir),
                                                        "run.name": run_dir.name, "train.progress": False}))
        pruner = _PruneOnEval(trial, es.metric)
        summary = train_from_config(trial_cfg, progress=False, callbacks=[pruner])
        if pruner.pruned is not None:
            raise optuna.TrialPruned(pruner.pruned)
        value = (summary.get("best") or {}).get("value")
        if value is None or not math.isfinite(value):
            raise TrainingError(f"trial {trial.number}: no finite valid {es.metric} was computed (run {run_dir})")
        return float(value)

    if remaining > 0:
        study.optimize(objective, n_trials=remaining, timeout=timeout, catch=(TrainingError,), callbacks=[_log_trial])
    counts = _count(study)
    if counts["complete"] == 0:
        raise JobError(f"no trial of study {name} completed ({counts}); see the log and the run directories "
                       f"under {trials_dir}")
    best = study.best_trial
    values = best.user_attrs["values"]
    text = yaml.safe_dump(config_to_dict(config_from_dict(with_values(base, values))), sort_keys=False)
    _check_best_file(best_path)
    with atomic_file(best_path, option="--out") as tmp:
        tmp.write_text(f"{BEST_MARK}: study {name} ({db}), trial {best.number}, valid {es.metric}="
                       f"{best.value:.6f}\n# {_fmt_values(values)}\n{text}")
    return TuneResult(name, db, es.metric, best, best_path, counts)


def _count(study: Any) -> dict[str, int]:
    states = [t.state.name.lower() for t in study.get_trials(deepcopy=False)]
    n = {k: states.count(k) for k in ("complete", "pruned", "fail")}
    return {**n, "finished": n["complete"] + n["pruned"]}


def _log_trial(study: Any, trial: Any) -> None:
    state, values = trial.state.name.lower(), trial.intermediate_values
    if state == "complete":
        log.info("trial %d complete in %.1fs: valid %.6f (best: trial %d, %.6f)", trial.number,
                 trial.duration.total_seconds(), trial.value, study.best_trial.number, study.best_value)
    elif state == "pruned":
        log.info("trial %d pruned after %d evaluations (valid %.6f)", trial.number, len(values), values[max(values)])
    else:
        log.warning("trial %d %s (run %s)", trial.number, state, trial.user_attrs.get("run_dir"))


def _fmt_values(values: dict[str, Any]) -> str:
    return "  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())


# ---- CLI -----------------------------------------------------------------------------------------------
def add_tune_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="YAML config whose keys are searched (see configs/)")
    p.add_argument("--trials", type=cli_type(PositiveInt), required=True,
                   help="finished trials the study should hold (resumes count)")
    p.add_argument("--space", help="search space YAML (default: <config stem>.search.yaml beside the config)")
    p.add_argument("--out", help="study directory: study.db, trials/ and best.yaml (default: "
                                 "<run.dir>/tune/<dataset>-<model>)")
    p.add_argument("--timeout", type=cli_type(PositiveFloat),
                   help="stop starting trials after this many seconds")
    p.add_argument("--seed", type=cli_type(Seed), default=0, help="the sampler's seed")
    p.add_argument("--log", action="append", choices=["tensorboard"], help="extra logger of every trial")


def run_tune(args: argparse.Namespace) -> int:
    """``ctrkit tune``: the best trial and its config on stdout; Ctrl-C keeps the study for a rerun."""
    overrides = [*(getattr(args, "overrides", None) or []), *([f"run.log=[{','.join(args.log)}]"] if args.log else [])]
    try:
        r = tune(args.config, args.trials, space=args.space, study_dir=args.out, timeout=args.timeout,
                 seed=args.seed, overrides=overrides)
    except KeyboardInterrupt:
        log.error("interrupted (Ctrl-C); the study is kept: run the same command again to resume it")
        return 130
    c, b = r.counts, r.best
    sys.stdout.write(f"study {r.study}: {c['finished']} trials finished ({c['complete']} complete, {c['pruned']} "
                     f"pruned), {c['fail']} failed; {r.storage}\n"
                     f"best: trial {b.number}, valid {r.metric}={b.value:.6f} (run {b.user_attrs['run_dir']})\n"
                     f"params: {_fmt_values(b.user_attrs['values'])}\n"
                     f"best config: {r.best_config} (ctrkit train --config {r.best_config})\n")
    return 0
