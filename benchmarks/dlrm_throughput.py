"""DLRM training throughput: ctrkit vs torchrec (and ctrkit at another commit), against the matmul roof, same run.

Workload (../shared/bench): 200k synthetic Criteo-shaped rows, 13 dense, 26 sparse (cardinalities
10..100k, Zipf skew), D = 16, dense arch 512-256-16, over arch 512-256-1, batch 4096, 2 threads,
one epoch, only the training loop timed (batches built beforehand, as the peer script does).
Optimizers as the peer's fastest path: Adam (lr 1e-3) on dense parameters, row-wise Adagrad
(lr 0.02) on the embedding tables. Interactions: ``dot`` (torchrec DLRM) and ``dcn`` (low-rank cross net,
3 layers, rank 16: torchrec DLRM_DCN).

    python benchmarks/dlrm_throughput.py [--reps 3] [--interaction dot dcn] [--precision fp32 bf16]
                                         [--baseline REF] [--skip-peer] [--rows N] [--profile]
                                         [--no-keep-freed-memory] [--device cpu|cuda]

One command measures everything interleaved, rep by rep (the machine's load changes between runs, so every
figure is compared only with figures of the same rep): the fp32 / bf16 matmul roof (:mod:`_roof`), torchrec's
fastest CPU path (DistributedModelParallel, fbgemm's fused TBE with the row-wise Adagrad in backward; fp32: the
peer has no bf16 training path on CPU), ctrkit at ``--baseline REF`` (a git ref: its ``src`` is exported to a
temporary folder, e.g. the pre-change commit) and ctrkit of this checkout, each in a fresh process. Reported:
medians over the reps of samples/s, the ratio to torchrec, achieved / roof (FLOPs per sample counted by
``torch.utils.flop_counter`` on the model's forward + backward) and the load average.

``--profile``: after the reps, where one step's time goes (:mod:`_step_profile`: embedding / bottom MLP /
interaction / top MLP forward and backward, loss, optimizer, autograd engine, framework overhead), for this
checkout and the baseline.

``--device cuda`` trains ctrkit's model on the GPU (batches moved there beforehand, untimed; the clock stops after a
device synchronisation); the peer stays on the CPU, so on CUDA pass --skip-peer. With --skip-peer the data is made
by ``shared/bench/make_data.py`` alone (no peer install).

Ends with one JSON line: {"runs": {"dot/fp32": {"ctrkit_samples_per_s": ..., "torchrec_samples_per_s": ...,
"ratio": ..., "achieved_over_roof": ...}, ...}, "roof": {...}, ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _roof
import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("CTRKIT_SHARED", REPO.parent / "shared"))
BENCH = SHARED / "bench"
PEERS = Path(os.environ.get("PEERS_HOME", Path.home() / ".cache" / "ctrkit-peers"))
DATA = PEERS / "data" / "synth.npz"
BATCH, EMB_DIM, THREADS = 4096, 16, 2
PEER_MODEL = {"dot": "DLRM", "dcn": "DLRM_DCN"}


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


def subset(data: Path, rows: int | None, tmp: Path) -> Path:
    """The first ``rows`` rows of the data set (a quick, noisier run), or the data set itself."""
    if rows is None:
        return data
    d = np.load(data)
    out = tmp / "subset.npz"
    np.savez(out, dense=d["dense"][:rows], sparse=d["sparse"][:rows], label=d["label"][:rows], cards=d["cards"])
    return out


def _result_line(stdout: str, stderr: str, who: str) -> dict:
    m = re.search(r"^RESULT (\{.*\})$", stdout, re.MULTILINE)
    if not m:
        raise RuntimeError(f"{who} failed:\n{stdout[-2000:]}\n{stderr[-3000:]}")
    return json.loads(m.group(1))


def run_peer(model: str, data: Path) -> dict:
    env = {**os.environ, "PEERS_HOME": str(PEERS), "PEERS_DATA": str(data), "OMP_NUM_THREADS": str(THREADS),
           "MKL_NUM_THREADS": str(THREADS)}
    p = subprocess.run([str(PEERS / "venv-torchrec/bin/python"), "bench_torchrec.py", "dmp_fused", model],
                       check=False, cwd=BENCH, env=env, capture_output=True, text=True)
    return _result_line(p.stdout, p.stderr, "torchrec peer")


def run_worker(src: Path, data: Path, interaction: str, precision: str, seed: int, args: argparse.Namespace,
               profile: bool = False) -> dict:
    """ctrkit of the source tree ``src`` in a fresh process (its own imports, allocator and threads)."""
    cmd = [sys.executable, __file__, "--worker", "--data", str(data), "--interaction", interaction,
           "--precision", precision, "--seed", str(seed), "--device", args.device, "--threads", str(args.threads)]
    cmd += ["--no-keep-freed-memory"] if args.no_keep_freed_memory else []
    cmd += ["--profile"] if profile else []
    env = {**os.environ, "PYTHONPATH": str(src)}
    p = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True)
    return _result_line(p.stdout, p.stderr, f"ctrkit worker ({src})")


def export_src(ref: str, tmp: Path) -> Path:
    """``src/`` of git ref ``ref`` of this repository, exported to ``tmp`` -> the folder to put on PYTHONPATH."""
    out = tmp / "baseline"
    out.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "src"], check=False, capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"--baseline {ref!r}: git archive failed: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True)
    return out / "src"


# ---- the worker: one ctrkit training run in this process -----------------------------------------------------
def build(data: Path, interaction: str, precision: str, seed: int, device: str) -> tuple[Any, Any, Any, list]:
    """(model, optimizer set, task, batches) of the benchmark workload."""
    from ctrkit.batch import Batch, KeyedJagged
    from ctrkit.models.registry import create_model
    from ctrkit.schema import DenseFeature, Schema, SparseFeature
    from ctrkit.training.config import TrainConfig
    from ctrkit.training.optim import build_optimizers
    from ctrkit.training.tasks import ranking_task

    torch.manual_seed(seed)
    d = np.load(data)
    dense, sparse, label, cards = d["dense"], d["sparse"], d["label"], [int(c) for c in d["cards"]]
    keys = [f"C{j + 1}" for j in range(26)]
    schema = Schema(dense=[DenseFeature(f"I{i + 1}") for i in range(13)],
                    sparse=[SparseFeature(k, max(c, 2), EMB_DIM) for k, c in zip(keys, cards)])
    params: dict[str, Any] = {"dense_arch": (512, 256), "over_arch": (512, 256), "interaction": interaction}
    if interaction == "dcn":
        params.update(cross_type="low_rank", cross_layers=3, cross_rank=16)
    model = create_model("dlrm", schema, **params).to(device)
    cfg = TrainConfig(lr=1e-3, dense_optimizer="adam", sparse_optimizer="rowwise_adagrad", embedding_lr=0.02,
                      precision=precision)
    opt = build_optimizers(model, cfg)
    task = ranking_task(cfg).bind(model)
    D, S, Y = torch.from_numpy(dense), torch.from_numpy(sparse), torch.from_numpy(label)
    perm = torch.randperm(len(Y))
    batches = [Batch(dense=D[idx], sparse=KeyedJagged.from_dense(keys, S[idx]), labels=Y[idx]).to(device)
               for idx in (perm[s:s + BATCH] for s in range(0, len(Y), BATCH))]
    return model, opt, task, batches


def worker(args: argparse.Namespace) -> None:
    import ctrkit
    from ctrkit.memory import keep_freed_memory

    torch.set_num_threads(args.threads)
    if not args.no_keep_freed_memory:  # as Trainer.fit does with train.keep_freed_memory (the default)
        keep_freed_memory()
    model, opt, task, batches = build(Path(args.data), args.interaction, args.precision, args.seed, args.device)
    flops = _roof.training_flops(model, batches[0], lambda m, b: task.loss(m, b)[0], len(batches[0].labels))
    model.train()
    if args.profile:
        print("RESULT " + json.dumps(profile(model, opt, task, batches)), flush=True)
        return

    def step(b: Any) -> torch.Tensor:
        loss = task.loss(model, b)[0]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.detach()

    losses = []
    t0, c0 = time.perf_counter(), time.process_time()
    for b in batches:
        losses.append(step(b))
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    rows = sum(len(b.labels) for b in batches)
    print("RESULT " + json.dumps({
        "samples": rows, "train_seconds": round(dt, 3), "samples_per_s": round(rows / dt, 1),
        "cpu_seconds": round(cpu, 3), "flops_per_sample": flops, "first_loss": round(float(losses[0]), 4),
        "last_loss": round(float(losses[-1]), 4), "src": str(Path(ctrkit.__file__).parents[1])}), flush=True)


def profile(model: Any, opt: Any, task: Any, batches: list) -> dict:
    from _step_profile import profile_steps

    parts = {"embedding": model.sparse_arch, "bottom MLP": model.dense_arch, "interaction": model.interaction_arch,
             "top MLP": model.over_arch}

    def step(b: Any, scope: Any) -> None:
        with scope("loss"):
            loss = task.loss(model, b)[0]
        with scope("zero_grad"):
            opt.zero_grad(set_to_none=True)
        with scope("backward"):
            loss.backward()
        with scope("optimizer"):
            opt.step()

    return profile_steps(step, batches[:16], parts)


# ---- the driver ------------------------------------------------------------------------------------------------
def measure(args: argparse.Namespace, data: Path, baseline: Path | None) -> tuple[dict, list[dict]]:
    """Every (interaction, precision) of every rep, interleaved: roof, peer, baseline, this checkout."""
    runs: dict[str, dict[str, list[dict]]] = {}
    roofs = []
    for r in range(args.reps):
        roofs.append(_roof.measure(args.threads))
        print(f"rep {r}: load {os.getloadavg()[0]:.2f}; roof fp32 {roofs[-1]['fp32_gflops']:.0f} GFLOP/s, bf16 "
              f"{roofs[-1]['bf16_gflops']:.0f} GFLOP/s", flush=True)
        for inter in args.interaction:
            if not args.skip_peer:
                peer = run_peer(PEER_MODEL[inter], data)
                runs.setdefault(f"{inter}/torchrec", {"peer": []})["peer"].append(peer)
                print(f"rep {r}: {inter} torchrec (fp32) {peer['samples_per_s']:>9,.0f} samples/s, last loss "
                      f"{peer['last_loss']}", flush=True)
            for prec in args.precision:
                sides = {"baseline": baseline, "ctrkit": REPO / "src"} if baseline else {"ctrkit": REPO / "src"}
                for side, src in sides.items():
                    res = run_worker(src, data, inter, prec, r, args)
                    res["roof_over"] = _roof.achieved(res["samples_per_s"], res["flops_per_sample"], roofs[-1], prec)
                    runs.setdefault(f"{inter}/{prec}", {}).setdefault(side, []).append(res)
                    print(f"rep {r}: {inter} {side:<8} {prec} {res['samples_per_s']:>9,.0f} samples/s "
                          f"({res['roof_over']:.1%} of the {prec} roof), last loss {res['last_loss']}", flush=True)
    return runs, roofs


def summarise(runs: dict, roofs: list[dict]) -> dict[str, Any]:
    med = statistics.median
    out: dict[str, Any] = {}
    for key, sides in runs.items():
        if key.endswith("/torchrec"):
            continue
        inter = key.split("/")[0]
        peer = runs.get(f"{inter}/torchrec", {}).get("peer", [])
        row: dict[str, Any] = {"flops_per_sample": sides["ctrkit"][0]["flops_per_sample"]}
        for side, rs in sides.items():
            row[f"{side}_samples_per_s"] = round(med(x["samples_per_s"] for x in rs), 1)
            row[f"{side}_achieved_over_roof"] = round(med(x["roof_over"] for x in rs), 4)
            row[f"{side}_last_loss"] = [x["last_loss"] for x in rs]
            if peer:  # per rep, then the median: each ratio compares runs of the same machine state
                row[f"{side}_ratio_to_torchrec"] = round(med(a["samples_per_s"] / b["samples_per_s"]
                                                             for a, b in zip(rs, peer)), 3)
        if peer:
            row["torchrec_samples_per_s"] = round(med(x["samples_per_s"] for x in peer), 1)
            row["torchrec_achieved_over_roof"] = round(med(
                _roof.achieved(x["samples_per_s"], row["flops_per_sample"], rf) for x, rf in zip(peer, roofs)), 4)
            row["torchrec_last_loss"] = [x["last_loss"] for x in peer]
        if "baseline" in sides:
            row["ratio_to_baseline"] = round(med(a["samples_per_s"] / b["samples_per_s"]
                                                 for a, b in zip(sides["ctrkit"], sides["baseline"])), 3)
        out[key] = row
    return out


def print_table(summary: dict[str, Any], roof: dict[str, Any]) -> None:
    print("\n" + _roof.cpu_line(roof) + " (medians over the reps)")
    for key, row in summary.items():
        prec = key.split("/")[1]
        peer = row.get("ctrkit_ratio_to_torchrec")
        print(_roof.roof_line(roof, row["flops_per_sample"], row["ctrkit_samples_per_s"], prec, peer,
                              label=f"{key} ctrkit"))
        if "baseline_samples_per_s" in row:
            print(f"{key} baseline {row['baseline_samples_per_s']:,.0f} samples/s ({row['baseline_achieved_over_roof']:.1%}"
                  f" of the roof); this checkout / baseline {row['ratio_to_baseline']:.3f}")
        if "torchrec_samples_per_s" in row:
            print(f"{key} torchrec (DMP + fbgemm fused, fp32) {row['torchrec_samples_per_s']:,.0f} samples/s "
                  f"({row['torchrec_achieved_over_roof']:.1%} of the fp32 roof)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--skip-peer", action="store_true")
    ap.add_argument("--interaction", nargs="+", default=["dot"], choices=("dot", "dcn"))
    ap.add_argument("--precision", nargs="+", default=["fp32"], choices=("fp32", "bf16"))
    ap.add_argument("--baseline", metavar="REF", help="also run ctrkit at this git ref (e.g. the pre-change commit)")
    ap.add_argument("--threads", type=int, default=THREADS, help="ctrkit's torch threads (the peer script runs "
                    f"{THREADS}: other values need --skip-peer); 1 gives steadier profiles on a busy machine")
    ap.add_argument("--rows", type=int, help="train on the first ROWS rows only (quicker, noisier)")
    ap.add_argument("--profile", action="store_true", help="after the reps: where a step's time goes (torch.profiler)")
    ap.add_argument("--no-keep-freed-memory", action="store_true",
                    help="leave glibc's allocator at its defaults (Trainer: train.keep_freed_memory=false)")
    ap.add_argument("--device", default="cpu", help="ctrkit's device (cpu, cuda); the peer runs on the CPU")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        args.interaction, args.precision = args.interaction[0], args.precision[0]
        return worker(args)
    if args.threads != THREADS and not args.skip_peer:
        raise SystemExit(f"--threads {args.threads}: the torchrec peer script runs {THREADS} threads; pass "
                         f"--skip-peer, or leave --threads at {THREADS}")
    ensure_peers_and_data(data_only=args.skip_peer)
    with tempfile.TemporaryDirectory(prefix="dlrm-throughput-") as tmp:
        data = subset(DATA, args.rows, Path(tmp))
        baseline = export_src(args.baseline, Path(tmp)) if args.baseline else None
        runs, roofs = measure(args, data, baseline)
        profiles = {}
        if args.profile:
            from _step_profile import format_table

            for inter in args.interaction:
                for prec in args.precision:
                    for side, src in (("baseline", baseline), ("ctrkit", REPO / "src")):
                        if src is not None:
                            p = run_worker(src, data, inter, prec, 0, args, profile=True)
                            profiles[f"{inter}/{prec}/{side}"] = p
                            print("\n" + format_table(p, f"{inter} {prec} {side}"), flush=True)
    roof = _roof.median_roof(roofs) if roofs else _roof.measure(args.threads)  # --reps 0: the profiles alone
    summary = summarise(runs, roofs)
    print_table(summary, roof)
    print(json.dumps({"workload": "200k rows (or --rows), 13 dense + 26 sparse, D=16, dense 512-256-16, over "
                      "512-256-1, B=4096", "threads": args.threads, "rows": args.rows or 200_000, "reps": args.reps,
                      "device": args.device, "baseline": args.baseline, "keep_freed_memory": not args.no_keep_freed_memory,
                      "load_average_end": [round(x, 2) for x in os.getloadavg()], "roof": roof, "runs": summary,
                      "profiles": profiles}))


if __name__ == "__main__":
    sys.exit(main())
