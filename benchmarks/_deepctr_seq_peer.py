"""DeepCTR-Torch 0.3.0's DIN / DIEN on the arrays benchmarks/seq_export.py wrote; runs with the DeepCTR venv's python.

    ~/.cache/ctrkit-peers/venv-deepctr/bin/python benchmarks/_deepctr_seq_peer.py --data NPZ_DIR --model DIN \
        --seed 0 --epochs 2 --batch-size 256 --lr 1e-3 --embedding-dim 16 --threads 1 \
        --params '{"dnn_hidden_units": [200, 80], "att_hidden_size": [80, 40]}' --out pred.npz

Inputs, as DeepCTR-Torch's own examples/run_din.py and run_dien.py build them: a SparseFeat per single-valued
id (``embedding_name`` = its ctrkit table), a VarLenSparseFeat per history ``hist_<x>`` (and ``neg_hist_<x>``
for DIEN with ``use_negsampling``) with ``embedding_name`` = the table of ``<x>`` and ``length_name`` =
"hist_length", ``history_feature_list`` = meta's ``history_features`` (DeepCTR finds ``hist_<x>`` and
``neg_hist_<x>`` by those prefixes, the same names ctrkit uses). Session features are not given to DIN / DIEN.
DSIN: DeepCTR-Torch 0.3.0 has no DSIN (deepctr_torch/models holds din.py and dien.py only; DSIN exists only
in the TensorFlow DeepCTR), so ``--model DSIN`` stops with that message.

Objective: ``model.compile(torch.optim.Adam(model.parameters(), lr), "binary_crossentropy")``. DeepCTR sums
the BCE over the batch and adds its L2 term and DIEN's auxiliary loss (a batch *mean* times ``alpha``) to that
sum: against ctrkit's mean loss the aux weight is ``alpha / batch_size`` (pass ``alpha = w * batch_size`` for a
ctrkit aux weight w; Adam does not see the overall scale). Regularisation defaults set to 0 here (overridable
in --params): ``l2_reg_embedding`` (DIN and DIEN default 1e-6, on the whole embedding tables every step) and
``l2_reg_dnn`` (default 0 and stored but never applied by DIN / DIEN 0.3.0); ``l2_reg_linear`` is fixed at 0
by both models. Ids reach the model cast to float32 (DeepCTR packs every input into one float tensor), so
ids must be < 2**24; checked.

Trains one epoch per ``model.fit(epochs=1, validation_split=0, verbose=0, shuffle=True)`` call, timed around
the call only (it includes DeepCTR packing the inputs into one tensor, measured alone as ``pack_seconds``);
after each epoch predicts valid and test (not timed). Also the process's CPU seconds of each fit call. Writes ``--out`` (npz: ``valid`` [E, Nv], ``test``
[E, Nt] float32 probabilities, ``fit_seconds`` [E]) and prints one line ``PEER_RESULT {json}``.
"""

import argparse
import json
import time

import numpy as np
import torch

MODELS = ("DIN", "DIEN", "DSIN")
FLOAT32_EXACT = 1 << 24
ZEROED = {"l2_reg_embedding": 0.0, "l2_reg_dnn": 0.0}


def feature_columns(meta, model, dim, use_neg):
    """DeepCTR feature columns for ``model`` -> (columns, history_feature_list)."""
    from deepctr_torch.inputs import DenseFeat, SparseFeat, VarLenSparseFeat

    def width(entry):
        return dim or entry["embedding_dim"]

    cols = [DenseFeat(d["name"], d["dim"]) for d in meta["dense"]]
    cols += [SparseFeat(f["name"], vocabulary_size=f["vocab_size"], embedding_dim=width(f), embedding_name=f["table"])
             for f in meta["sparse"]]
    history = list(meta["history_features"])
    if not history:
        raise SystemExit(f"{model} needs hist_<x> sequences with a sparse target <x>; the export has none")
    families = ("hist", "neg_hist") if use_neg else ("hist",)
    if use_neg and not meta["neg_history"]:
        raise SystemExit("use_negsampling needs neg_hist_<x> for every hist_<x>: build the stores with --aux-negatives")
    other = [q["name"] for q in meta["sequences"] if q["family"] == "other"]
    if other:
        raise SystemExit(f"sequences {other} are not hist_/neg_hist_/sess_ features; the peer has no input for them")
    for q in meta["sequences"]:
        if q["family"] in families:
            base = SparseFeat(q["name"], vocabulary_size=q["vocab_size"], embedding_dim=width(q),
                              embedding_name=q["table"])
            cols.append(VarLenSparseFeat(base, maxlen=q["max_len"], length_name=q["length"]))
    return cols, history


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help="directory written by benchmarks/seq_export.py")
    ap.add_argument("--model", required=True, choices=MODELS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epochs", type=int, required=True)
    ap.add_argument("--batch-size", type=int, required=True)
    ap.add_argument("--lr", type=float, required=True)
    ap.add_argument("--embedding-dim", type=int, default=None, help="every table's width (default: the export's)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--params", default="{}", help="JSON keyword arguments for the DeepCTR model constructor")
    ap.add_argument("--predict-batch-size", type=int, default=4096)
    ap.add_argument("--out", required=True, help="npz file for the per-epoch valid / test predictions")
    a = ap.parse_args()
    if a.model == "DSIN":
        raise SystemExit("DeepCTR-Torch 0.3.0 has no DSIN (deepctr_torch/models: din.py, dien.py; DSIN is only in "
                         "the TensorFlow DeepCTR); compare DSIN within ctrkit only")
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    np.random.seed(a.seed)

    import deepctr_torch
    from deepctr_torch.inputs import get_feature_names
    from deepctr_torch.models import DIEN, DIN

    with open(f"{a.data}/meta.json") as f:
        meta = json.load(f)
    if meta["max_id"] >= FLOAT32_EXACT:
        raise SystemExit(f"id {meta['max_id']} >= 2**24: DeepCTR-Torch feeds ids as float32 and would merge them")
    params = {**ZEROED, **json.loads(a.params)}
    use_neg = a.model == "DIEN" and bool(params.get("use_negsampling", False))
    cols, history = feature_columns(meta, a.model, a.embedding_dim, use_neg)
    names = get_feature_names(cols)

    def inputs(split):
        d = np.load(f"{a.data}/{split}.npz")
        # ids as int32 (DeepCTR's SparseFeat dtype): the packed input tensor stays int32 instead of float64
        x = {n: d[n].astype(np.float32 if n in {e["name"] for e in meta["dense"]} else np.int32) for n in names}
        return x, d["label"].astype(np.float32)

    x_train, y_train = inputs("train")
    x_valid, _ = inputs("valid")
    x_test, _ = inputs("test")
    common = {"task": "binary", "device": "cpu", "seed": a.seed}
    model = (DIN if a.model == "DIN" else DIEN)(cols, history, **params, **common)
    model.compile(torch.optim.Adam(model.parameters(), lr=a.lr), "binary_crossentropy", metrics=[])

    t0 = time.perf_counter()
    np.concatenate([np.expand_dims(x_train[n], 1) if x_train[n].ndim == 1 else x_train[n] for n in names], -1)
    pack_seconds = time.perf_counter() - t0
    fit_seconds, cpu_seconds, valid, test = [], [], [], []
    for _ in range(a.epochs):
        t0, c0 = time.perf_counter(), time.process_time()
        model.fit(x_train, y_train, batch_size=a.batch_size, epochs=1, verbose=0, validation_split=0, shuffle=True)
        fit_seconds.append(time.perf_counter() - t0)
        cpu_seconds.append(time.process_time() - c0)
        valid.append(model.predict(x_valid, batch_size=a.predict_batch_size).reshape(-1))
        test.append(model.predict(x_test, batch_size=a.predict_batch_size).reshape(-1))
        if not (np.isfinite(valid[-1]).all() and np.isfinite(test[-1]).all()):
            raise SystemExit(f"{a.model} predicted NaN/inf after epoch {len(fit_seconds)}")
    np.savez(a.out, valid=np.stack(valid).astype(np.float32), test=np.stack(test).astype(np.float32),
             fit_seconds=np.array(fit_seconds))
    rows = len(y_train)
    print("PEER_RESULT " + json.dumps({
        "model": a.model, "seed": a.seed, "epochs": a.epochs, "train_rows": rows, "batch_size": a.batch_size,
        "lr": a.lr, "fit_seconds": fit_seconds, "cpu_seconds": cpu_seconds, "samples_per_s": [rows / s for s in fit_seconds],
        "mean_samples_per_s": rows * len(fit_seconds) / sum(fit_seconds), "pack_seconds": pack_seconds,
        "params": params, "history_features": history, "inputs": names,
        "aux_weight_vs_mean_loss": params.get("alpha", 1.0) / a.batch_size if use_neg else None,
        "version": deepctr_torch.__version__, "torch": torch.__version__, "threads": torch.get_num_threads(),
        "num_parameters": int(sum(p.numel() for p in model.parameters())),
    }), flush=True)


if __name__ == "__main__":
    main()
