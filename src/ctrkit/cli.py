"""Command line: ``ctrkit preprocess | synth | train | evaluate | predict | demo | recall | serve | export | models |
tune | report``.

This file only parses arguments: every sub-command runs a job (:mod:`ctrkit.jobs`: train, evaluate, predict, recall,
tune, report, demo) or the module that does the work (preprocess, synth, serve, export).
Errors of ctrkit's own kinds (bad config, bad data, bad store) are printed as one line and exit 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence

log = logging.getLogger("ctrkit")


def _add_preprocess(sub: argparse._SubParsersAction) -> None:
    from ctrkit.data.sources import behaviour, criteo
    from ctrkit.data.sources import table as tabular

    p = sub.add_parser("preprocess", help="raw data -> columnar store")
    kinds = p.add_subparsers(dest="kind", required=True)
    c = kinds.add_parser("criteo", help="Criteo TSV (one file or day_0..day_23), plain or .gz")
    criteo.add_preprocess_criteo_args(c)
    c.set_defaults(func=criteo.run_preprocess_criteo)
    t = kinds.add_parser("table", help="CSV / Parquet with a YAML schema")
    tabular.add_preprocess_table_args(t)
    t.set_defaults(func=tabular.run_preprocess_table)
    b = kinds.add_parser("behaviour", help="behaviour log (CSV / Parquet / S3-Rec sequences) -> DIN-style samples")
    behaviour.add_preprocess_behaviour_args(b)
    b.set_defaults(func=behaviour.run_preprocess_behaviour)


def _add_synth(sub: argparse._SubParsersAction) -> None:
    from ctrkit.data.sources import synthetic

    p = sub.add_parser("synth", help="synthetic Criteo-shaped data (raw TSV or a store)")
    synthetic.add_synth_args(p)
    p.set_defaults(func=synthetic.run_synth)


def _add_models(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="list the registered models and their parameters")
    p.add_argument("name", nargs="?", help="show the parameters of one model")
    p.set_defaults(func=_run_models)


def _run_models(args: argparse.Namespace) -> int:
    from ctrkit.models.registry import list_models, model_params

    names = [args.name] if args.name else list_models()
    for name in names:
        params = ", ".join(f"{k}={v!r}" for k, v in model_params(name).items())
        sys.stdout.write(f"{name}: {params}\n")
    return 0


def _add_run_commands(sub: argparse._SubParsersAction) -> None:
    from ctrkit.jobs import demo, evaluate, predict, train

    p = sub.add_parser("train", help="train a model from a YAML config")
    p.add_argument("--config", required=True, help="YAML config (see configs/)")
    p.add_argument("--resume", help="checkpoint to resume from (exact, mid-epoch)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--log", action="append", choices=["tensorboard"],
                   help="a logger besides metrics.jsonl (run.log): tensorboard writes RUN_DIR/tensorboard")
    p.set_defaults(func=train.run_train)

    e = sub.add_parser("evaluate", help="evaluate a checkpoint on a store")
    e.add_argument("--checkpoint", required=True)
    e.add_argument("--data", help="store to evaluate (default: the config's test store)")
    e.add_argument("--batch-size", type=int, default=8192)
    e.set_defaults(func=evaluate.run_evaluate)

    r = sub.add_parser("predict", help="score raw rows with a checkpoint")
    r.add_argument("--checkpoint", required=True)
    r.add_argument("--input", required=True, help="raw rows in the training data's format (e.g. Criteo TSV)")
    r.add_argument("--output", required=True, help="CSV of line,score: one score per input row, with its line")
    r.add_argument("--overwrite", action="store_true", help="replace an existing --output file")
    r.add_argument("--batch-size", type=int, default=8192)
    r.set_defaults(func=predict.run_predict)

    d = sub.add_parser("demo", help="preprocess the bundled Criteo sample and train DLRM with each interaction")
    d.add_argument("--out", default="demo_out", help="working directory")
    d.add_argument("--epochs", type=int, default=6)
    d.set_defaults(func=demo.run_demo)


def _add_tune(sub: argparse._SubParsersAction) -> None:
    from ctrkit.jobs import tune

    p = sub.add_parser("tune", help="hyper-parameter search with Optuna over a config's search space (resumable)")
    tune.add_tune_args(p)
    p.set_defaults(func=tune.run_tune)


def _add_recall(sub: argparse._SubParsersAction) -> None:
    from ctrkit.jobs import recall

    p = sub.add_parser("recall", help="top-K candidates per user from a retrieval checkpoint (faiss index)")
    recall.add_recall_args(p)
    p.set_defaults(func=recall.run_recall)


def _add_export(sub: argparse._SubParsersAction) -> None:
    from ctrkit.serving import export

    p = sub.add_parser("export", help="a checkpoint's model as TorchScript or ONNX, with its feature pipeline")
    export.add_export_args(p)
    p.set_defaults(func=export.run_export)


def _add_serve(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="score raw rows over HTTP: POST /predict, GET /healthz, GET /metadata")
    p.set_defaults(func=_run_serve)
    from ctrkit.serving.options import add_serve_args  # FastAPI is imported only to serve

    add_serve_args(p)


def _run_serve(args: argparse.Namespace) -> int:
    from ctrkit.errors import JobError

    try:
        from ctrkit.serving.server import run_serve
    except ImportError as e:
        raise JobError(f"ctrkit serve needs FastAPI and uvicorn ({e}); pip install 'ctrkit[serve]'") from None
    return run_serve(args)


def _add_report(sub: argparse._SubParsersAction) -> None:
    from ctrkit.jobs import report  # light: matplotlib is imported only when a report is written

    p = sub.add_parser("report", help="HTML report of a run (plots, metrics, data), or several runs compared")
    report.add_report_args(p)
    p.set_defaults(func=report.run_report)


COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [
    _add_preprocess, _add_synth, _add_run_commands, _add_recall, _add_serve, _add_export, _add_models, _add_tune,
    _add_report,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ctrkit", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args, extra = build_parser().parse_known_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    args.overrides = extra
    if extra and args.command not in ("train", "tune"):  # config overrides
        build_parser().error(f"unrecognized arguments: {' '.join(extra)}")
    from ctrkit.errors import CtrkitError

    try:
        rc = args.func(args)
        return rc if isinstance(rc, int) else 0
    except CtrkitError as e:
        log.error("%s", e)
        return 2
    except KeyboardInterrupt:  # jobs remove their temporary files on the way out; a training keeps its last.pt
        log.error("interrupted (Ctrl-C)%s", "; resume with --resume RUN_DIR/last.pt" if args.command == "train" else
                  "; no partial output was kept")
        return 130


if __name__ == "__main__":
    sys.exit(main())
