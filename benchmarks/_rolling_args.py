"""benchmarks/incremental.py's command line: the options and their checks (argparse errors: exit 2, one line)."""

from __future__ import annotations

import argparse


def id_dropout(items: list[str], ap: argparse.ArgumentParser) -> dict[str, float]:
    """``--id-dropout user_id=0.1 ...`` -> {key: probability} (the keys and ranges are checked by ``ctrkit train``)."""
    out = {}
    for item in items:
        key, _, p = item.partition("=")
        try:
            out[key] = float(p)
        except ValueError:
            ap.error(f"--id-dropout takes KEY=P (e.g. user_id=0.1), got {item!r}")
    return out


def lr_schedule(items: list[str], ap: argparse.ArgumentParser) -> tuple[str, ...]:
    """``--warm-lr-schedule type=plateau factor=0.5 ...`` -> ``--train.lr_schedule.KEY=VALUE`` overrides, checked here
    against the config's train.lr_schedule block (a bad key or value: exit 2 before any run)."""
    from ctrkit.errors import ConfigError
    from ctrkit.training.config import load_config

    out = tuple(f"--train.lr_schedule.{item}" for item in items)
    if any("=" not in item for item in items):
        ap.error(f"--warm-lr-schedule takes KEY=VALUE items of train.lr_schedule (e.g. type=linear end_factor=0.1), "
                 f"got {items}")
    try:
        load_config(None, out)
    except ConfigError as e:
        ap.error(f"--warm-lr-schedule: {e}")
    return out


def parser(description: str, quick: dict[str, int]) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--datasets", nargs="*", default=["movielens", "taobao"], choices=["movielens", "taobao"])
    ap.add_argument("--quick", action="store_true", help=f"the first periods only ({quick}) and 2 epochs: <= 2 min")
    ap.add_argument("--periods", type=int, help="roll over the first N periods (default: all)")
    ap.add_argument("--epochs", type=int, default=5, help="most epochs per run (early stopping on valid, patience 1)")
    ap.add_argument("--valid-fraction", type=float, default=0.1, help="the last rows of each period: its valid split")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="/tmp/ctrkit-incremental", help="work directory (stores and runs; replaced)")
    ap.add_argument("--replay", type=float, default=0.0, metavar="F",
                    help="incremental arm: append F x the new rows, sampled from earlier periods' train splits")
    ap.add_argument("--refresh-every", type=int, metavar="K",
                    help="incremental arm: every K-th period (t = K, 2K, ...) is a fit from scratch on every row so "
                         "far (the retrain arm's run, its seconds counted), the warm runs continue from it "
                         "(default: the data set's REFRESH_EVERY; 0: never)")
    ap.add_argument("--refresh-from", choices=["scratch", "warm"], default="scratch",
                    help="incremental arm, refresh periods: a fit from scratch (the retrain arm's run) or a warm "
                         "start from the arm's model on every row so far at the config's rates")
    ap.add_argument("--shrink-perturb", nargs=2, type=float, metavar=("SHRINK", "PERTURB"),
                    help="incremental arm, --refresh-from warm: the refreshes' train.warm_start_shrink / warm_start_perturb")
    ap.add_argument("--warm-dense-lr", type=float, help="incremental arm, warm runs: the dense (non-embedding) lr")
    ap.add_argument("--warm-embedding-lr", type=float, help="incremental arm, warm runs: the embedding rows' lr")
    ap.add_argument("--warm-epochs", type=int, help="incremental arm, warm runs: most epochs (default: --epochs)")
    ap.add_argument("--first-warm-epochs", type=int, metavar="N",
                    help="incremental arm: most epochs of the first warm run after a fit on every row so far (period 0 "
                         "or a refresh; default: --warm-epochs)")
    ap.add_argument("--first-warm-lr-scale", type=float, default=1.0, metavar="X",
                    help="incremental arm: the first warm run after a fit on every row so far at X times the warm "
                         "runs' dense and embedding learning rates")
    ap.add_argument("--first-warm-optimizer", choices=["keep", "fresh"],
                    help="incremental arm: train.warm_start_optimizer of the first warm run after a fit on every row so "
                         "far (period 0 or a refresh; fresh: new Adam / LazyAdam states instead of the fit's; default: "
                         "--warm-optimizer); the later warm runs keep the states they are given")
    ap.add_argument("--warm-lr-schedule", nargs="+", default=[], metavar="KEY=VALUE",
                    help="incremental arm, warm runs only (refresh fits unchanged): train.lr_schedule, e.g. type=plateau "
                         "factor=0.5 patience=0 min_lr=1.25e-4, or type=linear end_factor=0.1")
    ap.add_argument("--warm-ema-decay", type=float, metavar="D",
                    help="incremental arm, warm runs only: train.ema_decay D with train.warm_start_average start (the "
                         "average starts at the warm-start weights and is evaluated, early-stopped on and saved)")
    ap.add_argument("--warm-window", type=int, default=1, metavar="W",
                    help="incremental arm, warm runs: train on the new rows of the last W periods (1: period t's only; "
                         "2: period t - 1's new rows again too)")
    ap.add_argument("--warm-new-rows", choices=["fresh", "rare"], default="fresh",
                    help="incremental arm, warm runs: train.warm_start_new_rows (rare: new rows copy the rare row 1)")
    ap.add_argument("--warm-optimizer", choices=["keep", "fresh"], default="keep",
                    help="incremental arm, warm runs: train.warm_start_optimizer (the checkpoint's Adam moments or fresh)")
    ap.add_argument("--ema-decay", type=float, metavar="D",
                    help="every arm: train.ema_decay (weight averaging); the incremental arm's warm runs continue "
                         "their checkpoint's average (--warm-average keep): an average over periods")
    ap.add_argument("--warm-average", choices=["keep", "fresh"],
                    help="incremental arm, warm runs, with --ema-decay: train.warm_start_average (default keep)")
    ap.add_argument("--id-dropout", nargs="*", default=[], metavar="KEY=P",
                    help="every arm: train.id_dropout, e.g. user_id=0.1 (training ids -> the rare id 1 with prob. P)")
    ap.add_argument("--tune", action="store_true",
                    help="the incremental arm alone, judged on its validation AUC (for choosing --replay / lr)")
    return ap


def parse(argv: list[str] | None, description: str, quick: dict[str, int]) -> tuple[argparse.Namespace, dict[str, float]]:
    """The checked options and ``--id-dropout``'s {key: probability}."""
    ap = parser(description, quick)
    a = ap.parse_args(argv)
    if a.replay < 0 or any(x is not None and x <= 0 for x in (a.warm_dense_lr, a.warm_embedding_lr)):
        ap.error(f"--replay must be >= 0 and --warm-dense-lr, --warm-embedding-lr > 0, got {a.replay}, "
                 f"{a.warm_dense_lr} and {a.warm_embedding_lr}")
    if any(x is not None and x < 1 for x in (a.warm_epochs, a.first_warm_epochs)):
        ap.error(f"--warm-epochs and --first-warm-epochs must be >= 1, got {a.warm_epochs} and {a.first_warm_epochs}")
    if a.first_warm_lr_scale <= 0:
        ap.error(f"--first-warm-lr-scale must be > 0, got {a.first_warm_lr_scale}")
    if a.refresh_every is not None and a.refresh_every < 0:
        ap.error(f"--refresh-every must be >= 0 (0: never refresh), got {a.refresh_every}")
    if a.shrink_perturb and a.refresh_from != "warm":
        ap.error("--shrink-perturb applies to the refreshes of --refresh-from warm; add --refresh-from warm or drop it")
    if a.warm_average and a.ema_decay is None:
        ap.error(f"--warm-average {a.warm_average} needs --ema-decay (a warm start's average is that of train.ema_decay)")
    for name, d in (("--ema-decay", a.ema_decay), ("--warm-ema-decay", a.warm_ema_decay)):
        if d is not None and not 0 < d < 1:
            ap.error(f"{name} must lie strictly between 0 and 1, got {d}")
    if a.warm_ema_decay is not None and a.ema_decay is not None:
        ap.error("--warm-ema-decay (the warm runs' own average) and --ema-decay (every run's, over periods) exclude "
                 "each other: give one")
    if a.warm_window < 1:
        ap.error(f"--warm-window must be >= 1 (1: the new rows of period t only), got {a.warm_window}")
    a.warm_lr_schedule = lr_schedule(a.warm_lr_schedule, ap)
    return a, id_dropout(a.id_dropout, ap)
