"""Stores on disk, above :mod:`ctrkit.data.pipeline`: memory-mapped columns, the batch loader, the
on-disk shuffle, the fitted pipeline of a store and the store / checkpoint agreement check.
"""
