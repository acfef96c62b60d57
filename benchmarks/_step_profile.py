"""Where one training step's time goes, per part of the model: torch.profiler, grouped by named scopes.

The forward of each part runs inside a ``torch.profiler.record_function`` scope (forward hooks on the named
sub-modules), and so do the loss, ``zero_grad``, ``backward`` and the optimizer step. Backward ops are charged to
the part whose forward op made their autograd node: the profiler's ``autograd::engine::evaluate_function: XBackward0``
events carry the ``sequence_nr`` of the forward op that recorded the node, and that forward op sits inside one
part's scope. What is left of the step's wall time is framework overhead: Python, the autograd engine between nodes,
the loop, and the profiler's own cost (small against 4096-row batches, but not nothing).

    parts = {"embedding": model.sparse_arch, "bottom MLP": model.dense_arch, ...}
    table = profile_steps(step_fn, batches, parts, optimizer_scope=True)
    print(format_table(table))

``step_fn(batch, scope)`` runs one training step and wraps its phases in ``scope("loss")``, ``scope("zero_grad")``,
``scope("backward")`` and ``scope("optimizer")``.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

PREFIX = "part::"
BACKWARD_EVENT = "autograd::engine::evaluate_function: "


def _hook_parts(parts: Mapping[str, nn.Module]) -> list[Any]:
    """Forward pre/post hooks that open and close a record_function scope per named part."""
    handles = []
    for name, module in parts.items():
        if module is None:
            continue
        open_scopes: list[Any] = []

        def pre(_m: nn.Module, _args: Any, *, name: str = name, stack: list[Any] = open_scopes) -> None:
            rf = record_function(PREFIX + name)
            rf.__enter__()
            stack.append(rf)

        def post(_m: nn.Module, _args: Any, _out: Any, *, stack: list[Any] = open_scopes) -> None:
            stack.pop().__exit__(None, None, None)

        handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
    return handles


@contextmanager
def scope(name: str) -> Iterator[None]:
    """A named phase of the step (loss, zero_grad, backward, optimizer)."""
    with record_function(PREFIX + name):
        yield


def _part_of(event: Any) -> str | None:
    e = event
    while e is not None:
        if e.name.startswith(PREFIX):
            return e.name[len(PREFIX):]
        e = e.cpu_parent
    return None


def categorise(events: Sequence[Any], parts: Sequence[str]) -> dict[str, float]:
    """Microseconds per ``<part> fwd`` / ``<part> bwd`` / phase from the profiler's function events."""
    forward_part: dict[int, str] = {}  # sequence_nr of a forward op -> its part
    out: dict[str, float] = defaultdict(float)
    for e in events:
        if e.name.startswith(PREFIX):
            name = e.name[len(PREFIX):]
            parent = _part_of(e.cpu_parent) if e.cpu_parent is not None else None
            if name in parts and parent in ("loss", None):
                out[f"{name} fwd"] += e.cpu_time_total
            elif name not in parts and parent is None:
                out[name] += e.cpu_time_total
            continue
        if e.sequence_nr is not None and e.sequence_nr >= 0 and not e.name.startswith(BACKWARD_EVENT):
            part = _part_of(e)
            if part in parts:
                forward_part.setdefault(e.sequence_nr, part)
    for e in events:
        if e.name.startswith(BACKWARD_EVENT) and _part_of(e) == "backward":
            parent = e.cpu_parent
            if parent is not None and parent.name.startswith(BACKWARD_EVENT):
                continue  # nested inside another node's evaluation: counted there
            part = forward_part.get(e.sequence_nr, "other")
            out[f"{part} bwd"] += e.cpu_time_total
    return dict(out)


def profile_steps(step_fn: Callable[[Any, Callable[[str], AbstractContextManager[None]]], None],
                  batches: Sequence[Any], parts: Mapping[str, nn.Module], warmup: int = 3) -> dict[str, Any]:
    """Run ``step_fn`` over ``batches`` (the first ``warmup`` unprofiled) -> ms per step by part and phase."""
    for b in batches[:warmup]:
        step_fn(b, scope)
    measured = batches[warmup:]
    if not measured:
        raise ValueError(f"profile_steps needs more than warmup={warmup} batches, got {len(batches)}")
    handles = _hook_parts(parts)
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            t0 = time.perf_counter()
            for b in measured:
                step_fn(b, scope)
            wall = time.perf_counter() - t0
    finally:
        for h in handles:
            h.remove()
    ms = {k: v / 1e3 / len(measured) for k, v in categorise(prof.events(), list(parts)).items()}
    ms_step = wall * 1e3 / len(measured)
    phases = ("loss", "zero_grad", "backward", "optimizer")
    total = {k: ms.pop(k, 0.0) for k in phases}  # whole phases; the parts' shares are split out below
    fwd = sum(v for k, v in ms.items() if k.endswith(" fwd"))
    bwd = sum(v for k, v in ms.items() if k.endswith(" bwd"))
    ms["loss (BCE, casts) and model glue"] = total["loss"] - fwd
    ms["autograd engine between backward nodes"] = total["backward"] - bwd
    ms["zero_grad"] = total["zero_grad"]
    ms["optimizer"] = total["optimizer"]
    ms["framework overhead (loop, Python, profiler)"] = ms_step - sum(total.values())
    return {"ms_per_step": ms_step, "steps": len(measured), "ms": ms}


def format_table(result: dict[str, Any], title: str) -> str:
    """A markdown table: part / phase, ms per step, share of the step."""
    step = result["ms_per_step"]
    lines = [f"{title}: {step:.1f} ms per step ({result['steps']} steps profiled)", "",
             "| part | ms / step | share |", "| --- | ---: | ---: |"]
    for k, v in sorted(result["ms"].items(), key=lambda kv: -kv[1]):
        lines.append(f"| {k} | {v:.2f} | {v / step:.1%} |")
    return "\n".join(lines)
