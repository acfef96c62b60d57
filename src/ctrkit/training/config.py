"""Run configuration: YAML -> validated dataclasses, with type-checked ``--train.lr=3e-4`` overrides.

A config file has four blocks, each a dataclass below::

    data:  {train: path/to/store, valid: ..., batch_size: 4096, shuffle: true}
    model: {name: dlrm, params: {interaction: dot, over_arch: [512, 256, 1]}}
    train: {epochs: 1, lr: 1.0e-3, sparse_optimizer: rowwise_adagrad, early_stopping: {patience: 2}}
    run:   {dir: runs, name: criteo-dlrm}

A file may inherit base files, merged in order under its own keys (mappings deep-merged)::

    defaults: [../_base/criteo.yaml]      # paths relative to this file
    model: {name: deepfm, params: {dnn_hidden: [256, 128]}}
    train: {embedding_lr: 0.01}           # overrides one key of the base's train block

Every key is checked against the dataclass fields: an unknown key anywhere is a
:class:`~ctrkit.errors.ConfigError` naming the full key path and the closest valid key;
a value of the wrong type or out of its range names the key, what is allowed and the value
(:mod:`ctrkit.typecheck`). Ranges are declared with the fields (``batch_size: PositiveInt``); a float is
always finite (``early_stopping.min_delta=nan`` is refused).
``model.params`` is a free dict here; ``create_model`` checks it against the model's signature later.

Overrides (from the command line) are ``key.path=value`` with an optional leading ``--``; the value
is parsed for the field's type (``3e-4`` -> float, ``true`` -> bool, ``[64,32]`` -> list, ``null``
-> None for Optional fields). Inside ``model.params`` values are parsed as YAML.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml

from ctrkit.errors import ConfigError
from ctrkit.io import missing_path
from ctrkit.typecheck import (
    Bound,
    CliValue,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Seed,
    build,
    suggest,
)

DenseOptimizer = Literal["adam", "adamw", "sgd", "adagrad"]
SparseOptimizer = Literal["adagrad", "rowwise_adagrad", "sparse_adam", "sgd"]


@dataclass
class DataConfig:
    """Where the columnar stores are and how batches are cut from them."""

    # one store, or day stores read in day order (data/storage/days.py): a list in day order or one glob pattern
    # ('days/day_*/train', natural order)
    train: list[str] | str | None = None
    valid: str | None = None
    test: str | None = None
    batch_size: PositiveInt = 2048
    eval_batch_size: PositiveInt | None = None  # None: 4 x batch_size
    shuffle: bool = True
    drop_last: bool = False
    prefetch: NonNegativeInt = 2  # batches built ahead by the loader's background thread
    # multi-hot expansion of seed 000 (None: off)
    # one size for every table, or one per sparse feature in schema order (MLPerf DLRM-DCNv2's sizes; 1 = unchanged)
    multi_hot_size: PositiveInt | list[PositiveInt] | None = None
    multi_hot_min_table_size: NonNegativeInt = 200
    multi_hot_distribution: Literal["uniform", "pareto"] = "uniform"


@dataclass
class ModelConfig:
    """A registered model name and its keyword parameters (checked by ``create_model``)."""

    name: str = ""
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class EarlyStoppingConfig:
    """Stop when ``metric`` has not improved for ``patience`` evaluations (0 = never stop).

    ``mode`` "auto" maximises auc / gauc / accuracy and minimises everything else (logloss, loss).
    """

    metric: str = "auc"
    patience: NonNegativeInt = 0
    mode: Literal["auto", "max", "min"] = "auto"
    min_delta: NonNegativeFloat = 0.0  # how much better a value must be to count as better


@dataclass
class LRScheduleConfig:
    """How the learning rates of every optimizer (dense, embedding) move during a run (training/lr_schedule.py).

    ``none``: constant rates. ``plateau`` (FuxiCTR's reduce_lr_on_plateau, torch's ReduceLROnPlateau): after
    ``patience + 1`` evaluations in a row without improvement of the early-stopping metric (its mode and min_delta),
    every rate is multiplied by ``factor``, never below ``min_lr``; early stopping counts only evaluations made
    with every rate at its floor (``min_lr``, or the configured rate where that is lower). ``linear``: ``warmup_steps``
    rising linearly to the configured rates, then a linear decay to ``end_factor`` x the rates at the run's planned
    last step (min(max_steps, epochs x batches per epoch)).
    """

    type: Literal["none", "plateau", "linear"] = "none"
    factor: Annotated[float, Bound(0, 1, lo_open=True, hi_open=True)] = 0.1  # plateau
    patience: NonNegativeInt = 0  # plateau: evaluations without improvement tolerated before a reduction
    min_lr: NonNegativeFloat = 0.0  # plateau: the floor of every rate
    end_factor: Annotated[float, Bound(0, 1)] = 0.0  # linear: the rates at the last planned step, x configured
    warmup_steps: NonNegativeInt = 0  # linear: steps rising from rate / warmup_steps to the configured rate


@dataclass
class RetrievalConfig:
    """How a retrieval model (two_tower, youtube_dnn, sasrec) is trained: see ``ctrkit.training.tasks.RetrievalTask``.

    ``loss``: in_batch | sampled | full softmax; ``log_q``: the log-Q (sampling-bias) correction; ``num_negatives``
    / ``sampling`` / ``alpha``: the sampled softmax's k negatives per batch, uniform or ∝ count^alpha (热门打压).
    ``sequence_targets`` (sequence rows only): the loss on the targets each row owns ("owned": every target once per
    epoch, even when the windows overlap) or on every real position ("all": a target of overlapping windows once per
    window holding it, with each window's context).
    """

    loss: Literal["in_batch", "sampled", "full"] = "in_batch"
    log_q: bool = True
    num_negatives: PositiveInt = 100
    sampling: Literal["uniform", "frequency"] = "uniform"
    alpha: NonNegativeFloat = 0.75
    sequence_targets: Literal["owned", "all"] = "owned"


@dataclass
class DistributedConfig:
    """How a run on several processes (``ctrkit train --nproc-per-node N`` / torchrun) works; one process ignores it.

    ``backend``: the torch.distributed backend (auto: nccl on CUDA, gloo on CPU). ``batch``: whether
    ``data.batch_size`` is the global batch (split over the ranks, so the run is the same run at any world size)
    or each rank's batch (the global batch grows with the ranks). ``sharding``: how the torchrec embedding
    backend places its tables (auto: the planner's choice among what the device supports). ``timeout_s``: how
    long a collective waits for a rank that stopped answering before the job fails. ``gather_negatives``:
    retrieval's in-batch negatives come from every rank's batch.
    """

    backend: Literal["auto", "gloo", "nccl"] = "auto"
    batch: Literal["global", "per_rank"] = "global"
    sharding: Literal["auto", "table_wise", "column_wise", "table_column_wise", "row_wise", "data_parallel"] = "auto"
    timeout_s: PositiveFloat = 300.0
    gather_negatives: bool = False


@dataclass
class TrainConfig:
    """Optimisation, evaluation cadence, checkpoints and reproducibility of one training run."""

    epochs: PositiveInt = 1
    max_steps: PositiveInt | None = None  # stop after this many optimizer steps (overrides epochs)
    # a time budget: stop once this many seconds of Trainer.fit have passed (wall clock, evaluations included;
    # a resumed run gets it anew), then evaluate and checkpoint as early stopping does (summary: stopped_by)
    max_seconds: PositiveFloat | None = None
    lr: PositiveFloat = 1e-3  # dense learning rate
    dense_optimizer: DenseOptimizer = "adam"
    sparse_optimizer: SparseOptimizer = "adagrad"
    embedding_lr: PositiveFloat | None = None  # None: same as lr
    weight_decay: NonNegativeFloat = 0.0  # L2 on dense parameters (decoupled for adamw)
    embedding_l2: NonNegativeFloat = 0.0  # L2 on embedding rows seen in the batch (mini-batch aware)
    # models with a wide (linear) part (wide_deep) can train it with FTRL-Proximal + L1, as in the paper
    wide_optimizer: Literal["default", "ftrl"] = "default"
    ftrl_alpha: PositiveFloat = 0.05
    ftrl_beta: NonNegativeFloat = 1.0
    ftrl_l1: NonNegativeFloat = 0.0
    ftrl_l2: NonNegativeFloat = 0.0
    grad_clip: PositiveFloat | None = None  # max global L2 norm of dense gradients
    # evaluate, checkpoint and keep a moving average of the weights (train/averaging.py); ~1/(1-d) steps
    ema_decay: Annotated[float, Bound(0, 1, lo_open=True, hi_open=True)] | None = None
    eval_every: PositiveInt | None = None  # steps between evaluations; None: at the end of every epoch
    # or evaluations per epoch: every steps_per_epoch // N steps and at the end (MLPerf DLRM-DCNv2: 20)
    evals_per_epoch: PositiveInt | None = None
    checkpoint_every: PositiveInt | None = None  # steps between last.pt saves (besides every evaluation)
    early_stopping: EarlyStoppingConfig = field(default_factory=EarlyStoppingConfig)
    lr_schedule: LRScheduleConfig = field(default_factory=LRScheduleConfig)  # every optimizer's rates over the run
    # ranking models: auc, logloss, gauc, accuracy, calibration; retrieval models: hr@K, ndcg@K, mrr (full ranking;
    # a retrieval run that keeps the ranking defaults here and in early_stopping gets RETRIEVAL_METRICS / ndcg@10)
    metrics: list[str] = field(default_factory=lambda: ["auc", "logloss"])
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    # the store's weight column applies to every row ("all") or to positives only, negatives weighing 1
    # ("positives": YouTubeDNN's watch-time-weighted logistic loss for ranking)
    sample_weight: Literal["all", "positives"] = "all"
    seed: Seed = 42
    log_every: PositiveInt = 50
    precision: Literal["fp32", "bf16"] = "fp32"
    device: str = "cpu"
    threads: PositiveInt | None = None  # torch intra-op CPU threads for this run (None: torch's default, the core count)
    progress: bool = True  # tqdm progress bar
    # glibc: reuse freed tensor memory across steps instead of fresh page-faulted mmaps (train/memory.py)
    keep_freed_memory: bool = True
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    # start from this checkpoint's weights and optimizer states on a grown vocabulary (`ctrkit train --warm-start`;
    # training/warm_start.py): a new run, its tables grown, new ids' rows initialised as a fresh table's
    warm_start: str | None = None
    # a warm start's new rows (new ids, ids reset by expiry): "fresh" (a new table's initial values) or "rare" (a
    # copy of the table's row 1, with which these values were scored before they were admitted)
    warm_start_new_rows: Literal["fresh", "rare"] = "fresh"
    # a warm start's optimizer states (Adam moments, Adagrad sums): the checkpoint's ("keep") or a fresh optimizer's
    warm_start_optimizer: Literal["keep", "fresh"] = "keep"
    # a warm start's weight average (train.ema_decay): "fresh" (a new average of this run's steps), "start" (a new
    # average whose past is the checkpoint's weights: a_t = d^t w_0 + ..., it stays near them early on) or "keep" (the
    # checkpoint's average goes on, training from its trained weights, as a resume: ema_decay the same in both runs)
    warm_start_average: Literal["keep", "fresh", "start"] = "fresh"
    # shrink and perturb a warm start's weights (Ash & Adams 2020): every parameter w <- shrink * w + perturb * w0,
    # w0 this run's fresh initial value; 1 and 0 keep the checkpoint's weights as they are
    warm_start_shrink: Annotated[float, Bound(0, 1, lo_open=True)] = 1.0
    warm_start_perturb: NonNegativeFloat = 0.0
    # id dropout {sparse key: p in [0, 1)}: each training id of the key becomes the rare id 1 with probability p,
    # which trains the row unseen values are scored with (cold start; data/pipeline/id_dropout.py)
    id_dropout: dict[str, NonNegativeFloat] = field(default_factory=dict)


@dataclass
class RunConfig:
    """Run directory ``dir/name`` holding config.yaml, metrics.jsonl and checkpoints."""

    dir: str = "runs"
    name: str | None = None
    overwrite: bool = False  # a new run may replace the files of an earlier run of the same name
    # extra loggers besides metrics.jsonl: "tensorboard" (run_dir/tensorboard, needs ctrkit[tensorboard])
    log: list[Literal["tensorboard"]] = field(default_factory=list)


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    run: RunConfig = field(default_factory=RunConfig)


# ---- typed construction ------------------------------------------------------------------------------
def config_from_dict(data: dict[str, Any] | None) -> Config:
    """Validated :class:`Config` from a nested dict (e.g. ``yaml.safe_load`` of a config file)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"a config must be a mapping of blocks (data/model/train/run), got {type(data).__name__}")
    cfg = build(Config, data)  # every value checked against its field's declared type and range
    check_run_name(cfg.run.name)
    return cfg


def check_run_name(name: str | None) -> None:
    """``run.name`` is a plain folder name inside ``run.dir``: no separator, no absolute path, not ``.`` / ``..``
    (``../../x`` would write a run outside ``run.dir``)."""
    if name is None:
        return
    bad = (not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name
           or Path(name).is_absolute() or name != name.strip())
    if bad:
        raise ConfigError(f"run.name={name!r} is not a plain name: it names one folder inside run.dir (no '/' or "
                          "'\\', not an absolute path, not '.' or '..', no surrounding spaces); put the parent "
                          "folders in run.dir instead")


def _split_override(item: str) -> tuple[list[str], CliValue]:
    text = item.removeprefix("--")
    if "=" not in text:
        raise ConfigError(f"override {item!r} must look like --train.lr=3e-4 (key path '=' value)")
    key, value = text.split("=", 1)
    path = key.strip().split(".")
    if not all(path):
        raise ConfigError(f"override {item!r} has an empty key segment")
    return path, CliValue(value.strip())


def walk_key(parts: list[str], unknown: Callable[[str, str, str, list[str]], ConfigError]) -> tuple[int, Any]:
    """Follow the dotted key ``parts`` through the config dataclasses as far as they go -> (how many parts name
    dataclass fields, the annotation of the last one). A part that is no field of its block raises
    ``unknown(here, parent, part, valid names)``; parts below a non-dataclass value (``model.params.x``) are
    the caller's to check. The one key walker of config overrides and of ``ctrkit tune``'s search spaces."""
    cls: Any = Config
    for i, part in enumerate(parts):
        names = [f.name for f in dataclasses.fields(cls)]
        if part not in names:
            raise unknown(".".join(parts[: i + 1]), ".".join(parts[:i]) or "the top level", part, names)
        cls = typing.get_type_hints(cls, include_extras=True)[part]
        if not dataclasses.is_dataclass(cls):
            return i + 1, cls
    return len(parts), cls


def set_key(data: dict[str, Any], parts: list[str], value: Any, what: str) -> None:
    """Set ``value`` at the dotted key ``parts`` of the nested dict ``data``, creating missing (or null)
    blocks; a value where a block is needed is a ConfigError starting with ``what``."""
    node = data
    for depth, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"{what}: {'.'.join(parts[: depth + 1])!r} is not a mapping, cannot set a sub-key")
        node = child
    node[parts[-1]] = value


def apply_overrides(data: dict[str, Any], overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """Set ``key.path=value`` entries into the nested dict ``data`` (in place; returned).

    Key paths are checked against the dataclass tree here, so ``--trian.lr=1`` fails with a
    suggestion even before the file's blocks are validated. Values stay text until validation.
    """
    for item in overrides:
        path, value = _split_override(item)
        walk_key(path, lambda here, parent, part, names, item=item: ConfigError(
            f"override {item!r}: unknown config key {here!r} in {parent}{suggest(part, names)}"))
        set_key(data, path, value, f"override {item!r}")
    return data


def _read_yaml(p: Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {p} is not valid YAML: {e}") from e
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"config file {p} must hold a mapping (data/model/train/run blocks)")
    return loaded or {}


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` deep-merged into a copy of ``base``: mappings merge key by key, anything else
    (scalars, lists, null) in ``over`` replaces the base value."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def read_config_file(path: str | Path, _chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The nested dict of a config file with its ``defaults`` resolved.

    ``defaults: [../_base/criteo.yaml, ...]`` lists base files (paths relative to this file's
    directory, or absolute); they are merged in order, each over the previous, and this file's own
    keys last (:func:`merge`). Bases may have defaults of their own; a cycle is an error.
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError(missing_path(p, "config file", "The shipped configs are under configs/<dataset>/<model>.yaml "
                                       "in the ctrkit checkout"))
    data = _read_yaml(p)
    chain = (*_chain, p.resolve())
    defaults = data.pop("defaults", None)
    if defaults is None:
        return data
    if not isinstance(defaults, list) or not all(isinstance(d, str) and d for d in defaults):
        raise ConfigError(f"{p}: 'defaults' must be a list of base config files, e.g. "
                          f"defaults: [../_base/criteo.yaml]; got {defaults!r}")
    merged: dict[str, Any] = {}
    for entry in defaults:
        base = p.parent / entry
        if base.resolve() in chain:
            cycle = " -> ".join(str(c) for c in (*chain, base.resolve()))
            raise ConfigError(f"{p}: defaults entry {entry!r} makes a cycle: {cycle}")
        if not base.is_file():
            raise ConfigError(f"{p}: base config {entry!r} ({base}) does not exist; "
                              "defaults paths are relative to the config file that lists them")
        merged = merge(merged, read_config_file(base, chain))
    return merge(merged, data)


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a YAML config (its ``defaults`` bases merged in, see :func:`read_config_file`), or start from
    the dataclass defaults when ``path`` is None, and apply overrides."""
    data = read_config_file(path) if path is not None else {}
    apply_overrides(data, list(overrides))
    try:
        return config_from_dict(data)
    except ConfigError as e:
        if path is not None:
            raise ConfigError(f"{path}: {e}") from None
        raise


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """Plain nested dict (YAML/JSON/torch.save-safe) of a config dataclass."""
    return dataclasses.asdict(cfg)


def save_config(cfg: Any, path: str | Path) -> None:
    """Write the resolved config as YAML (reloadable by :func:`load_config`)."""
    Path(path).write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
