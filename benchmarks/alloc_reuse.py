"""What ctrkit.memory.keep_freed_memory buys: big-tensor allocation and a CIN training step.

    python benchmarks/alloc_reuse.py [--mb 100] [--batch 256] [--iters 10]

Each case runs twice in a fresh subprocess (the allocator setting is process-wide and one-way): with
glibc's defaults, then after ``keep_freed_memory()``. Cases: four ``--mb`` float32 blocks allocated and
filled then freed (what a step does with its activations), and a CIN forward + backward at xDeepFM's
Criteo size (26 fields, D = 16, layers (128, 128), split_half) through the plain pooled-maps path.
Prints medians in ms and ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nn_micro import bench


def child(reuse: bool, mb: int, batch: int, iters: int) -> dict[str, float]:
    import torch

    from ctrkit.memory import keep_freed_memory
    from ctrkit.nn.cin import CIN

    torch.set_num_threads(1)
    if reuse:
        keep_freed_memory()

    def blocks() -> None:
        xs = [torch.empty(mb << 18).fill_(1.0) for _ in range(4)]
        del xs

    cin = CIN(26, 16, layer_sizes=(128, 128), split_half=True)
    emb = torch.randn(batch, 26, 16, requires_grad=True)

    def cin_step() -> None:
        cin(emb).sum().backward()

    return {name: bench(fn, iters, warmup=1)[0] for name, fn in (("blocks_ms", blocks), ("cin_step_ms", cin_step))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=100)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--child", choices=["default", "reuse"], help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child == "reuse", a.mb, a.batch, a.iters)))
        return
    res: dict[str, dict[str, float]] = {}
    for mode in ("default", "reuse"):
        cmd = [sys.executable, __file__, "--child", mode, "--mb", str(a.mb), "--batch", str(a.batch),
               "--iters", str(a.iters)]
        res[mode] = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1])
    for key in res["default"]:
        d, r = res["default"][key], res["reuse"][key]
        print(f"{key:<12} glibc default {d:8.2f}  keep_freed_memory {r:8.2f}  -> {d / r:.2f}x")
    print(json.dumps({"mb": a.mb, "batch": a.batch, **{f"{m}_{k}": v for m, r in res.items() for k, v in r.items()},
                      **{f"speedup_{k}": res["default"][k] / res["reuse"][k] for k in res["default"]}}))


if __name__ == "__main__":
    main()
