"""The server's request path in process, stage by stage: CPU time per 100-row request (no HTTP).

    python benchmarks/serve_path.py [--checkpoint CKPT] [--rows 100] [--reps 300] [--rounds 3]
                                    [--compare OTHER_SRC] [--work-dir DIR]

What ``ctrkit serve`` does with one request's body once HTTP has delivered it: JSON parse
(``validation.loads``), validation (``RowValidator.check``: the checkpoint pipeline's column rules), encode
(``to_arrays`` + ``FeaturePipeline.transform(validated=True)``: vocabulary ids, dense transforms), ``to_batch``,
the model's forward (``scoring`` + ``probabilities``, 1 torch thread) and the answer's JSON (``dumps``). Each
stage is timed on its own, ``--reps`` times, as the CPU time of this thread (``time.thread_time``), which other
processes on a shared machine change far less than wall time; p50 and p99 per stage and for the whole path.
Parse, validate and the whole path are timed for the body as a list of row objects and (``*_columns``) for the
same rows as a columnar body (``{"columns": {field: [values]}}``) and (``*_arrow``) as an Arrow IPC stream
(``Content-Type: application/vnd.apache.arrow.stream``); a tree from before either lacks those stages.

``--compare OTHER_SRC`` times another checkout's ``src`` (e.g. main's) on the same checkpoint and rows: each
round runs both trees one after the other in fresh processes (``--rounds`` times, alternating which goes
first), and the median over rounds is reported per tree, so both see the same load. The default checkpoint is
``benchmarks/serve_load.py``'s DeepFM (1 epoch on the bundled Criteo sample). Prints a table and ONE JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
STAGES = ("parse", "validate", "parse_columns", "validate_columns", "parse_arrow", "validate_arrow", "encode", "to_batch",
          "forward", "dumps", "path", "path_columns", "path_arrow")


def measure(ckpt: str, rows: int, reps: int) -> dict[str, dict[str, float]]:
    """{stage: {p50_us, p99_us}} of CPU time per request, in this process (whatever ``ctrkit`` it imports)."""
    import torch

    torch.set_num_threads(1)
    from serve_load import criteo_rows

    from ctrkit.models.scoring import probabilities, scoring
    from ctrkit.serving.predictor import Predictor
    from ctrkit.serving.validation import RowValidator, dumps, loads, to_arrays

    p = Predictor.from_checkpoint(ckpt)
    raw = criteo_rows(rows, p.input_columns)
    body = json.dumps(raw).encode()
    body_columns = json.dumps({"columns": {c: [r[c] for r in raw] for c in raw[0]}}).encode()
    v = RowValidator(p.pipeline)
    data = loads(body)
    cols = v.check(data).columns
    encoded = p.pipeline.transform(to_arrays(v.rules, cols), validated=True)
    batch = p.pipeline.to_batch(encoded)

    def forward(b=batch):
        with scoring(p.model):
            return probabilities(p.model(b)).numpy()

    scores = forward()

    def path():
        c = v.check(loads(body)).columns
        b = p.pipeline.to_batch(p.pipeline.transform(to_arrays(v.rules, c), validated=True))
        return dumps({"scores": forward(b).tolist()})

    fns = {"parse": lambda: loads(body), "validate": lambda: v.check(data),
           "encode": lambda: p.pipeline.transform(to_arrays(v.rules, cols), validated=True),
           "to_batch": lambda: p.pipeline.to_batch(encoded), "forward": forward,
           "dumps": lambda: dumps({"scores": scores.tolist()}), "path": path}
    if hasattr(v, "check_columns"):  # the columnar body (a tree from before it has no such stages)
        from ctrkit.serving.validation import column_lists

        def checked_columns(parsed):
            values, n = column_lists(parsed["columns"], v.names)
            return v.check_columns(values, n)

        def path_columns():
            c = checked_columns(loads(body_columns)).columns
            b = p.pipeline.to_batch(p.pipeline.transform(to_arrays(v.rules, c), validated=True))
            return dumps({"scores": forward(b).tolist()})

        data_columns = loads(body_columns)
        fns |= {"parse_columns": lambda: loads(body_columns),
                "validate_columns": lambda: checked_columns(data_columns), "path_columns": path_columns}
    if hasattr(v, "check_arrow"):  # the Arrow IPC stream body
        from serve_load import request_body

        from ctrkit.serving.validation import column_arrays, read_arrow

        body_arrow = request_body(raw, "arrow")
        data_arrow = read_arrow(body_arrow)

        def path_arrow():
            got = read_arrow(body_arrow)
            c = v.check_arrow(column_arrays(got, v.names), got.num_rows).columns
            b = p.pipeline.to_batch(p.pipeline.transform(to_arrays(v.rules, c), validated=True))
            return dumps({"scores": forward(b).tolist()})

        fns |= {"parse_arrow": lambda: read_arrow(body_arrow),
                "validate_arrow": lambda: v.check_arrow(column_arrays(data_arrow, v.names), data_arrow.num_rows),
                "path_arrow": path_arrow}
    out = {}
    for name, fn in fns.items():
        for _ in range(5):
            fn()
        ts = np.empty(reps)
        for i in range(reps):
            t = time.thread_time_ns()
            fn()
            ts[i] = time.thread_time_ns() - t
        out[name] = {"p50_us": round(float(np.percentile(ts, 50)) / 1e3, 1),
                     "p99_us": round(float(np.percentile(ts, 99)) / 1e3, 1)}
    return out


def run_tree(src: Path, ckpt: str, args: argparse.Namespace) -> dict:
    """:func:`measure` in a fresh process importing ``ctrkit`` from ``src``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(HERE)])}
    cmd = [sys.executable, str(HERE / "serve_path.py"), "--worker", "--checkpoint", ckpt, "--rows", str(args.rows),
           "--reps", str(args.reps)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise SystemExit(f"timing {src} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def median_of(runs: list[dict]) -> dict:
    return {s: {k: round(float(np.median([r[s][k] for r in runs])), 1) for k in ("p50_us", "p99_us")}
            for s in STAGES if s in runs[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", help="checkpoint (default: train serve_load.py's DeepFM)")
    ap.add_argument("--work-dir", help="where the default checkpoint is trained (default: a temporary dir)")
    ap.add_argument("--rows", type=int, default=100, help="raw Criteo rows per request")
    ap.add_argument("--reps", type=int, default=300, help="timed repetitions per stage")
    ap.add_argument("--rounds", type=int, default=3, help="rounds (fresh processes) per tree")
    ap.add_argument("--compare", help="another checkout's src directory to time beside this one")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(measure(args.checkpoint, args.rows, args.reps)))
        return
    with tempfile.TemporaryDirectory(prefix="serve_path_") as tmp:
        ckpt = args.checkpoint
        if ckpt is None:
            sys.path.insert(0, str(HERE))
            from serve_load import train_deepfm

            ckpt = str(train_deepfm(Path(args.work_dir or tmp)))
        trees = {"this": HERE.parent / "src"}
        if args.compare:
            trees["compare"] = Path(args.compare).resolve()
        load0 = os.getloadavg()
        runs: dict[str, list[dict]] = {k: [] for k in trees}
        for r in range(args.rounds):
            for name in (list(trees) if r % 2 == 0 else list(trees)[::-1]):
                runs[name].append(run_tree(trees[name], ckpt, args))
        load1 = os.getloadavg()
    result = {name: median_of(rs) for name, rs in runs.items()}
    print(f"CPU time per {args.rows}-row request, p50 / p99 in microseconds (median of {args.rounds} rounds); "
          f"load average {load0[0]:.1f} -> {load1[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'stage':17s}" + "".join(f"{name + ' (' + str(trees[name]) + ')':>40s}" for name in trees))
    for s in STAGES:
        print(f"{s:17s}" + "".join(f"{result[n][s]['p50_us']:>24.1f} / {result[n][s]['p99_us']:>6.1f}"
                                   if s in result[n] else f"{'-':>33s}" for n in trees))
    print(json.dumps({"benchmark": "serve_path", "rows": args.rows, "reps": args.reps, "rounds": args.rounds,
                      "load_average": [round(load0[0], 2), round(load1[0], 2)], "cpu_count": os.cpu_count(),
                      "trees": {k: str(v) for k, v in trees.items()}, "cpu_us": result}))


if __name__ == "__main__":
    main()
