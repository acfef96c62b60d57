"""Retrieval core, below the models: item catalogues, seen-item exclusion and ranking metrics, sampled / in-batch
losses. The faiss index is :mod:`ctrkit.serving.index` and the recall job :mod:`ctrkit.jobs.recall`."""
