"""Command line: ``ctrkit preprocess | synth | train | evaluate | predict | demo | recall | serve | export | models |
tune | report``.

This file only parses arguments: every sub-command runs a job (:mod:`ctrkit.jobs`: train, evaluate, predict, recall,
tune, report, demo) or the module that does the work (preprocess, synth, serve, export).
Errors of ctrkit's own kinds (bad config, bad data, bad store) are printed as one line and exit 2.
Options renamed since a release keep their old spelling as a hidden alias (:data:`RENAMED_OPTIONS`).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import typing
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

log = logging.getLogger("ctrkit")

# Old spellings of renamed options, per command: each still works as a hidden alias (the same dest, not in --help)
# that logs one warning naming the new option. docs/cli.md lists them (ctrkit.cli_reference).
RENAMED_OPTIONS: dict[tuple[str, ...], dict[str, str]] = {
    ("preprocess", "criteo"): {"--chunk-rows": "--block-rows"},
    ("preprocess", "table"): {"--batch-rows": "--block-rows"},
    ("predict",): {"--output": "--out"},
    ("recall",): {"--output": "--out"},
    ("tune",): {"--study-dir": "--out"},
}


class _OldSpelling(argparse.Action):
    """The old spelling of a renamed option: parses as the new one does, stores through it, and warns."""

    def __init__(self, option_strings: list[str], dest: str, *, new: argparse.Action, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=new.nargs, const=new.const, type=new.type, choices=new.choices,
                         metavar=new.metavar, help=argparse.SUPPRESS)
        self.new = new

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        log.warning("%s is deprecated and will be removed: use %s", option_string, self.new.option_strings[0])
        self.new(parser, namespace, values, self.new.option_strings[0])


class CtrkitParser(argparse.ArgumentParser):
    """An ArgumentParser whose renamed options keep their old spelling (:meth:`rename_option`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._renamed: dict[str, argparse.Action] = {}  # old spelling -> the option it is now

    def error(self, message: str) -> typing.NoReturn:
        """A bad command line is one line on stderr (the option, the value, what is allowed) and exit 2; the usage
        is in ``--help``."""
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def rename_option(self, old: str, new: str) -> None:
        """Accept ``old`` as a hidden alias of the option ``new`` (already added)."""
        action = self._option_string_actions[new]
        self.add_argument(old, dest=action.dest, action=_OldSpelling, new=action)
        self._renamed[old] = action

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        """As argparse does, except that a required renamed option may be given by its old spelling (argparse
        counts an option as given only under its own action, so that requirement is checked here)."""
        args = sys.argv[1:] if args is None else list(args)
        required = [a for old, a in self._renamed.items() if a.required
                    and any(t == old or t.startswith(old + "=") for t in args)]
        for a in required:
            a.required = False
        try:
            ns, rest = super().parse_known_args(args, namespace)
        finally:
            for a in required:
                a.required = True
        missing = [a.option_strings[0] for a in required if getattr(ns, a.dest, None) is None]
        if missing:
            self.error(f"the following arguments are required: {', '.join(missing)}")
        return ns, rest


def _add_preprocess(sub: argparse._SubParsersAction) -> None:
    from ctrkit.data.sources import behaviour, criteo
    from ctrkit.data.sources import table as tabular
    from ctrkit.jobs.preprocess import WithVocabSource

    p = sub.add_parser("preprocess", help="raw data -> columnar store")
    kinds = p.add_subparsers(dest="kind", required=True)
    c = kinds.add_parser("criteo", help="Criteo TSV (one file or day_0..day_23), plain or .gz")
    criteo.add_preprocess_criteo_args(c)
    c.set_defaults(func=WithVocabSource(criteo.run_preprocess_criteo))
    t = kinds.add_parser("table", help="CSV / Parquet with a YAML schema")
    tabular.add_preprocess_table_args(t)
    t.set_defaults(func=WithVocabSource(tabular.run_preprocess_table))
    b = kinds.add_parser("behaviour", help="behaviour log (CSV / Parquet / S3-Rec sequences) -> DIN-style samples")
    behaviour.add_preprocess_behaviour_args(b)
    b.set_defaults(func=WithVocabSource(behaviour.run_preprocess_behaviour))


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
    from ctrkit.jobs.common import SCORING_BATCH_HELP
    from ctrkit.jobs.launch import add_launch_options
    from ctrkit.typecheck import PositiveInt, cli_type

    p = sub.add_parser("train", help="train a model from a YAML config")
    p.add_argument("--config", required=True, help="YAML config (see configs/)")
    p.add_argument("--resume", help="checkpoint to resume from (exact, mid-epoch)")
    p.add_argument("--warm-start", metavar="CHECKPOINT",
                   help="start a new run from this checkpoint's weights and optimizer states, its tables grown to "
                        "the training store's grown vocabulary (train.warm_start; see docs/warm-start.md)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--log", action="append", choices=["tensorboard"],
                   help="a logger besides metrics.jsonl (run.log): tensorboard writes RUN_DIR/tensorboard")
    add_launch_options(p)
    p.set_defaults(func=train.run_train)

    e = sub.add_parser("evaluate", help="evaluate a checkpoint on a store")
    e.add_argument("--checkpoint", required=True)
    e.add_argument("--data", help="store to evaluate (default: the config's test store)")
    e.add_argument("--batch-size", type=cli_type(PositiveInt), default=None, help=SCORING_BATCH_HELP)
    e.set_defaults(func=evaluate.run_evaluate)

    r = sub.add_parser("predict", help="score raw rows with a checkpoint")
    r.add_argument("--checkpoint", required=True)
    r.add_argument("--input", required=True, help="raw rows in the training data's format (e.g. Criteo TSV)")
    r.add_argument("--out", required=True, help="CSV of line,score: one score per input row, with its line")
    r.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    r.add_argument("--batch-size", type=cli_type(PositiveInt), default=None, help=SCORING_BATCH_HELP)
    r.set_defaults(func=predict.run_predict)

    d = sub.add_parser("demo", help="preprocess the bundled Criteo sample and train DLRM with each interaction")
    d.add_argument("--out", default="demo_out", help="working directory")
    d.add_argument("--epochs", type=cli_type(PositiveInt), default=6)
    d.add_argument("--overwrite", action="store_true", help="replace the output of an earlier demo in --out")
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
        import uvicorn  # noqa: F401

        import ctrkit.serving.server  # noqa: F401 - FastAPI and uvicorn, checked before any work starts
    except ImportError as e:
        raise JobError(f"ctrkit serve needs FastAPI and uvicorn ({e}); pip install 'ctrkit[serve]'") from None
    from ctrkit.serving.command import run_serve

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
    parser = CtrkitParser(prog="ctrkit", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)  # sub-commands are CtrkitParsers too
    for add in COMMANDS:
        add(sub)
    for path, renamed in RENAMED_OPTIONS.items():
        command = subcommand(parser, path)
        for old, new in renamed.items():
            command.rename_option(old, new)
    return parser


def subcommand(parser: argparse.ArgumentParser, path: Sequence[str]) -> CtrkitParser:
    """The parser of the sub-command ``path`` (e.g. ``("preprocess", "criteo")``) under ``parser``."""
    for name in path:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    assert isinstance(parser, CtrkitParser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args, extra = build_parser().parse_known_args(argv)
    rank = os.environ.get("RANK") if "WORLD_SIZE" in os.environ else None  # a torchrun worker: says which
    logging.basicConfig(  # ... and only rank 0 logs the progress of the run
        level=logging.DEBUG if args.verbose else logging.INFO if rank in (None, "0") else logging.WARNING,
        format=("" if rank is None else f"[rank {rank}] ") + "%(levelname)s %(name)s: %(message)s")
    args.overrides = extra
    if extra and args.command not in ("train", "tune"):  # config overrides
        build_parser().error(f"unrecognized arguments: {' '.join(extra)}")
    from ctrkit.background import stop_all
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
    finally:  # no reader or prefetch thread outlives the command, whatever way it ended (see ctrkit.background)
        stop_all()


def run() -> NoReturn:
    """The ``ctrkit`` program (console script and ``python -m ctrkit``): :func:`main` on the process's arguments,
    its result the exit status. A rank that torchrun started ends without the interpreter's finalization
    (:func:`ctrkit.training.distributed.end_worker_process`: gloo's threads outlive the process group)."""
    rc = main()
    dist = sys.modules.get("ctrkit.training.distributed")  # only a command that loaded it can have joined a group
    if dist is not None and dist.launched():
        dist.end_worker_process(rc)
    sys.exit(rc)


if __name__ == "__main__":
    run()
