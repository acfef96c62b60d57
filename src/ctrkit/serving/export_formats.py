"""The two formats of :mod:`ctrkit.serving.export`: an exported program written as TorchScript or ONNX, and
read back as a ``run(dense, values, lengths) -> probabilities`` function.

TorchScript is the program's graph of aten ops, scripted (:func:`to_torchscript`); ONNX is the program converted by
``torch.onnx.export(dynamo=True)``. Both compute one graph (for the CPU; torch >= 2.10 deprecates TorchScript,
which libtorch and ``torch.jit.load`` still run).
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ctrkit.errors import ExportError
from ctrkit.models.scoring import scoring

INPUT_NAMES = ("dense", "values", "lengths")  # the program's inputs, in order (export.json's "inputs")
OUTPUT_NAME = "probability"
ONNX_SINGLE_FILE_BYTES = 1 << 30  # weights above this go to model.onnx.data

_DROPPED = {torch.ops.aten._assert_scalar.default, torch.ops.aten.sym_constrain_range_for_size.default}
_RENAMED = {torch.ops.aten.sym_size.int: torch.ops.aten.size, torch.ops.aten.sym_numel.default: torch.ops.aten.numel}


def to_torchscript(program: torch.export.ExportedProgram) -> torch.jit.ScriptModule:
    """The program's graph as TorchScript: its aten ops called by packet (``aten.add`` for ``aten.add.Tensor``,
    TorchScript picks the overload), symbolic sizes read with ``aten.size``, devices as strings; the export's input
    guards and runtime asserts dropped (TorchScript cannot hold them). The sizes stay symbolic: B and nnz are read
    from the inputs at every call."""
    gm = program.module()
    graph = gm.graph
    graph._codegen = torch.fx.graph.CodeGen()  # plain positional inputs and outputs, not pytrees
    for node in list(graph.nodes):
        input_guards = node.op == "call_module" and node.target == "_guards_fn"
        runtime_assert = node.op == "call_function" and node.target in _DROPPED and not node.users
        if input_guards or runtime_assert:
            graph.erase_node(node)
        elif node.op == "call_function":
            if node.target in _RENAMED:
                node.target = _RENAMED[node.target]
            elif isinstance(node.target, torch._ops.OpOverload):
                node.target = node.target.overloadpacket
            node.args, node.kwargs = torch.fx.node.map_aggregate(
                (node.args, node.kwargs), lambda a: str(a) if isinstance(a, torch.device) else a)
    (out,) = [n for n in graph.nodes if n.op == "output"]
    out.args = (out.args[0][0],)  # the one output tensor, not a 1-tuple
    graph.lint()
    plain = torch.fx.GraphModule(gm, graph)  # without the export's hooks
    for p in plain.parameters():
        p.requires_grad_(False)
    with _no_torchscript_deprecation():
        # a warning about GraphModule's own attributes, which the program does not read
        warnings.filterwarnings("ignore", message="The TorchScript type system doesn't support instance-level")
        return torch.jit.script(plain)


@contextlib.contextmanager
def _no_torchscript_deprecation() -> Iterator[None]:
    """torch >= 2.10 deprecates torch.jit; the format was asked for by name, so the warning is not repeated."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated", category=DeprecationWarning)
        yield


def write_program(program: torch.export.ExportedProgram, fmt: str, path: Path) -> None:
    """The program as ``fmt`` at ``path`` (model.pt: torch.jit.save; model.onnx: the dynamo exporter's ONNX)."""
    if fmt == "torchscript":
        script = to_torchscript(program)
        with _no_torchscript_deprecation():
            torch.jit.save(script, str(path))
        return
    _onnxruntime()  # the runtime that checks the file, before the conversion
    # the converters' per-rewrite INFO lines, warnings about empty attributes and uninstalled torchvision
    with _quiet("onnx_ir", "onnxscript", "torch.onnx"), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        onnx_program = torch.onnx.export(program, (), dynamo=True, input_names=list(INPUT_NAMES),
                                         output_names=[OUTPUT_NAME], verbose=False)
    # one file, unless the weights pass protobuf's 2 GB limit (then model.onnx.data beside it)
    size = sum(t.numel() * t.element_size() for t in program.state_dict.values())
    onnx_program.save(str(path), external_data=size > ONNX_SINGLE_FILE_BYTES)


@contextlib.contextmanager
def _quiet(*loggers: str) -> Iterator[None]:
    """Only errors from ``loggers`` while inside."""
    saved = {name: logging.getLogger(name).level for name in loggers}
    for name in loggers:
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        yield
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


def _onnxruntime() -> Any:
    try:
        import onnxruntime
    except ImportError:
        raise ExportError("ONNX export needs onnx, onnxscript and onnxruntime: pip install 'ctrkit[export]'") from None
    return onnxruntime


Runner = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


def program_runner(fmt: str, path: Path) -> Runner:
    """``run(dense, values, lengths)`` -> probabilities (B,) float32 of the program file ``path``."""
    if fmt == "torchscript":
        with _no_torchscript_deprecation():
            program = torch.jit.load(str(path), map_location="cpu").eval()

        def run_script(dense: np.ndarray, values: np.ndarray, lengths: np.ndarray) -> np.ndarray:
            with scoring(program):
                return program(torch.from_numpy(dense), torch.from_numpy(values), torch.from_numpy(lengths)).numpy()

        return run_script
    session = _onnxruntime().InferenceSession(str(path), providers=["CPUExecutionProvider"])
    used = {i.name for i in session.get_inputs()}  # an input the graph does not read may be pruned

    def run_onnx(dense: np.ndarray, values: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        feed = {k: v for k, v in zip(INPUT_NAMES, (dense, values, lengths)) if k in used}
        return session.run(None, feed)[0]

    return run_onnx
