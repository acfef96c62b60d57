"""DeepCTR-Torch side of benchmarks/deepctr_compare.py; runs with the DeepCTR venv's python, not ctrkit's.

    ~/.cache/ctrkit-peers/venv-deepctr/bin/python benchmarks/_deepctr_peer.py --data DIR --model DeepFM \
        --seed 0 --epochs 4 --batch-size 256 --lr 1e-3 --embedding-lr 1e-3 --params '{"dnn_hidden_units": [256, 128]}'

Reads ``DIR/meta.json`` and ``DIR/{train,valid,test}.npz`` written by deepctr_compare.py from the ctrkit stores
(so the data is identical): dense columns (float32), single-valued sparse ids, multi-valued / sequence
features as 0-padded id matrices (0 is never a real id in a ctrkit store's jagged column, so DeepCTR's
``value != 0`` mask gives the same bags). Multi-valued features become VarLenSparseFeat with combiner
mean; a sequence sharing a table gets ``embedding_name`` of the shared feature.

Trains with the library's own ``model.fit`` (no validation: validation_split=0, no validation_data),
timed around ``fit`` only, with ``torch.optim.Adam`` (embedding tables at ``--embedding-lr``, the rest at
``--lr``) and DeepCTR's default regularisation (l2_reg_embedding / l2_reg_linear 1e-5 etc.), then writes
the test predictions (and the valid ones, ``pred_valid``, when ``DIR/valid.npz`` exists) to ``--out`` and prints one line ``PEER_RESULT {json}``.
"""

import argparse
import functools
import json
import os
import time

import numpy as np
import torch

MODELS = ("WDL", "DeepFM", "xDeepFM", "NFM", "AFM", "DCN", "DCNMix", "PNN", "AutoInt", "FiBiNET", "MLR")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--model", required=True, choices=MODELS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epochs", type=int, required=True)
    ap.add_argument("--batch-size", type=int, required=True)
    ap.add_argument("--lr", type=float, required=True)
    ap.add_argument("--embedding-lr", type=float, required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--params", default="{}", help="JSON keyword arguments for the model constructor")
    ap.add_argument("--out", required=True, help="npz file for the test predictions")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    np.random.seed(a.seed)

    import deepctr_torch
    import deepctr_torch.models as zoo
    from deepctr_torch.inputs import DenseFeat, SparseFeat, VarLenSparseFeat

    with open(f"{a.data}/meta.json") as f:
        meta = json.load(f)
    cols = []
    for name in meta["dense"]:
        cols.append(DenseFeat(name, 1))
    for f in meta["sparse"]:
        cols.append(SparseFeat(f["name"], vocabulary_size=f["vocab_size"], embedding_dim=meta["embedding_dim"]))
    # DeepCTR-Torch 0.3.0's xDeepFM / AutoInt / FiBiNET size their layers by the number of embedding
    # TABLES, not features, and crash when a sequence shares a table ("expected ... 64 channels, but got
    # 81"). For those three the sequence gets a table of its own here (one extra table on the peer's side).
    own_table = a.model in ("xDeepFM", "AutoInt", "FiBiNET")
    for f in meta["varlen"]:
        base = SparseFeat(f["name"], vocabulary_size=f["vocab_size"], embedding_dim=meta["embedding_dim"],
                          embedding_name=f["name"] if own_table else f["table"])
        cols.append(VarLenSparseFeat(base, maxlen=f["max_len"], combiner="mean"))

    def inputs(split):
        d = np.load(f"{a.data}/{split}.npz")
        x = {name: d["dense"][:, i] for i, name in enumerate(meta["dense"])}
        x.update({f["name"]: d[f["name"]] for f in meta["sparse"] + meta["varlen"]})
        return x, d["label"]

    x_train, y_train = inputs("train")
    x_test, _ = inputs("test")
    params = json.loads(a.params)
    common = {"task": "binary", "device": "cpu", "seed": a.seed}
    if a.model == "PNN":
        model = zoo.PNN(cols, **params, **common)
    elif a.model == "AFM":  # AFM's interaction part takes sparse features only; dense ones stay in the linear part
        model = zoo.AFM(cols, [c for c in cols if not isinstance(c, DenseFeat)], **params, **common)
    elif a.model == "MLR":
        # DeepCTR-Torch 0.3.0's MLR takes seed= but does not pass it on to BaseModel.__init__, which seeds
        # torch with its own default (1024): every --seed would build and shuffle identically (std 0 over
        # seeds). Hand BaseModel the seed, as every other model here does.
        from deepctr_torch.models.basemodel import BaseModel
        base_init = BaseModel.__init__
        BaseModel.__init__ = functools.partialmethod(base_init, seed=a.seed)
        try:
            model = zoo.MLR(cols, **params, **common)
        finally:
            BaseModel.__init__ = base_init
    else:
        model = getattr(zoo, a.model)(cols, cols, **params, **common)
    emb = [p for n, p in model.named_parameters() if "embedding_dict" in n]
    rest = [p for n, p in model.named_parameters() if "embedding_dict" not in n]
    opt = torch.optim.Adam([{"params": emb, "lr": a.embedding_lr}, {"params": rest, "lr": a.lr}])
    model.compile(opt, "binary_crossentropy", metrics=[])

    t0, c0 = time.perf_counter(), time.process_time()
    model.fit(x_train, y_train, batch_size=a.batch_size, epochs=a.epochs, verbose=0, shuffle=True)
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    preds = {"pred": model.predict(x_test, batch_size=4096).reshape(-1)}
    if os.path.exists(f"{a.data}/valid.npz"):  # scored for choosing defaults on valid, never on test
        preds["pred_valid"] = model.predict(inputs("valid")[0], batch_size=4096).reshape(-1)
    np.savez(a.out, **preds)
    print("PEER_RESULT " + json.dumps({
        "model": a.model, "seed": a.seed, "fit_seconds": seconds, "cpu_seconds": cpu_seconds, "version": deepctr_torch.__version__,
        "torch": torch.__version__, "threads": torch.get_num_threads(),
        "params": int(sum(p.numel() for p in model.parameters())),
    }), flush=True)


if __name__ == "__main__":
    main()
