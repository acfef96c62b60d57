"""Criteo 1TB with MLPerf DLRM-DCNv2 (configs/criteo1tb/dlrm.yaml) planned on paper from rates measured here.

Computed (no measurement): embedding-table memory per rank in fp32 / fp16 / bf16 with the optimiser state (Adagrad:
one value per element; row-wise Adagrad: one per row), tables placed whole on ranks largest first (table-wise
sharding, what a planner does before it splits rows), from the Criteo 1TB cardinalities capped at 40M; and the
multi-hot lookup tables every process builds (n_i x m_i int32).

Measured (on synthetic Criteo days, ``--rows-per-day`` x ``--days``): rows/s of (1) the preprocessing run that fits
the vocabularies over all days (one process), (2) a per-day run with ``--vocab-from``, (3) the day-streamed loader
with MLPerf's multi-hot stage, (4) training steps of the full-width model (embedding 128, DCN rank 512, top 1024-...;
tables of the synthetic store, at most ``VOCAB_CAP`` rows: this changes memory, not the arithmetic per row) at
``--batch-size``,
Adagrad, on ``--device``. Then the wall time of the real log (4,373,472,329 rows; 4,195,197,692 in day_0 .. day_22)
on 1 and N machines, labelled projection: linear in rows, linear in machines, no communication cost counted.
Prints a table and one JSON line.

    python benchmarks/criteo1tb_projection.py [--days 4] [--rows-per-day 250000] [--device cpu] [--machines 8]
        [--batch-size 2048] [--steps 5]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from ctrkit.data.sources.criteo import preprocess_criteo
from ctrkit.data.sources.synthetic import write_criteo_tsv
from ctrkit.data.storage.days import DayStreamLoader
from ctrkit.data.storage.store import Store
from ctrkit.jobs.common import training_pipeline
from ctrkit.models.registry import create_model
from ctrkit.training.config import load_config
from ctrkit.training.optim import build_optimizers
from ctrkit.training.tasks import ranking_task

REPO = Path(__file__).resolve().parents[1]
# MLPerf Training DLRM-DCNv2 / torchrec's DLRM example, --num_embeddings_per_feature: the Criteo 1TB cardinalities of
# C1..C26 after MLPerf's `% 40000000` (the tables of 40,000,000 rows are the capped ones)
CARDINALITIES = [40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10, 2209, 11938,
                 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36]
ROWS_ALL, ROWS_TRAIN = 4_373_472_329, 4_195_197_692  # day_0 .. day_23; day_0 .. day_22 (torchrec's constant)
DIM, GB = 128, 1e9
VOCAB_CAP = 40_000  # the synthetic days' cap (40M x 1e-3)


def table_memory(ranks: int) -> dict[str, float]:
    """GB of embedding tables + optimiser state on the fullest rank, tables placed whole, largest first."""
    load = [[0, 0] for _ in range(ranks)]  # (rows, tables) per rank
    for n in sorted(CARDINALITIES, reverse=True):
        r = min(range(ranks), key=lambda i: load[i][0])
        load[r][0] += n
        load[r][1] += 1
    rows = max(x[0] for x in load)
    out = {}
    for dtype, size in (("fp32", 4), ("fp16", 2), ("bf16", 2)):
        out[f"{dtype}_tables"] = rows * DIM * size / GB
        out[f"{dtype}_adagrad"] = rows * DIM * (size + 4) / GB  # state kept in fp32
        out[f"{dtype}_rowwise_adagrad"] = rows * (DIM * size + 4) / GB
    return out


def multi_hot_tables_gb(sizes: list[int]) -> float:
    return sum(n * m for n, m in zip(CARDINALITIES, sizes)) * 4 / GB


def timed(fn) -> tuple[float, object]:
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def measure_preprocess(tmp: Path, days: int, rows: int) -> tuple[dict[str, float], dict, list[Path]]:
    raw = [write_criteo_tsv(tmp / "raw" / f"day_{k}", rows, seed=k, scale=0.01) for k in range(days)]
    s_fit, full = timed(lambda: preprocess_criteo(raw, tmp / "full", max_vocab=VOCAB_CAP, max_vocab_mode="hash",
                                                  valid_from_test=True, progress=False))
    s_day, paths = 0.0, []
    for k in range(days - 1):
        s, out = timed(lambda k=k: preprocess_criteo(raw[k], tmp / "days" / f"day_{k}", split="1,0,0",
                                                     vocab_from=full["train"], progress=False))
        s_day += s
        paths.append(out["train"])
    return {"preprocess_fit_rows_s": days * rows / s_fit, "preprocess_day_rows_s": (days - 1) * rows / s_day}, \
        full, paths


def measure_loader(cfg, paths: list[Path], batch: int) -> float:
    pipe = training_pipeline(Store(paths[0]), cfg)
    loader = DayStreamLoader(paths, batch, shuffle=True, prefetch=2, pipeline=pipe)
    s, n = timed(lambda: sum(len(b) for b in loader))
    return n / s


def measure_training(cfg, store: Path, batch: int, steps: int, device: str) -> float:
    """Rows/s of forward + backward + Adagrad steps of the full-width model (tables of the measured store)."""
    model = create_model("dlrm", Store(store).schema, **cfg.model.params).to(device)
    opt = build_optimizers(model, cfg.train)
    task = ranking_task(cfg.train).bind(model)
    loader = DayStreamLoader([store], batch, shuffle=True, prefetch=2, pipeline=training_pipeline(Store(store), cfg))
    batches = [b.to(device) for _, b in zip(range(3), loader)]
    model.train()

    def run(k: int) -> None:
        for i in range(k):
            opt.zero_grad()
            loss, _ = task.loss(model, batches[i % len(batches)])
            loss.backward()
            opt.step()
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    run(2)  # warm-up
    s, _ = timed(lambda: run(steps))
    return steps * batch / s


def projection(rates: dict[str, float], machines: int) -> dict[str, float]:
    """Hours, labelled projection: the fit run is one process; the per-day runs spread over machines (independent
    days); one training epoch over ROWS_TRAIN at the measured rate per process x machines."""
    fit_h = ROWS_ALL / rates["preprocess_fit_rows_s"] / 3600
    days_h = ROWS_TRAIN / rates["preprocess_day_rows_s"] / 3600
    train_h = ROWS_TRAIN / rates["train_rows_s"] / 3600
    return {"preprocess_h_1": fit_h + days_h, f"preprocess_h_{machines}": fit_h + days_h / min(machines, 23),
            "epoch_h_1": train_h, f"epoch_h_{machines}": train_h / machines,
            "loader_h_per_process": ROWS_TRAIN / rates["loader_rows_s"] / 3600}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--days", type=int, default=4)
    p.add_argument("--rows-per-day", type=int, default=250_000)
    p.add_argument("--batch-size", type=int, default=2048, help="rows per training step measured (one process)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--device", default="cpu")
    p.add_argument("--machines", type=int, default=8)
    args = p.parse_args()
    cfg = load_config(REPO / "configs" / "criteo1tb" / "dlrm.yaml")
    with tempfile.TemporaryDirectory() as tmp:
        rates, _, paths = measure_preprocess(Path(tmp), args.days, args.rows_per_day)
        rates["loader_rows_s"] = measure_loader(cfg, paths, 8192)
        rates["train_rows_s"] = measure_training(cfg, paths[0], args.batch_size, args.steps, args.device)
    out = {"bench": "criteo1tb_projection", "device": args.device, "threads": torch.get_num_threads(),
           "batch_size": args.batch_size, "measured_rows_s": {k: round(v) for k, v in rates.items()},
           "projection_hours": {k: round(v, 2) for k, v in projection(rates, args.machines).items()},
           "table_gb_per_rank": {n: {k: round(v, 1) for k, v in table_memory(n).items()} for n in (1, 8, 16)},
           "multi_hot_tables_gb_per_process": round(multi_hot_tables_gb(cfg.data.multi_hot_size), 1)}
    for k, v in out["measured_rows_s"].items():
        print(f"{k:28s} {v:>12,} rows/s (measured)")
    for k, v in out["projection_hours"].items():
        print(f"{k:28s} {v:>12,.2f} h (projection)")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
