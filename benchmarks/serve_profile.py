"""Where a served request's CPU goes: one ``ctrkit serve`` worker under load, per thread and per function.

    python benchmarks/serve_profile.py --checkpoint CKPT [--body columns|rows|arrow] [--clients 32]
                                       [--seconds 10] [--rate 250] [--out DIR]

Starts ``ctrkit serve --workers 1 --threads 1`` on the checkpoint (``benchmarks/serve_load.py``'s DeepFM, say),
sends 100-row requests from ``--clients`` keep-alive connections (serve_load's asyncio client) for
``--seconds``, and meanwhile:

* reads each server thread's CPU time from ``/proc/PID/task`` (the event loop: HTTP, parse, check, answer; the
  scoring thread: encode, collate, forward), printed as CPU ms per request, beside the micro-batch size;
* samples the worker with py-spy (``pip install py-spy``: the ``dev`` extra; skipped with a note when absent)
  and prints the share of samples of the heaviest functions, inclusive and self, per thread; the raw stacks
  go to ``--out``.

Linux only (/proc). Prints a table and ends with ONE JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import serve_load as sl


def thread_cpu(pid: int) -> dict[int, float]:
    """{thread id: user + system CPU seconds} of the threads of ``pid``."""
    out = {}
    for t in Path(f"/proc/{pid}/task").iterdir():
        f = (t / "stat").read_text().rsplit(")", 1)[1].split()
        out[int(t.name)] = (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    return out


def shares(raw: Path, top: int) -> dict[str, list[tuple[str, float]]]:
    """py-spy's raw stacks -> {"inclusive" / "self": [(function (file), share of samples)]}."""
    incl: collections.Counter = collections.Counter()
    leaf: collections.Counter = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, n = line.rsplit(" ", 1)
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")[1:]]
        total += int(n)
        for f in set(frames):
            incl[f] += int(n)
        if frames:
            leaf[frames[-1]] += int(n)
    return {k: [(f, round(n / max(total, 1), 3)) for f, n in c.most_common(top)]
            for k, c in (("inclusive", incl), ("self", leaf))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--body", choices=("columns", "rows", "arrow"), default="columns")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rows", type=int, default=100)
    ap.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--out", help="directory for py-spy's raw stacks (default: a temporary one)")
    args = ap.parse_args()
    from ctrkit.serving.predictor import Predictor

    rows = sl.criteo_rows(args.rows, Predictor.from_checkpoint(args.checkpoint).input_columns)
    body = sl.request_body(rows, args.body)
    port = sl.free_port()
    out = Path(args.out or tempfile.mkdtemp(prefix="serve_profile_"))
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / "server.log", "wb")  # noqa: SIM115 - closed below
    server = subprocess.Popen([sys.executable, "-m", "ctrkit.cli", "serve", "--checkpoint", args.checkpoint,
                               "--port", str(port), "--workers", "1", "--threads", "1"], stdout=log,
                              stderr=subprocess.STDOUT)
    spy_path = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if sl.get(port, "/healthz").get("status") == "ok":
                    break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the server did not come up; see {out / 'server.log'}")
            time.sleep(0.2)
        request = (f"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: {sl.MEDIA[args.body]}\r\n"
                   f"Content-Length: {len(body)}\r\n\r\n").encode() + body
        asyncio.run(sl._level(port, request, args.clients, 1.0, 10**9, args.rows, warm=5))  # warm up
        raw = out / f"py-spy_{args.body}_{args.clients}.txt"
        spy = None
        if Path(spy_path).exists():
            spy = subprocess.Popen([spy_path, "record", "--pid", str(server.pid), "--format", "raw", "-o", str(raw),
                                    "--threads", "--nonblocking", "--rate", str(args.rate), "--duration",
                                    str(int(args.seconds))], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        b0, t0 = sl.get(port, "/metadata")["server"]["batching"], thread_cpu(server.pid)
        lv = asyncio.run(sl._level(port, request, args.clients, args.seconds, 10**9, args.rows, warm=0))
        b1, t1 = sl.get(port, "/metadata")["server"]["batching"], thread_cpu(server.pid)
        if spy is not None:
            spy.wait()
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
    n = b1["requests"] - b0["requests"]
    per_thread = sorted(((tid, round((t1[tid] - t0.get(tid, 0.0)) * 1e3 / max(n, 1), 3)) for tid in t1),
                        key=lambda x: -x[1])
    per_thread = [(("event loop" if tid == server.pid else f"thread {tid}"), ms) for tid, ms in per_thread if ms > 0.005]
    load = [round(x, 2) for x in os.getloadavg()]
    print(f"{args.body} body, {args.clients} clients, {n} requests ({lv['qps']} req/s), "
          f"{n / max(b1['batches'] - b0['batches'], 1):.1f} requests per model call; load average {load}")
    for name, ms in per_thread:
        print(f"  {name:14s} {ms:.3f} CPU ms per request")
    profile = shares(raw, args.top) if spy is not None and raw.exists() else None
    if profile is None:
        print("py-spy not found: no function profile (pip install py-spy)")
    else:
        for kind, items in profile.items():
            print(f"-- {kind} (share of samples)")
            for f, share in items:
                print(f"  {share:6.1%} {f}")
    print(json.dumps({"benchmark": "serve_profile", "body": args.body, "clients": args.clients, "requests": n,
                      "requests_per_model_call": round(n / max(b1["batches"] - b0["batches"], 1), 2),
                      "cpu_ms_per_request_by_thread": dict(per_thread), "load_average": load,
                      "py_spy": profile, "raw_stacks": str(raw) if profile else None}))


if __name__ == "__main__":
    main()
