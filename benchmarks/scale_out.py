"""Scale out: training samples/s on 1 and 2 processes here, the bytes each rank sends per step (measured on the
loopback interface, against the formula), and a projection of MLPerf DLRM-DCNv2 on 2 nodes x 8 GPUs.

Workload: DLRM (dot interaction, dense arch 512-256-D, over arch 512-256-1) on ``--rows`` synthetic Criteo-shaped
rows (``ctrkit synth``, cardinalities capped at ``--max-cardinality``), embedding dim ``--dim``, global batch
``--batch``, row-wise Adagrad on the tables and Adam on the rest, the ``--steps`` timed steps after 3 warm-up
steps, batches built beforehand (untimed). 1 process runs with all ``--threads`` threads and with one; W processes (gloo on
127.0.0.1, the library's own data-parallel path: :func:`ctrkit.training.distributed.wrap_for_training`, DDP with
sparse table gradients) with threads / W each, so both use the same cores. This machine has 2 cores: two
processes cannot be faster than one here; the figure shows the cost of the communication, not a speed-up.

Bytes per rank per step: the transmit counter of ``lo`` (/proc/net/dev) over the timed steps, divided by steps and
ranks (all of the loopback traffic in that window, so anything else on the machine using it counts too), against
the formula of what DDP moves: a ring all-reduce of the dense gradients (each rank sends 2 (W-1)/W x their
bytes) plus gloo's sparse all-reduce of each table gradient (each rank sends its rows -- (D x 4 + 8) bytes each,
the rows counted on the real batches -- to the W-1 others), plus the one all-reduce of the logged loss.

Projection (no measurement: arithmetic over MLPerf's configuration, labelled as such): per rank of 2 x 8 GPUs,
table memory with table-wise sharding, the all-to-all bytes of the sharded tables (ids in, pooled vectors out,
their gradients back) and the all-reduce bytes of the dense part, and times at assumed link speeds.

    python benchmarks/scale_out.py [--rows 200000] [--steps 30] [--batch 4096] [--dim 16] [--threads 2]

Prints a table and ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))
import itertools

from criteo1tb_projection import CARDINALITIES, table_memory

from ctrkit.data.storage.loader import BatchLoader
from ctrkit.data.storage.store import Store
from ctrkit.models.registry import create_model
from ctrkit.training.config import DistributedConfig, TrainConfig
from ctrkit.training.distributed import DistContext, end_worker_process, wrap_for_training
from ctrkit.training.optim import build_optimizers
from ctrkit.training.sharding import sharded_optimizers
from ctrkit.training.tasks import CTRTask

MLPERF = {"ranks": 16, "global_batch": 65536, "dim": 128, "bottom": [512, 256, 128], "top": [1024, 1024, 512, 256, 1],
          "dcn_layers": 3, "dcn_rank": 512, "multi_hot": [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12,
                                                          100, 27, 10, 3, 1, 1]}
# assumed link speeds of the projection (bytes/s per GPU): NVLink 4 within a node, 400 Gb/s InfiniBand across
LINKS = {"nvlink": 450e9, "infiniband": 50e9}


def lo_tx_bytes() -> int:
    for line in Path("/proc/net/dev").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name.strip() == "lo":
            return int(rest.split()[8])
    raise RuntimeError("no loopback interface in /proc/net/dev")


def _model(store: Store, dim: int, backend: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return create_model("dlrm", store.schema, embedding_dim=dim, dense_arch=[512, 256, dim], over_arch=[512, 256, 1],
                        embedding_backend=backend)


def worker(rank: int, world: int, port: int, store_path: str, batch: int, steps: int, threads: int, dim: int,
           out: str, sharding: str | None = None) -> None:
    """One rank: train ``steps`` timed steps (the torchrec backend sharded by ``sharding`` when given, else the
    fused backend under DDP); rank 0 writes what it measured to ``out``."""
    torch.set_num_threads(threads)
    ctx = None
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
        ctx = DistContext(rank, world, rank, "gloo", torch.device("cpu"))
    store = Store(store_path)
    model = _model(store, dim, "torchrec" if sharding else "fused")
    cfg = TrainConfig(sparse_optimizer="rowwise_adagrad", embedding_lr=0.02, lr=1e-3,
                      distributed=DistributedConfig(sharding=sharding or "auto"))
    task = CTRTask(["auc"]).bind(model)
    module = wrap_for_training(model, task, ctx, cfg)
    opt = sharded_optimizers(module, cfg) or build_optimizers(model, cfg)
    loader = BatchLoader(store, batch // world, shuffle=True, prefetch=0, rank=rank, world_size=world)
    batches = [b for _, b in zip(range(steps + 3), loader)]
    rows = []  # table rows with a gradient, per step (this rank)

    def step(b):
        loss, _ = module(b)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if ctx is not None:
            ctx.step_totals(loss, len(b))
        rows.append(sum(int(p.grad.coalesce().indices().shape[1]) for p in model.embedding_parameters()
                        if p.grad is not None and p.grad.is_sparse) if sharding is None else 0)
        opt.step()

    for b in batches[:3]:
        step(b)
    if ctx is not None:
        ctx.barrier()
    tx, t = lo_tx_bytes(), time.perf_counter()
    for b in batches[3:]:
        step(b)
    if ctx is not None:
        ctx.barrier()
    seconds, sent = time.perf_counter() - t, lo_tx_bytes() - tx
    tables = {id(p) for p in model.embedding_parameters()}
    dense = sum(p.numel() for p in model.parameters() if id(p) not in tables)
    if rank == 0:
        Path(out).write_text(json.dumps({
            "seconds": seconds, "samples_per_s": steps * batch / seconds, "lo_bytes_per_rank_step": sent / steps / world,
            "dense_params": dense, "sparse_rows_per_step": float(np.mean(rows[3:]))}))
    if ctx is not None:
        dist.destroy_process_group()
        end_worker_process(0)  # DDP / torchrec keep gloo's threads alive: no interpreter finalization after them


def run(world: int, store: Path, args: argparse.Namespace, tmp: Path, sharding: str | None = None,
        threads: int | None = None) -> dict:
    out = tmp / f"w{world}-{sharding}-{threads}.json"
    threads = threads or max(1, args.threads // world)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(worker, args=(world, port, str(store), args.batch, args.steps, threads, args.dim, str(out),
                                     sharding), nprocs=world, start_method="spawn")
    return json.loads(out.read_text())


def ddp_formula(m: dict, world: int, dim: int) -> float:
    """Bytes one rank sends per step under DDP (module docstring)."""
    dense = 2 * (world - 1) / world * m["dense_params"] * 4
    sparse = (world - 1) * m["sparse_rows_per_step"] * (dim * 4 + 8)
    return dense + sparse + 8


def sharded_formula(m: dict, world: int, dim: int, batch: int, tables: int, sharding: str) -> float:
    """Bytes one rank sends per step with every table sharded (torchrec's all-to-alls; ids as int64 values and int32
    lengths, single-hot): its batch's ids go to the ranks holding a shard of each table, and the pooled vectors of
    its shards for the other ranks' rows go out (their gradients come back the same way). table_wise: one shard per
    table; column_wise: shards of torchrec's default width (128 columns, so a table up to 128 wide is one shard and
    costs as table_wise)."""
    b = batch // world
    dense = 2 * (world - 1) / world * m["dense_params"] * 4
    shards = 1 if sharding == "table_wise" or dim <= 128 else dim // 128
    holders = min(shards, world)  # ranks holding a piece of a table
    ids = tables * b * (8 + 4) * holders * (world - 1) / world
    pooled = 2 * tables * b * dim * 4 * (world - 1) / world
    return dense + ids + pooled + 8


def mlperf_projection() -> dict:
    """Per rank of 2 nodes x 8 GPUs, MLPerf DLRM-DCNv2 (projection: arithmetic, no measurement)."""
    p = MLPERF
    W, B, D = p["ranks"], p["global_batch"], p["dim"]
    b = B // W
    feats = len(CARDINALITIES)
    interaction = (feats + 1) * D  # DCN input: the bottom MLP's output and 26 pooled vectors
    dims = [13, *p["bottom"]]
    bottom = sum(i * o + o for i, o in itertools.pairwise(dims))
    dcn = p["dcn_layers"] * (2 * interaction * p["dcn_rank"] + interaction)
    tdims = [interaction, *p["top"]]
    top = sum(i * o + o for i, o in itertools.pairwise(tdims))
    dense = bottom + dcn + top
    ids = B * sum(p["multi_hot"]) / W  # ids one rank's tables receive (tables spread evenly), int64
    pooled = b * feats * D * 4  # one rank's share of the global batch, every table's vector: out and grads back
    a2a = ids * 8 * (W - 1) / W + 2 * pooled * (W - 1) / W
    allreduce = 2 * (W - 1) / W * dense * 4
    mem = table_memory(W)
    t = {f"{k}_ms": 1e3 * (a2a + allreduce) / v for k, v in LINKS.items()}
    return {"ranks": W, "per_rank_batch": b, "dense_params": dense, "table_gb_fp32": round(mem["fp32_tables"], 2),
            "table_gb_fp32_rowwise_adagrad": round(mem["fp32_rowwise_adagrad"], 2),
            "table_gb_bf16_rowwise_adagrad": round(mem["bf16_rowwise_adagrad"], 2),
            "all_to_all_mb_per_step": round(a2a / 1e6, 1), "all_reduce_mb_per_step": round(allreduce / 1e6, 1),
            **{k: round(v, 2) for k, v in t.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-cardinality", type=int, default=100_000)
    ap.add_argument("--sharding", nargs="*", default=["table_wise", "column_wise"],
                    help="torchrec sharding types to measure on 2 processes (none: skip torchrec)")
    args = ap.parse_args()
    print(f"cpu capability {torch.backends.cpu.get_cpu_capability()}; {os.cpu_count()} cores; fp32", flush=True)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        store = tmp / "store"
        subprocess.run([sys.executable, "-m", "ctrkit", "synth", "--rows", str(args.rows), "--out", str(store),
                        "--format", "store", "--max-cardinality", str(args.max_cardinality), "--embedding-dim",
                        str(args.dim)], check=True, capture_output=True)
        one, one_1t, two = run(1, store, args, tmp), run(1, store, args, tmp, threads=1), run(2, store, args, tmp)
        tables = len(Store(store).schema.sparse_keys)
        sharded = {k: run(2, store, args, tmp, k) for k in args.sharding}
    formula = ddp_formula(two, 2, args.dim)
    proj = mlperf_projection()
    print(f"{'run':>24} {'threads each':>13} {'samples/s':>12} {'MB sent/rank/step':>18} {'formula MB':>11}")
    print(f"{'1 process':>24} {args.threads:>13} {one['samples_per_s']:>12,.0f} {'-':>18} {'-':>11}")
    print(f"{'1 process':>24} {1:>13} {one_1t['samples_per_s']:>12,.0f} {'-':>18} {'-':>11}")
    print(f"{'2 processes, DDP':>24} {max(1, args.threads // 2):>13} {two['samples_per_s']:>12,.0f} "
          f"{two['lo_bytes_per_rank_step'] / 1e6:>18.3f} {formula / 1e6:>11.3f}")
    shard_rows = {}
    for k, m in sharded.items():
        f = sharded_formula(m, 2, args.dim, args.batch, tables, k)
        shard_rows[k] = {"samples_per_s": round(m["samples_per_s"]), "bytes_measured": round(m["lo_bytes_per_rank_step"]),
                         "bytes_formula": round(f)}
        print(f"{'2 processes, ' + k:>24} {max(1, args.threads // 2):>13} {m['samples_per_s']:>12,.0f} "
              f"{m['lo_bytes_per_rank_step'] / 1e6:>18.3f} {f / 1e6:>11.3f}")
    print("PROJECTION (arithmetic, not measured): MLPerf DLRM-DCNv2, 2 nodes x 8 GPUs:")
    for k, v in proj.items():
        print(f"  {k}: {v}")
    print(json.dumps({"cpu_capability": torch.backends.cpu.get_cpu_capability(), "cores": os.cpu_count(),
                      "samples_per_s_1proc": round(one["samples_per_s"]),
                      "samples_per_s_1proc_1thread": round(one_1t["samples_per_s"]),
                      "samples_per_s_2proc": round(two["samples_per_s"]),
                      "ratio_2proc_over_1proc": round(two["samples_per_s"] / one["samples_per_s"], 3),
                      "ratio_2proc_over_1proc_1thread": round(two["samples_per_s"] / one_1t["samples_per_s"], 3),
                      "ddp_bytes_per_rank_step_measured": round(two["lo_bytes_per_rank_step"]),
                      "ddp_bytes_per_rank_step_formula": round(formula),
                      "sparse_rows_per_rank_step": two["sparse_rows_per_step"], "dense_params": two["dense_params"],
                      "torchrec_2proc": shard_rows,
                      "projection_mlperf_2x8": proj}))


if __name__ == "__main__":
    main()
