"""``ctrkit train --nproc-per-node N [--nnodes M --node-rank R --master-addr A --master-port P]``: torchrun's
launcher (:mod:`torch.distributed.run`) on the same job.

The launcher starts N worker processes on this node, each running ``python -m ctrkit train`` with the same
config and overrides (and ``run.name`` fixed here, so that every rank, node and restart writes one run
directory); the workers find their rank in torchrun's variables (:mod:`ctrkit.training.distributed`). One node
rendezvouses on its own (``--standalone``); several nodes meet at ``--master-addr:--master-port`` with
``--node-rank`` 0 .. M-1, each node running the same command. ``--max-restarts K`` restarts every worker after
a failure, and the restarted job resumes from the run's last.pt.

A worker that fails stops the job: torchrun ends the other workers and this command fails with one line naming
the rank, how it ended and the step of the run's last checkpoint (to resume: the same command).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path
from typing import Annotated, Any

from ctrkit.errors import JobError
from ctrkit.jobs.common import default_run_name, rank_batch_size
from ctrkit.models.registry import check_model_params
from ctrkit.training.config import Config
from ctrkit.training.distributed import launched
from ctrkit.typecheck import Bound, NonNegativeInt, PositiveInt, cli_type

log = logging.getLogger(__name__)


def add_launch_options(p: argparse.ArgumentParser) -> None:
    """The torchrun options of ``ctrkit train``."""
    g = p.add_argument_group("several processes (torchrun's launcher)")
    g.add_argument("--nproc-per-node", type=cli_type(PositiveInt),
                   help="worker processes on this node (one per GPU on CUDA)")
    g.add_argument("--nnodes", type=cli_type(PositiveInt), default=1,
                   help="machines taking part (each runs this command)")
    g.add_argument("--node-rank", type=cli_type(NonNegativeInt), default=0,
                   help="this machine's place, 0 .. nnodes-1")
    g.add_argument("--master-addr", default="127.0.0.1", help="address of the node-rank 0 machine")
    g.add_argument("--master-port", type=cli_type(Annotated[int, Bound(1, 65535)]), default=29500,
                   help="a free port on the node-rank 0 machine")
    g.add_argument("--max-restarts", type=cli_type(NonNegativeInt), default=0,
                   help="restart every worker up to this many times after a failure (resuming from last.pt)")


def _check(args: argparse.Namespace) -> None:
    """What the options' declared ranges cannot say: the node rank within the nodes, and not already a worker."""
    if args.node_rank >= args.nnodes:
        raise JobError(f"--node-rank must be in 0..{args.nnodes - 1}, got {args.node_rank}")
    if launched():
        raise JobError("--nproc-per-node: this process is already a worker of a torchrun job; run `ctrkit train "
                       "--config C` under torchrun, or `ctrkit train --nproc-per-node N` without torchrun")


def worker_argv(args: argparse.Namespace, run_name: str) -> list[str]:
    """The ``ctrkit train`` arguments of every worker: the same job, with ``run.name`` fixed."""
    argv = ["train", "--config", str(args.config)]
    if args.resume:
        argv += ["--resume", str(args.resume)]
    if getattr(args, "warm_start", None):
        argv += ["--warm-start", str(args.warm_start)]
    if args.quiet:
        argv.append("--quiet")
    for logger in args.log or []:
        argv += ["--log", logger]
    return argv + list(args.overrides or []) + [f"run.name={run_name}"]


def torchrun_argv(args: argparse.Namespace, run_name: str) -> list[str]:
    """torchrun's command line for ``args`` (see the module docstring)."""
    where = (["--standalone"] if args.nnodes == 1 else
             [f"--node-rank={args.node_rank}", f"--master-addr={args.master_addr}",
              f"--master-port={args.master_port}"])
    return [f"--nproc-per-node={args.nproc_per_node}", f"--nnodes={args.nnodes}", *where,
            f"--max-restarts={args.max_restarts}", "--module", "ctrkit", *worker_argv(args, run_name)]


def launch_train(args: argparse.Namespace, cfg: Config) -> int:
    """Run ``ctrkit train`` on ``--nproc-per-node`` processes of this node through torchrun's launcher."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    _check(args)
    rank_batch_size(cfg, args.nproc_per_node * args.nnodes)  # a global batch that does not split: before launching
    if cfg.model.name:
        check_model_params(cfg.model.name, cfg.model.params)
    run_name = cfg.run.name or (Path(args.resume).resolve().parent.name if args.resume else default_run_name(cfg))
    run_dir = Path(args.resume).resolve().parent if args.resume else Path(cfg.run.dir) / run_name
    targs = get_args_parser().parse_args(torchrun_argv(args, run_name))
    # a restart must not read the last attempt's process-group addresses from a rendezvous store it shares
    # (pytorch/pytorch#135712: with --max-restarts the workers' gloo / nccl setup connected to dead peers)
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    log.info("launching %d process(es) on this node (%d node(s)): run %s", args.nproc_per_node, args.nnodes, run_dir)
    try:
        run(targs)
    except ChildFailedError as e:
        raise JobError(_failure_line(e, run_dir)) from None
    return 0


def _failure_line(e: Any, run_dir: Path) -> str:
    """One line: which rank failed and how, and where the run can resume."""
    rank, failure = e.get_first_failure()
    how = (f"was killed by signal {failure.signal_name()}" if failure.exitcode < 0 else
           f"exited with code {failure.exitcode}")
    message = [line for line in str(failure.message or "").strip().splitlines()
               if line != "<NONE>" and not line.startswith("To enable traceback")]  # torchrun's boilerplate
    why = (f" ({message[-1][:200]})" if message else
           " (its error is the line logged above by that rank)" if failure.exitcode == 2 else "")
    last = run_dir / "last.pt"
    again = (f"Run the same command with --resume {last} to go on from the last checkpoint (or --max-restarts K to "
             "restart by itself)" if last.exists() else "No checkpoint was written")
    return f"rank {rank} {how}{why}; the job stopped at {_last_step(run_dir)}. {again}"


def _last_step(run_dir: Path) -> str:
    """"step N (last evaluation at step M)" from the run's metrics.jsonl, or what is known."""
    records = run_dir / "metrics.jsonl"
    last = evaluated = None
    if records.is_file():
        for line in records.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            last = rec.get("step", last)
            if rec.get("kind") == "eval":
                evaluated = rec.get("step")
    if last is None:
        return "its start (no step was logged)"
    return f"step {last} (last evaluation at step {evaluated})" if evaluated is not None else f"step {last}"
