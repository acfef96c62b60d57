"""Retrieval on real logs: most-popular, item-kNN and ctrkit's two_tower / youtube_dnn / sasrec by full ranking.

    python benchmarks/retrieval_compare.py --dataset beauty|ml100k [--models two_tower youtube_dnn sasrec]
        [--seeds 0 1 2] [--device cpu|cuda] [--workers 2] [--threads 1] [--epochs 40] [--no-ablation] [--out DIR]
        [--seq-max-len 50] [--seq-stride N]

Protocol (issue 10, point 5): every interaction is a positive; leave-last-out by time per user (the last item
-> test, the second-to-last -> valid, the rest -> train; S3-Rec's Beauty sequences are already in time order),
built by ``ctrkit preprocess behaviour --negatives none`` (MovieLens-100K with ``--example-age``), item
vocabulary from the train rows. Every test user's true item is ranked against ALL catalogue items (never a
sample), the user's training items (and, for test, the valid item) excluded; a cold true item (id 1) is a miss.
Metrics HR@10, HR@50, NDCG@10 (MRR too), mean ± std over the seeds; each learned run keeps the epoch with the
best valid NDCG@10 (best.pt), never chosen on test. ``sasrec_seq``: sasrec trained on sequence rows (one train
row per user sequence, the loss at every position; configs/<dataset>_retrieval_seq/sasrec.yaml), the same valid /
test rows. Each run reports its training CPU time per epoch (this process's, all threads, evaluation excluded).
Models, sizes and losses are those of
configs/<dataset>_retrieval/<model>.yaml (set before these runs, not tuned on test).

Baselines on the same rankings: most-popular (items by their training count) and item-kNN co-occurrence
(cosine of item co-occurrence over the users' training items; a user's score for j = Σ_{i in history} sim(i, j)).
Ablation: two_tower with and without the log-Q correction of the in-batch softmax.

Targets: every learned model beats both baselines on HR@50 on both datasets; on Beauty the best model reaches
HR@10 >= 0.0605 and NDCG@10 >= 0.0318 (SASRec's published full-ranking figures on this split). Prints a table
and ends with ONE JSON line ``RESULT {...}``.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("CTRKIT_SHARED_DATA", REPO.parent / "shared" / "data"))
S3REC = SHARED / "amazon_yelp_lastfm_sequences_s3rec"
MODELS = ("two_tower", "youtube_dnn", "sasrec", "sasrec_seq")
SEQUENCE_MODELS = ("sasrec_seq",)  # sasrec on sequence rows (--train-rows sequence): configs/<dataset>_retrieval_seq
# the sequence windows' stride per dataset, as a fraction of --seq-max-len (None: max_len, no overlap); MovieLens: a
# fifth, chosen on valid NDCG@10 over 3 seeds against a half, a quarter and none (docs/benchmarks.md; with the config's
# batch of 32 sequences and lr 3e-3, chosen after it); Beauty's users
# are short (6 training items on average), so its windows barely overlap at any stride
SEQ_STRIDE = {"ml100k": 5, "beauty": None}
METRICS = ["hr@10", "hr@50", "ndcg@10", "mrr"]
TARGET = {"hr@10": 0.0605, "ndcg@10": 0.0318}  # SASRec, full ranking, Beauty (S3-Rec split)


def build_stores(dataset: str, out: Path, train_rows: str = "prefix", max_len: int = 50,
                 stride: int | None = None) -> dict[str, str]:
    """The positive-only behaviour stores of ``dataset`` under ``out`` (reused when present); ``train_rows``:
    "sequence" writes train as one row per user sequence (valid / test: the same per-prefix rows, the same
    targets); ``max_len``: the history length kept (and a sequence row's window); ``stride``: the sequence
    windows' stride (None: ``max_len``, no overlap)."""
    from ctrkit.data.sources.behaviour import preprocess_behaviour

    if (out / "test" / "manifest.json").is_file():
        return {s: str(out / s) for s in ("train", "valid", "test")}
    if dataset == "beauty":
        kw: dict[str, Any] = {"format": "s3rec", "item_attributes": S3REC / "Beauty_item2attributes.json.gz"}
        src: Path = S3REC / "Beauty.txt.gz"
    else:
        sys.path.insert(0, str(REPO / "examples"))
        from make_movielens_log import make_movielens_log

        src = make_movielens_log(SHARED / "movielens_100k", out.parent / f"{out.name}_log.csv")
        # example age: YouTubeDNN's per-row feature; sequence rows have none (sasrec does not read it)
        kw = {"attr_cols": ["genre:cate"], "time_col": "time", "example_age": train_rows == "prefix"}
    paths = preprocess_behaviour(src, out, negatives="none", max_len=max_len, embedding_dim=64, overwrite=True,
                                 train_rows=train_rows, sequence_stride=stride, **kw)
    return {k: str(v) for k, v in paths.items()}


def _eval_batches(path: str, batch_size: int = 4096):
    from ctrkit.data.storage.loader import BatchLoader
    from ctrkit.data.storage.store import Store

    return BatchLoader(Store(path), batch_size, shuffle=False, prefetch=0)


def baselines(stores: dict[str, str]) -> dict[str, dict[str, dict[str, float]]]:
    """Most-popular and item-kNN co-occurrence, valid and test, full ranking with the same exclusions."""
    from ctrkit.data.storage.store import Store
    from ctrkit.retrieval.catalogue import (
        ItemCatalogue,
        SeenItems,
        exclusion_pairs,
        history_of,
        ranking_metrics,
        target_ranks,
    )

    train = Store(stores["train"])
    cat, seen = ItemCatalogue.from_store(train), SeenItems.from_store(train)
    hist = history_of(train.schema, cat.item_feature)
    N = len(cat)
    # item-item co-occurrence over the users' training items (each user once per item), cosine-normalised
    rows = cat.rows_of(torch.from_numpy(seen._item))
    ok = rows >= 0
    users = torch.from_numpy(seen._code)[ok]
    X = torch.sparse_coo_tensor(torch.stack([users, rows[ok]]), torch.ones(int(ok.sum())),
                                (len(seen.groups), N)).coalesce()
    co = torch.sparse.mm(X.t(), X).to_dense()  # (N, N)
    n = co.diagonal().clone().clamp_min(1)
    sim = co / (n.sqrt().unsqueeze(1) * n.sqrt().unsqueeze(0))
    sim.fill_diagonal_(0)
    pop = torch.as_tensor(cat.counts, dtype=torch.float32)
    out: dict[str, dict[str, dict[str, float]]] = {"most_popular": {}, "item_knn": {}}
    for split in ("valid", "test"):
        ranks: dict[str, list[np.ndarray]] = {"most_popular": [], "item_knn": []}
        for b in _eval_batches(stores[split]):
            r, c = exclusion_pairs(cat, seen, b, hist)  # the user's history: masked, and the kNN query
            target = cat.rows_of(b.sparse[cat.item_feature][0])
            ranks["most_popular"].append(target_ranks(pop.expand(len(b), N), target, (r, c)).numpy())
            H = torch.sparse_coo_tensor(torch.stack([r, c]), torch.ones(len(r)), (len(b), N)).coalesce()
            H = torch.sparse_coo_tensor(H.indices(), torch.ones_like(H.values()), H.shape)  # each item once
            ranks["item_knn"].append(target_ranks(torch.sparse.mm(H, sim), target, (r, c)).numpy())
        for name, parts in ranks.items():
            out[name][split] = ranking_metrics(np.concatenate(parts), METRICS)
    return out


class EpochCPU:
    """Trainer callback: this process's CPU time (all threads, ``time.process_time``) spent in each epoch's
    training steps, from the end of the previous epoch (its evaluation included there, not here) to the epoch's
    last step; the first epoch is timed from its first step's end, so its row count is one batch short."""

    def __init__(self) -> None:
        self.mark: float | None = None
        self.last = 0.0
        self.steps = 0
        self.per_epoch: list[float] = []

    def on_step(self, trainer: Any, step: int, loss: torch.Tensor) -> None:
        now = time.process_time()
        if self.mark is None:
            self.mark = now
        self.last, self.steps = now, self.steps + 1

    def on_eval(self, trainer: Any, metrics: dict[str, float]) -> None: ...

    def on_record(self, trainer: Any, record: dict[str, Any]) -> None: ...

    def on_epoch_end(self, trainer: Any, epoch: int) -> None:
        if self.mark is not None and epoch > 0:
            self.per_epoch.append(self.last - self.mark)
        self.mark = time.process_time()


def train_one(job: dict[str, Any]) -> dict[str, Any]:
    """One training run (in a worker process): the config's model on the stores -> best valid, test, seconds."""
    torch.set_num_threads(job["threads"])
    logging.basicConfig(level=logging.WARNING)
    from ctrkit.jobs.train import train_from_config
    from ctrkit.training.config import load_config

    seq = job["model"] in SEQUENCE_MODELS  # sasrec_seq: configs/<dataset>_retrieval_seq/sasrec.yaml
    cfg = load_config(REPO / "configs" / f"{job['dataset']}_retrieval{'_seq' if seq else ''}"
                      / f"{job['model'].removesuffix('_seq')}.yaml", [
        f"data.train={job['stores']['train']}", f"data.valid={job['stores']['valid']}",
        f"data.test={job['stores']['test']}", f"train.seed={job['seed']}", f"train.device={job['device']}",
        f"train.epochs={job['epochs']}", f"run.dir={job['out']}/runs", f"run.name={job['name']}-{job['seed']}",
        "train.progress=false", f"train.early_stopping.patience={job['patience']}", *job.get("overrides", []),
    ])
    t0 = time.perf_counter()
    cpu = EpochCPU()
    s = train_from_config(cfg, progress=False, callbacks=[cpu])
    return {"name": job["name"], "seed": job["seed"], "valid_ndcg@10": s["best"]["value"], "best_step": s["best"]["step"],
            "steps": s["steps"], "test": s["test"], "seconds": time.perf_counter() - t0,
            "train_seconds_per_epoch": s["seconds_per_epoch"],
            "cpu_seconds_per_epoch": float(np.median(cpu.per_epoch)) if cpu.per_epoch else None,
            "epochs": s["epochs"]}


def mean_std(values: list[float]) -> tuple[float, float]:
    return float(np.mean(values)), float(np.std(values))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", choices=("beauty", "ml100k"), required=True)
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--device", default="cpu")
    p.add_argument("--workers", type=int, default=2, help="training runs at a time (processes)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per run")
    p.add_argument("--epochs", type=int, default=40, help="epoch cap (early stopping on valid NDCG@10)")
    p.add_argument("--patience", type=int, default=5, help="evaluations without a better valid NDCG@10 before stopping")
    p.add_argument("--no-ablation", dest="ablation", action="store_false", help="skip the log-Q ablation")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="config overrides for every run (e.g. train.retrieval.loss=full), for selection on valid")
    p.add_argument("--seq-max-len", type=int, default=50,
                   help="history length of the sequence-row stores (sasrec_seq; the paper: 200 for MovieLens)")
    p.add_argument("--seq-stride", type=int, default=None,
                   help="stride of the sequence-row windows (sasrec_seq; --seq-max-len: no overlap; a smaller one "
                        "gives the early targets of long users more context for more rows); default: the "
                        "dataset's (MovieLens --seq-max-len / 5, Beauty --seq-max-len)")
    p.add_argument("--out", default="bench_out/retrieval")
    a = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    out = Path(a.out).resolve()
    t0 = time.perf_counter()
    stores = build_stores(a.dataset, out / f"{a.dataset}_store")
    if a.seq_stride is None and SEQ_STRIDE[a.dataset]:
        a.seq_stride = max(1, a.seq_max_len // SEQ_STRIDE[a.dataset])
    suffix = ("" if a.seq_max_len == 50 else f"_len{a.seq_max_len}") + (
        "" if a.seq_stride in (None, a.seq_max_len) else f"_stride{a.seq_stride}")
    seq_stores = (build_stores(a.dataset, out / f"{a.dataset}_seq_store{suffix}", "sequence", a.seq_max_len,
                               a.seq_stride)
                  if set(a.models) & set(SEQUENCE_MODELS) else None)
    base = baselines(stores)
    for name, r in base.items():
        print(f"{name}: test " + " ".join(f"{k} {v:.4f}" for k, v in r["test"].items()), flush=True)
    jobs = [{"dataset": "beauty" if a.dataset == "beauty" else "ml100k", "model": m, "name": m, "seed": s,
             "stores": seq_stores if m in SEQUENCE_MODELS else stores, "device": a.device, "threads": a.threads, "epochs": a.epochs, "out": str(out),
             "patience": a.patience, "overrides": list(a.set)}
            for m in a.models for s in a.seeds]
    if a.ablation:
        jobs += [{**j, "name": "two_tower (no log-Q)", "overrides": [*a.set, "train.retrieval.log_q=false"]}
                 for j in jobs if j["model"] == "two_tower"]
    runs = []
    # spawned workers: a forked child inherits the parent's initialised OpenMP / CUDA state, which can hang it
    with ProcessPoolExecutor(max_workers=a.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for fut in as_completed([pool.submit(train_one, j) for j in jobs]):
            r = fut.result()
            runs.append(r)
            print(f"run {r['name']} seed {r['seed']}: valid ndcg@10 {r['valid_ndcg@10']:.4f} (step {r['best_step']} of "
                  f"{r['steps']}), test " + " ".join(f"{k} {v:.4f}" for k, v in r["test"].items())
                  + f", {r['seconds']:.0f}s, train cpu {r['cpu_seconds_per_epoch'] or float('nan'):.1f}s/epoch", flush=True)
    table: dict[str, dict[str, Any]] = {}
    for name, r in base.items():
        table[name] = {m: (r["test"][m], 0.0) for m in METRICS} | {"valid_ndcg@10": r["valid"]["ndcg@10"]}
    for name in dict.fromkeys(j["name"] for j in jobs):
        rs = [r for r in runs if r["name"] == name]
        table[name] = {m: mean_std([r["test"][m] for r in rs]) for m in METRICS}
        table[name]["valid_ndcg@10"] = float(np.mean([r["valid_ndcg@10"] for r in rs]))
        table[name]["seconds"] = float(np.mean([r["seconds"] for r in rs]))
        cpu = [r["cpu_seconds_per_epoch"] for r in rs if r["cpu_seconds_per_epoch"] is not None]
        table[name]["cpu_s_per_epoch"] = float(np.mean(cpu)) if cpu else float("nan")
    cap = torch.backends.cpu.get_cpu_capability()
    dev = torch.cuda.get_device_name() if a.device.startswith("cuda") else f"cpu ({cap}, {a.threads} thread/run)"
    print(f"\n{a.dataset}: full ranking over all items, test split, mean ± std over seeds {a.seeds}; {dev}")
    print(f"{'model':<24}" + "".join(f"{m:>18}" for m in METRICS) + f"{'valid ndcg@10':>15}{'s/run':>8}"
          f"{'train cpu s/epoch':>19}")
    for name, row in table.items():
        print(f"{name:<24}" + "".join(f"{row[m][0]:>11.4f}±{row[m][1]:.4f}" for m in METRICS)
              + f"{row['valid_ndcg@10']:>15.4f}{row.get('seconds', 0):>8.0f}{row.get('cpu_s_per_epoch', 0):>19.1f}")
    learned = [n for n in table if n not in base and "no log-Q" not in n]
    checks = {f"{n} hr@50 > baselines": table[n]["hr@50"][0] > max(table[b]["hr@50"][0] for b in base)
              for n in learned}
    if a.dataset == "beauty" and learned:
        best = max(learned, key=lambda n: table[n]["valid_ndcg@10"])  # the best model chosen on valid
        checks.update({f"{best} {m} >= {v}": table[best][m][0] >= v for m, v in TARGET.items()})
    for k, v in checks.items():
        print(f"  {'PASS' if v else 'FAIL'}  {k}")
    result = {"dataset": a.dataset, "device": dev, "cpu_capability": cap, "seeds": a.seeds,
              "table": {n: {m: (list(v) if isinstance(v, tuple) else v) for m, v in row.items()}
                        for n, row in table.items()},
              "runs": runs, "checks": checks, "seconds": time.perf_counter() - t0}
    (out / f"{a.dataset}_result.json").write_text(json.dumps(result, indent=1))
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
