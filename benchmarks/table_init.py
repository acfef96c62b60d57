"""Start-up cost of the tables' block-wise initial values (nn/table_init.py) on one large table, against the default
initialisation they replace: torch's ``uniform_`` of the whole table from the global RNG (what torchrec's default
``init_fn`` does).

Times, each the best of ``--repeat`` runs, with ``--threads`` torch threads:

- ``torch uniform_ (whole)``: ``w.uniform_(-b, b)`` of the allocated table;
- ``TableInit (whole)``: the table filled block by block (what one process, or the rank of a table_wise shard, does);
- ``TableInit (half the rows)``: a row-wise shard of 2 ranks (only the blocks it overlaps are generated);
- ``TableInit (half the columns)``: a column-wise shard of 2 ranks (every block generated, half of it kept).

    python benchmarks/table_init.py [--rows 4000000] [--dim 64] [--threads 1] [--repeat 2]

Prints a table and ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

import torch

from ctrkit.nn.table_init import TableInit


def best_of(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=4_000_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows, dim = args.rows, args.dim
    init = TableInit(0, "big", rows, dim)
    bound = rows ** -0.5
    whole, half_rows, half_cols = torch.empty(rows, dim), torch.empty(rows // 2, dim), torch.empty(rows, dim // 2)
    cases = {
        "torch uniform_ (whole)": lambda: whole.uniform_(-bound, bound),
        "TableInit (whole)": lambda: init.fill(whole),
        "TableInit (half the rows)": lambda: init.fill(half_rows, rows - rows // 2, 0),
        "TableInit (half the columns)": lambda: init.fill(half_cols, 0, dim - dim // 2),
    }
    out = {name: best_of(fn, args.repeat) for name, fn in cases.items()}
    gib = rows * dim * 4 / 2**30
    print(f"table {rows:,} x {dim} ({gib:.2f} GiB), {args.threads} thread(s), best of {args.repeat}")
    for name, s in out.items():
        print(f"  {name:<30} {s:7.2f} s  {rows * dim / s / 1e6:8.1f} M values/s of the whole table")
    print(json.dumps({"rows": rows, "dim": dim, "threads": args.threads, "seconds": out}))


if __name__ == "__main__":
    main()
