"""Serving: score raw rows with a checkpoint (:mod:`ctrkit.serving.predictor`, :mod:`ctrkit.serving.server`) and
export a checkpoint's model to TorchScript / ONNX for runtimes without ctrkit (:mod:`ctrkit.serving.export`)."""
