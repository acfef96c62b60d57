"""``ctrkit serve`` under load: QPS and latency of POST /predict with 100 raw Criteo rows per request.

    python benchmarks/serve_load.py [--checkpoint CKPT] [--seconds 10] [--max-requests 20000]
                                    [--clients 1,8,32] [--rows 100] [--threads N] [--batch-wait-ms 2]

1. the checkpoint: ``--checkpoint``, or a DeepFM trained for one epoch on the bundled Criteo sample
   (``preprocess_criteo`` with min_freq 8, D = 16, then ``configs/criteo/deepfm.yaml``) in a temporary dir;
2. the reference: in-process ``Predictor.predict`` of the same 100 rows (1 torch thread), and where one
   request's time goes inside the server: JSON parsing, validation, pipeline encode, model forward;
3. the server: ``ctrkit serve`` (``python -m ctrkit.cli serve``) in a subprocess on 127.0.0.1
   and a free port, polled on /healthz until ready;
4. the load: for each client count, that many keep-alive HTTP/1.1 connections, each sending its next request
   as soon as the last answer arrived (closed loop), for ``--seconds`` (or ``--max-requests``) after a short
   warm-up; requests/s, rows/s and latency percentiles per level, and the server's batching counters (mean
   requests per model call) from /metadata.

The client is one asyncio event loop on raw sockets (no HTTP library on the hot path), in this process, and
it shares the machine's cores with the server: on a small machine its CPU time counts against the server's
throughput (stated in the output, with the core count). Prints a table and ends with ONE JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import torch

from ctrkit.serving.options import default_threads

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "examples" / "data" / "criteo_sample.tsv.gz"


# ---- setup ------------------------------------------------------------------------------------------------
def train_deepfm(work: Path) -> Path:
    from ctrkit.cli import main
    from ctrkit.data.sources.criteo import preprocess_criteo

    stores = preprocess_criteo(SAMPLE, work / "criteo", split="0.8,0.1,0.1", seed=0, min_freq=8,
                               embedding_dim=16, progress=False)
    rc = main(["train", "--config", str(REPO / "configs/criteo/deepfm.yaml"), "--quiet",
               f"--data.train={stores['train']}", f"--data.valid={stores['valid']}", f"--data.test={stores['test']}",
               f"--run.dir={work / 'runs'}", "--run.name=deepfm", "--train.epochs=1"])
    if rc != 0:
        raise SystemExit(f"training the benchmark's DeepFM failed (exit {rc})")
    return work / "runs" / "deepfm" / "best.pt"


def criteo_rows(n: int, columns: list[str]) -> list[dict]:
    """The sample's first ``n`` rows as JSON objects: label, I1..I13 integers, C1..C26 hex keys (null = empty)."""
    rows = []
    with gzip.open(SAMPLE, "rt") as f:
        for line in f:
            v = line.rstrip("\n").split("\t")
            row = {"label": int(v[0])}
            row.update({f"I{i}": int(v[i]) if v[i] else None for i in range(1, 14)})
            row.update({f"C{i}": v[13 + i] or None for i in range(1, 27)})
            rows.append(row)
            if len(rows) == n:
                break
    missing = [c for c in columns if c not in rows[0]]
    if missing:
        raise SystemExit(f"the checkpoint reads columns {missing} that raw Criteo rows do not have")
    return rows


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed(fn, reps: int) -> dict[str, float]:
    fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return {"p50_ms": round(float(np.percentile(ts, 50)) * 1e3, 3), "p99_ms": round(float(np.percentile(ts, 99)) * 1e3, 3)}


def in_process(ckpt: Path, rows: list[dict], reps: int) -> dict[str, dict[str, float]]:
    """Predictor.predict of the rows, and the server path's stages, in this process with 1 torch thread."""
    from ctrkit.serving.predictor import Predictor
    from ctrkit.serving.validation import RowValidator, loads, to_arrays

    p = Predictor.from_checkpoint(ckpt)
    body = json.dumps(rows).encode()
    v = RowValidator(p.pipeline)
    cols = v.check(rows).columns
    arrays = to_arrays(v.rules, cols)
    batch = p.pipeline.to_batch(p.pipeline.transform(arrays))

    def forward() -> None:
        with torch.no_grad():
            p.model(batch)

    return {"predictor_predict": timed(lambda: p.predict(rows), reps),
            "server_path_json_loads": timed(lambda: loads(body), reps),
            "server_path_validate": timed(lambda: v.check(rows), reps),
            "server_path_score": timed(lambda: p.score(to_arrays(v.rules, cols)), reps),
            "server_path_encode": timed(lambda: p.pipeline.transform(arrays), reps),
            "server_path_model_forward": timed(forward, reps)}


# ---- load -------------------------------------------------------------------------------------------------
async def _connection(port: int, request: bytes, seconds: float, budget: list[int], lat: list[float],
                      spans: list[float], errors: list[str], n_rows: int, warm: int) -> None:
    """One keep-alive connection: ``warm`` requests, then requests for ``seconds`` (its own clock)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    checked = False
    start = until = 0.0
    try:
        k = 0
        while True:
            measuring = k >= warm
            if k == warm:
                start = time.perf_counter()
                until = start + seconds
            if measuring and (time.perf_counter() >= until or budget[0] <= 0):
                break
            if measuring:
                budget[0] -= 1
            t = time.perf_counter()
            writer.write(request)
            status = await reader.readline()
            length = 0
            while (h := await reader.readline()) not in (b"\r\n", b""):
                if h[:15].lower() == b"content-length:":
                    length = int(h[15:])
            body = await reader.readexactly(length)
            dt = time.perf_counter() - t
            if not status.startswith(b"HTTP/1.1 200"):
                errors.append(f"{status.decode().strip()}: {body[:200]!r}")
                return
            if not checked:
                n = len(json.loads(body)["scores"])
                if n != n_rows:
                    errors.append(f"{n} scores for {n_rows} rows")
                checked = True
            if measuring:
                lat.append(dt)
            k += 1
    finally:
        spans.append(time.perf_counter() - start if start else 0.0)
        writer.close()


async def _level(port: int, request: bytes, clients: int, seconds: float, max_requests: int, n_rows: int,
                 warm: int) -> dict:
    lat: list[float] = []
    errors: list[str] = []
    spans: list[float] = []
    budget = [max_requests]
    t0 = time.perf_counter()
    tasks = [_connection(port, request, seconds, budget, lat, spans, errors, n_rows, warm) for _ in range(clients)]
    await asyncio.gather(*tasks)
    wall = time.perf_counter() - t0
    if errors:
        raise SystemExit(f"{clients} clients: {errors[:3]}")
    a = np.array(lat) * 1e3
    busy = sum(spans) / clients  # measured seconds per connection (warm-up excluded)
    return {"clients": clients, "requests": len(lat), "seconds": round(busy, 2),
            "qps": round(len(lat) / busy, 1), "rows_per_s": round(len(lat) * n_rows / busy, 0),
            "p50_ms": round(float(np.percentile(a, 50)), 2), "p90_ms": round(float(np.percentile(a, 90)), 2),
            "p99_ms": round(float(np.percentile(a, 99)), 2), "max_ms": round(float(a.max()), 2),
            "wall_s": round(wall, 2)}


def get(port: int, path: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
        return json.load(r)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", help="checkpoint to serve (default: train a DeepFM on the bundled sample)")
    ap.add_argument("--work-dir", help="where the default checkpoint is trained (default: a temporary dir)")
    ap.add_argument("--seconds", type=float, default=10.0, help="measured seconds per client level")
    ap.add_argument("--max-requests", type=int, default=20000, help="measured requests per level, at most")
    ap.add_argument("--clients", default="1,8,32", help="comma-separated concurrent client counts")
    ap.add_argument("--rows", type=int, default=100, help="raw rows per request")
    ap.add_argument("--threads", type=int, help="server torch threads (default: ctrkit serve's, cores - 1)")
    ap.add_argument("--batch-wait-ms", type=float, default=None, help="server micro-batch wait (default: serve's)")
    ap.add_argument("--reps", type=int, default=200, help="repetitions of the in-process reference timings")
    args = ap.parse_args()
    torch.set_num_threads(1)

    with tempfile.TemporaryDirectory(prefix="serve_load_") as tmp:
        work = Path(args.work_dir or tmp)
        ckpt = Path(args.checkpoint) if args.checkpoint else train_deepfm(work)
        from ctrkit.serving.predictor import Predictor

        info = Predictor.from_checkpoint(ckpt).metadata()
        rows = criteo_rows(args.rows, info["input_columns"])
        ref = in_process(ckpt, rows, args.reps)
        body = json.dumps(rows).encode()

        port = free_port()
        cmd = [sys.executable, "-m", "ctrkit.cli", "serve", "--checkpoint", str(ckpt), "--host", "127.0.0.1",
               "--port", str(port)]
        if args.threads is not None:
            cmd += ["--threads", str(args.threads)]
        if args.batch_wait_ms is not None:
            cmd += ["--batch-wait-ms", str(args.batch_wait_ms)]
        log = open(work / "server.log", "w+b")  # noqa: SIM115 - read back on failure, closed below
        server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    if get(port, "/healthz").get("status") == "ok":
                        break
                except OSError:
                    pass
                if server.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise SystemExit(f"the server did not come up:\n{log.read().decode()[-3000:]}")
                time.sleep(0.1)
            request = (f"POST /predict HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                       f"Content-Length: {len(body)}\r\n\r\n").encode() + body
            levels = []
            for clients in (int(c) for c in args.clients.split(",")):
                before = get(port, "/metadata")["server"]["batching"]
                lv = asyncio.run(_level(port, request, clients, args.seconds, args.max_requests, args.rows, warm=5))
                after = get(port, "/metadata")["server"]["batching"]
                calls = after["batches"] - before["batches"]
                lv["requests_per_model_call"] = round((after["requests"] - before["requests"]) / max(calls, 1), 2)
                levels.append(lv)
                print(f"{clients:>3} clients: {lv['qps']:>7.1f} req/s {lv['rows_per_s']:>9.0f} rows/s  "
                      f"p50 {lv['p50_ms']:6.2f} ms  p90 {lv['p90_ms']:6.2f} ms  p99 {lv['p99_ms']:6.2f} ms  "
                      f"max {lv['max_ms']:7.2f} ms  ({lv['requests']} requests, "
                      f"{lv['requests_per_model_call']} requests per model call)", flush=True)
            limits = get(port, "/metadata")["server"]["limits"]
        finally:
            server.terminate()
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()
            log.close()

    cap = torch.backends.cpu.get_cpu_capability()
    load = [round(x, 2) for x in os.getloadavg()]
    print(f"in-process Predictor.predict({args.rows} rows): p50 {ref['predictor_predict']['p50_ms']} ms, "
          f"p99 {ref['predictor_predict']['p99_ms']} ms; server path stages (p50 ms): "
          + ", ".join(f"{k.removeprefix('server_path_')} {v['p50_ms']}" for k, v in ref.items()
                      if k.startswith("server_path")))
    print(f"cpu capability {cap}, {os.cpu_count()} cores shared by the server and this client (one asyncio "
          f"loop, raw HTTP/1.1 keep-alive sockets); load average at the end {load} (other work on the machine "
          "slows both)")
    one = next((lv for lv in levels if lv["clients"] == 1), None)
    print(json.dumps({"benchmark": "serve_load", "model": info["model"], "rows_per_request": args.rows,
                      "cpu_capability": cap, "cpu_count": os.cpu_count(), "load_average": load, "client": "asyncio raw HTTP/1.1, same host",
                      "server_threads": args.threads or default_threads(), "server_limits": limits, "levels": levels,
                      "in_process_ms": ref,
                      "p99_1_client_ms": one["p99_ms"] if one else None,
                      "p99_1_client_target_ms": 20.0,
                      "meets_target": bool(one and one["p99_ms"] <= 20.0)}))


if __name__ == "__main__":
    main()
