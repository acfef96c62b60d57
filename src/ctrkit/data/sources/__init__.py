"""Readers of raw inputs, above :mod:`ctrkit.data.pipeline` and :mod:`ctrkit.data.storage`: Criteo TSV,
tables, behaviour logs, synthetic data, raw rows for predict, and the preprocess front-ends.
"""
