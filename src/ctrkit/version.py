"""The ctrkit release, on the lowest floor so that writers of checkpoints, exports and run summaries can
record it without importing the package's public API (:mod:`ctrkit`)."""

__version__ = "0.1.0"
