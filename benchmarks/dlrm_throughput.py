"""DLRM training throughput: ctrkit vs torchrec on the peers' workload, measured in the same run.

Workload (../shared/bench): 200k synthetic Criteo-shaped rows, 13 dense, 26 sparse (cardinalities
10..100k, Zipf skew), D = 16, dense arch 512-256-16, over arch 512-256-1, batch 4096, 2 threads,
one epoch, only the training loop timed (batches built beforehand, as the peer script does).
Optimizers as the peer's fastest path: Adam (lr 1e-3) on dense parameters, row-wise Adagrad
(lr 0.02) on the embedding tables.

    python benchmarks/dlrm_throughput.py [--reps 3] [--skip-peer] [--interaction dot|dcn] [--no-keep-freed-memory]
                                         [--device cpu|cuda]

``--device cuda`` trains ctrkit's model on the GPU (batches moved there beforehand, untimed; the clock stops
after a device synchronisation); the peer stays on the CPU, so on CUDA pass --skip-peer. With --skip-peer the
data is made by ``shared/bench/make_data.py`` alone (no peer install).

Prints a table and ends with one JSON line:
{"ctrkit_samples_per_s": ..., "torchrec_samples_per_s": ..., "ratio": ...}
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("CTRKIT_SHARED", REPO.parent / "shared"))
BENCH = SHARED / "bench"
PEERS = Path(os.environ.get("PEERS_HOME", Path.home() / ".cache" / "ctrkit-peers"))
DATA = PEERS / "data" / "synth.npz"
BATCH, EMB_DIM, THREADS = 4096, 16, 2


def ensure_peers_and_data(data_only: bool = False) -> None:
    env = {**os.environ, "PEERS_HOME": str(PEERS)}
    if data_only:
        if not DATA.is_file():
            subprocess.run([sys.executable, str(BENCH / "make_data.py")], check=True, env=env)
        return
    subprocess.run(["bash", str(BENCH / "install.sh")], check=True, env=env)
    if not DATA.is_file():
        subprocess.run([str(PEERS / "venv-deepctr/bin/python"), str(BENCH / "make_data.py")], check=True,
                       env=env, cwd=BENCH)


def run_peer(mode: str, model: str) -> dict:
    env = {**os.environ, "PEERS_HOME": str(PEERS), "OMP_NUM_THREADS": str(THREADS),
           "MKL_NUM_THREADS": str(THREADS)}
    p = subprocess.run([str(PEERS / "venv-torchrec/bin/python"), "bench_torchrec.py", mode, model],
                       check=False, cwd=BENCH, env=env, capture_output=True, text=True)
    m = re.search(r"^RESULT (\{.*\})$", p.stdout, re.MULTILINE)
    if not m:
        raise RuntimeError(f"torchrec peer failed:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return json.loads(m.group(1))


def run_ctrkit(interaction: str, precision: str, seed: int = 0, keep_memory: bool = True,
               device: str = "cpu") -> dict:
    from ctrkit.batch import Batch, KeyedJagged
    from ctrkit.models.base import logits_of
    from ctrkit.models.registry import create_model
    from ctrkit.schema import DenseFeature, Schema, SparseFeature
    from ctrkit.training.config import TrainConfig
    from ctrkit.training.memory import keep_freed_memory
    from ctrkit.training.optim import build_optimizers

    torch.manual_seed(seed)
    torch.set_num_threads(THREADS)
    if keep_memory:  # as Trainer.fit does with train.keep_freed_memory (the default)
        keep_freed_memory()
    d = np.load(DATA)
    dense, sparse, label, cards = d["dense"], d["sparse"], d["label"], [int(c) for c in d["cards"]]
    keys = [f"C{j + 1}" for j in range(26)]
    schema = Schema(dense=[DenseFeature(f"I{i + 1}") for i in range(13)],
                    sparse=[SparseFeature(k, max(c, 2), EMB_DIM) for k, c in zip(keys, cards)])
    params = {"dense_arch": (512, 256), "over_arch": (512, 256), "interaction": interaction}
    if interaction == "dcn":
        params.update(cross_type="low_rank", cross_layers=3, cross_rank=16)
    model = create_model("dlrm", schema, **params).to(device)
    cfg = TrainConfig(lr=1e-3, dense_optimizer="adam", sparse_optimizer="rowwise_adagrad", embedding_lr=0.02,
                      precision=precision)
    opt = build_optimizers(model, cfg)
    # batches built beforehand, as the peer does (not timed)
    D, S, Y = torch.from_numpy(dense), torch.from_numpy(sparse), torch.from_numpy(label)
    perm = torch.randperm(len(Y))
    batches = []
    for s in range(0, len(Y), BATCH):
        idx = perm[s:s + BATCH]
        batches.append(Batch(dense=D[idx], sparse=KeyedJagged.from_dense(keys, S[idx]), labels=Y[idx]).to(device))
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    dev_type = torch.device(device).type
    autocast = torch.autocast(dev_type, dtype=torch.bfloat16, enabled=precision == "bf16")
    model.train()
    losses = []
    t0 = time.perf_counter()
    for b in batches:
        with autocast:
            logits = logits_of(model(b))
        loss = bce(logits.float(), b.labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    if dev_type == "cuda":
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    losses = [float(x) for x in losses]
    return {"library": "ctrkit", "model": f"DLRM-{interaction}", "samples": len(Y), "train_seconds": round(dt, 3),
            "samples_per_s": round(len(Y) / dt, 1), "first_loss": round(losses[0], 4),
            "last_loss": round(losses[-1], 4), "precision": precision, "device": device}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--skip-peer", action="store_true")
    ap.add_argument("--interaction", default="dot", choices=("dot", "dcn"))
    ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    ap.add_argument("--no-keep-freed-memory", action="store_true",
                    help="leave glibc's allocator at its defaults (Trainer: train.keep_freed_memory=false)")
    ap.add_argument("--device", default="cpu", help="ctrkit's device (cpu, cuda); the peer runs on the CPU")
    args = ap.parse_args()
    ensure_peers_and_data(data_only=args.skip_peer)
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else torch.backends.cpu.get_cpu_capability()
    print(f"device {args.device} ({where}); cpu capability {torch.backends.cpu.get_cpu_capability()}", flush=True)
    peer_model = "DLRM" if args.interaction == "dot" else "DLRM_DCN"
    ours, peer = [], []
    for r in range(args.reps):  # interleaved, so both see the same machine state
        if not args.skip_peer:
            peer.append(run_peer("dmp_fused", peer_model))
            print(f"rep {r}: torchrec {peer[-1]['samples_per_s']:.0f} samples/s, last loss {peer[-1]['last_loss']}",
                  flush=True)
        ours.append(run_ctrkit(args.interaction, args.precision, seed=r, keep_memory=not args.no_keep_freed_memory,
                               device=args.device))
        print(f"rep {r}: ctrkit   {ours[-1]['samples_per_s']:.0f} samples/s, last loss {ours[-1]['last_loss']}",
              flush=True)
    c = statistics.median(x["samples_per_s"] for x in ours)
    t = statistics.median(x["samples_per_s"] for x in peer) if peer else None
    out = {"workload": "200k rows, 13 dense + 26 sparse, D=16, dense 512-256-16, over 512-256-1, B=4096, 2 threads",
           "interaction": args.interaction, "precision": args.precision, "reps": args.reps, "device": args.device,
           "device_name": where,
           "keep_freed_memory": not args.no_keep_freed_memory,
           "ctrkit_samples_per_s": round(c, 1), "torchrec_samples_per_s": round(t, 1) if t else None,
           "ratio": round(c / t, 3) if t else None,
           "ctrkit_last_loss": [x["last_loss"] for x in ours],
           "torchrec_last_loss": [x["last_loss"] for x in peer]}
    print(f"\nctrkit {c:,.0f} samples/s" + (f" | torchrec (DMP + fbgemm fused) {t:,.0f} | ratio {c / t:.2f}" if t else ""))
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
