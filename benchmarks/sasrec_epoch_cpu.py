"""Training CPU time per epoch of sasrec on a behaviour store, per-prefix or sequence rows, from a few steps.

    PYTHONPATH=src python benchmarks/sasrec_epoch_cpu.py STORE_DIR [--batch 256] [--positions recency|absolute|none]
        [--steps 40] [--softmax-only] [--ema-decay D]

Runs ``--steps`` training steps (RetrievalTask full-softmax loss, backward, Adam on dense weights and the Trainer's lazy
Adam (torch's SparseAdam in a ctrkit without it) on the tables, one thread) on shuffled batches of STORE_DIR/train and prints this process's CPU time per step and
scaled to the epoch's steps. A store of sequence rows trains per position. ``--positions none`` passes no
``positions`` option (a ctrkit from before it, e.g. main, for the "before" figure: ``PYTHONPATH=/path/to/main/src``).
``--softmax-only``: the full softmax's forward + backward alone, with the store's targets per step and catalogue
size (the floor both row forms share). ``--ema-decay``: keep the weights' moving average as ``train.ema_decay`` does
(the Trainer's :class:`~ctrkit.training.averaging.WeightAverage`, its cost counted). The stores: ``benchmarks/retrieval_compare.py`` builds them.
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("store")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--positions", default="none", choices=("none", "recency", "absolute"))
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--softmax-only", action="store_true")
    p.add_argument("--ema-decay", type=float, default=None)
    a = p.parse_args()
    torch.set_num_threads(1)
    from ctrkit.data.storage.loader import BatchLoader
    from ctrkit.data.storage.store import Store
    from ctrkit.models.registry import create_model
    from ctrkit.retrieval.catalogue import ItemCatalogue
    from ctrkit.retrieval.losses import full_softmax_loss
    from ctrkit.training.tasks import RetrievalTask
    try:  # the Trainer's table optimizer (takes the dense gradients small tables now get), else torch's
        from ctrkit.training.optim import LazyAdam as TableAdam
    except ImportError:  # a ctrkit from before it
        from torch.optim import SparseAdam as TableAdam
    try:
        from ctrkit.retrieval.catalogue import sequence_window
    except ImportError:  # a ctrkit without sequence rows
        def sequence_window(store: Store) -> None:
            return None

    store = Store(f"{a.store}/train")
    cat, window = ItemCatalogue.from_store(store), sequence_window(store)
    loader = BatchLoader(store, a.batch, shuffle=True, prefetch=0)
    steps = min(a.steps, len(loader))
    if a.softmax_only:
        targets = int(cat.counts.sum()) // len(loader)  # per step
        v = torch.randn(len(cat), 64, requires_grad=True)
        t0 = time.process_time()
        for _ in range(steps):
            q = torch.randn(targets, 64, requires_grad=True)
            full_softmax_loss(q, v, torch.randint(0, len(cat), (targets,))).backward()
    else:
        torch.manual_seed(0)
        model = create_model("sasrec", store.schema, num_layers=2, num_heads=1, att_dropout=0.3,
                             **({} if a.positions == "none" else {"positions": a.positions}))
        task = RetrievalTask(cat, loss="full", **({"per_position": True, "window": window} if window else {}))
        task.bind(model)
        tables = {id(t) for t in model.embedding_parameters()}
        opts = [torch.optim.Adam([t for t in model.parameters() if id(t) not in tables], lr=1e-3),
                TableAdam([t for t in model.parameters() if id(t) in tables], lr=1e-3)]
        average = None
        if a.ema_decay is not None:
            from ctrkit.training.averaging import WeightAverage
            average = WeightAverage(model, a.ema_decay, [t for t in model.parameters() if id(t) in tables])
        model.train()
        batches = iter(loader)
        t0 = time.process_time()
        for _ in range(steps):
            loss, _ = task.loss(model, next(batches))
            for o in opts:
                o.zero_grad()
            loss.backward()
            if average is not None:
                average.before_step()
            for o in opts:
                o.step()
            if average is not None:
                average.after_step()
    dt = time.process_time() - t0
    form = f"sequence rows {window}" if window else "per-prefix rows"
    print(f"{a.store} ({form}, batch {a.batch}{', softmax only' if a.softmax_only else ''}{f', ema {a.ema_decay}' if a.ema_decay else ''}): {steps} steps "
          f"{dt / steps * 1000:.1f} ms CPU each -> {dt / steps * len(loader):.1f} s per epoch ({len(loader)} steps)")


if __name__ == "__main__":
    main()
