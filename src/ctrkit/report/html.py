"""The report pages as HTML text: a plain template filled with :func:`html.escape`-d values; no script, no
external resource. Plots are ``<img class="plot">`` of fixed size (:data:`ctrkit.report.plots.SIZE_PX`) whose
``src`` a caller chooses (a relative file or a ``data:`` URI), each with ``data-plot`` naming it.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable, Collection, Iterable, Sequence
from html import escape
from typing import Any

import yaml

from ctrkit.metrics import higher_is_better
from ctrkit.report.figures import Plot, curve_metrics
from ctrkit.report.plots import SIZE_PX
from ctrkit.report.run import SPLITS, Run, store_stats

NOT_METRICS = ("step", "epoch", "gauc_skipped_groups")  # numbers of an evaluation record that are not metrics
MAX_FEATURE_ROWS = 200  # vocabulary table rows shown; the rest counted

W, H = SIZE_PX
CSS = f"""
body {{ font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 16px 24px; color: #222;
       max-width: 1180px; font-size: 14px; }}
h1 {{ font-size: 22px; margin: 0 0 4px 0; }} h2 {{ font-size: 17px; margin: 22px 0 8px 0; border-bottom: 1px solid #ddd; }}
.sub {{ color: #666; margin-bottom: 10px; }}
table {{ border-collapse: collapse; margin: 4px 0 8px 0; }} td, th {{ border: 1px solid #ddd; padding: 3px 8px;
       text-align: left; vertical-align: top; }} th {{ background: #f4f4f4; }} td.num {{ text-align: right;
       font-variant-numeric: tabular-nums; }}
.plots {{ display: grid; grid-template-columns: repeat(2, {W}px); gap: 14px 20px; }}
figure {{ margin: 0; }} figcaption {{ font-size: 12px; color: #555; width: {W}px; }}
img.plot {{ display: block; width: {W}px; height: {H}px; border: 1px solid #eee; }}
pre {{ background: #f7f7f7; padding: 8px; font-size: 12px; overflow-x: auto; }}
.note {{ color: #8a5300; }} .err {{ color: #b00020; }}
"""


def fmt(v: Any) -> str:
    """A value as a table shows it: floats with 5 significant digits, ints with thousands separators."""
    if isinstance(v, bool) or v is None:
        return "-" if v is None else str(v).lower()
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return f"{v:,.0f}" if abs(v) >= 1e5 else f"{v:.5g}"
    return str(v)


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def table(header: Sequence[str] | None, rows: Iterable[Sequence[Any]],
          bold: Collection[tuple[int, int]] = ()) -> str:
    """An HTML table of escaped, formatted cells; numbers right-aligned; the (row, column) cells of ``bold``
    in bold."""
    out = ["<table>"]
    if header:
        out.append("<tr>" + "".join(f"<th>{escape(h)}</th>" for h in header) + "</tr>")
    for i, row in enumerate(rows):
        cells = []
        for j, c in enumerate(row):
            text = f"<b>{escape(fmt(c))}</b>" if (i, j) in bold else escape(fmt(c))
            cells.append(f'<td class="num">{text}</td>' if _num(c) else f"<td>{text}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return "".join(out)


def figures(plots: Sequence[Plot], src: Callable[[Plot], str]) -> str:
    w, h = SIZE_PX
    items = [f'<figure><img class="plot" data-plot="{escape(p.name)}" src="{escape(src(p))}" width="{w}" '
             f'height="{h}" alt="{escape(p.caption)}"><figcaption>{escape(p.caption)}</figcaption></figure>'
             for p in plots]
    return '<div class="plots">' + "".join(items) + "</div>"


def notes_list(notes: Sequence[str]) -> str:
    return "" if not notes else '<ul class="note">' + "".join(f"<li>{escape(n)}</li>" for n in notes) + "</ul>"


def page(title: str, body: str) -> str:
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
            f"<style>{CSS}</style></head><body>{body}"
            f'<p class="sub">written by ctrkit report, {escape(stamp)}</p></body></html>\n')


def metrics_of(d: Any) -> dict[str, Any]:
    """The metric values of a summary block (valid / test): numbers only, bookkeeping keys left out."""
    if not isinstance(d, dict):
        return {}
    return {k: v for k, v in d.items() if _num(v) and k not in NOT_METRICS}


def byte_size(v: Any) -> str:
    """Bytes in B / KiB / MiB / GiB."""
    if not _num(v):
        return "-"
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if v >= 2**k:
            return f"{v / 2**k:,.1f} {unit}"
    return f"{int(v)} B"


# ---- one run ----------------------------------------------------------------------------------------
def run_page(run: Run, plots: Sequence[Plot], notes: Sequence[str], src: Callable[[Plot], str]) -> str:
    """The one-page report of ``run``."""
    s = run.summary
    best = s.get("best") if isinstance(s.get("best"), dict) else {}
    ms = s.get("model_size") if isinstance(s.get("model_size"), dict) else {}
    head = [
        ("model", run.model), ("task", run.task),
        ("best", f"{best.get('metric', '?')} = {fmt(best.get('value'))} at step {fmt(best.get('step'))}"
                 + _epoch_of(run, best.get("step")) if best else "-"),
        ("epochs / steps", f"{fmt(s.get('epochs_trained', s.get('epochs')))} / {fmt(s.get('steps'))}"
                           + (f" (stopped: {s['stopped_by']})" if s.get("stopped_by") else  # says early stopping too
                              " (stopped early)" if s.get("stopped_early") else "")),
        ("seconds (total / training)", f"{fmt(s.get('seconds'))} / {fmt(s.get('train_seconds'))}"),
        ("seconds per epoch", s.get("seconds_per_epoch")),
        ("training samples / second", s.get("samples_per_second")),
        ("parameters (embedding)", f"{fmt(ms.get('parameters'))} ({fmt(ms.get('embedding_parameters'))})"),
        ("model size", byte_size(ms.get("bytes"))),
    ]
    body = [f"<h1>Run {escape(run.name)}</h1>", f'<div class="sub">{escape(str(run.path.resolve()))}</div>',
            table(None, head), notes_list([*run.notes, *notes])]
    body.append(_metric_table(run))
    body += ["<h2>Plots</h2>", figures(plots, src)]
    body += ["<h2>Data</h2>", data_section(run)]
    env = s.get("environment")
    if isinstance(env, dict) and env:
        body += ["<h2>Environment</h2>", table(None, [(k, v) for k, v in env.items()])]
    body += ["<h2>Resolved config</h2>", f"<pre>{escape(_yaml(run.config))}</pre>"]
    return page(f"ctrkit run {run.name}", "".join(body))


def _epoch_of(run: Run, step: Any) -> str:
    spe = run.steps_per_epoch
    return f" (epoch {step / spe:.3g})" if spe and _num(step) else ""


def _metric_table(run: Run) -> str:
    s = run.summary
    blocks = [("valid at best", metrics_of((s.get("best") or {}).get("valid"))),
              ("valid, last evaluation", metrics_of(s.get("last_valid"))),
              ("test (best.pt)", metrics_of(s.get("test")))]
    if not any(b for _, b in blocks) and run.evals:  # no summary: the last evaluation record
        blocks = [("valid, last evaluation", {k: run.evals[-1][k] for k in curve_metrics(run) + ["logloss"]
                                              if _num(run.evals[-1].get(k))})]
    keys = list(dict.fromkeys(k for _, b in blocks for k in b))
    if not keys:
        return ""
    return table(["", *keys], [(name, *(b.get(k) for k in keys)) for name, b in blocks if b])


def data_section(run: Run) -> str:
    """Statistics of the run's stores from their manifests, and the train store's features."""
    paths = run.store_paths()
    if not paths:
        return '<p class="note">the run names no data stores</p>'
    rows, schema, bad_lines = [], None, []
    for split in SPLITS:
        if split not in paths:
            continue
        st = store_stats(paths[split])
        if "error" in st:
            rows.append((split, st["path"], None, None, None, st["error"]))
            continue
        bad, total = st["bad_rows"], st["input_rows"]
        rows.append((split, st["path"], st["rows"], st["label_rate"],
                     f"{fmt(bad)} of {fmt(total)} input rows" if _num(bad) and _num(total) else fmt(bad), ""))
        if split == "train" or schema is None:
            schema = st["schema"]
        if split == "train":
            bad_lines = st["first_bad_lines"]
    out = [table(["split", "store", "rows", "label rate", "bad rows", "note"], rows)]
    if bad_lines:
        out.append("<p>First bad input lines (the preprocessing left them out):</p>" + table(
            ["file", "line", "reason"], [(b.get("file"), b.get("line"), b.get("reason")) for b in bad_lines[:10]
                                         if isinstance(b, dict)]))
    if schema:
        out.append(_features(schema))
    return "".join(out)


def _features(schema: dict[str, Any]) -> str:
    sparse = [f for f in schema.get("sparse") or [] if isinstance(f, dict)]
    seq = [q for q in schema.get("sequence") or [] if isinstance(q, dict)]
    dense = [d.get("name") for d in schema.get("dense") or [] if isinstance(d, dict)]
    rows = [(f.get("name"), "multi-valued" if f.get("multi_valued") else "sparse", f.get("vocab_size"),
             f.get("embedding_dim"), f.get("table") or f.get("name")) for f in sparse]
    rows += [(q.get("name"), f"sequence (max {q.get('max_len')})", None, None, q.get("shares")) for q in seq]
    more = len(rows) - MAX_FEATURE_ROWS
    out = [(f"<p>{len(dense)} dense features: {escape(', '.join(map(str, dense)) or '-')}; "
            f"group id: {escape(str(schema.get('group_id') or '-'))}</p>"),
           table(["feature", "kind", "vocabulary size", "embedding dim", "table"], rows[:MAX_FEATURE_ROWS])]
    if more > 0:
        out.append(f"<p>... and {more} more features</p>")
    return "".join(out)


class _ConfigDumper(yaml.SafeDumper):
    """Block style, but a list of plain values on one line (``over_arch: [64, 32]``)."""


_ConfigDumper.add_representer(list, lambda d, v: d.represent_sequence(
    "tag:yaml.org,2002:seq", v, flow_style=all(not isinstance(x, (dict, list)) for x in v)))


def _yaml(d: dict[str, Any]) -> str:
    return yaml.dump(d, Dumper=_ConfigDumper, sort_keys=False, width=100) if d else "(no config)"


# ---- several runs -----------------------------------------------------------------------------------
def compare_page(runs: Sequence[Run], labels: Sequence[str], plots: Sequence[Plot], notes: Sequence[str],
                 src: Callable[[Plot], str]) -> str:
    """Runs side by side: a table of their best valid / test metrics, speed and size; overlaid curves; the
    config keys on which they differ."""
    valid = [metrics_of((r.summary.get("best") or {}).get("valid")) for r in runs]
    test = [metrics_of(r.summary.get("test")) for r in runs]
    vkeys = list(dict.fromkeys(k for v in valid for k in v))
    tkeys = list(dict.fromkeys(k for t in test for k in t))
    header = ["run", "model", "best step", *(f"valid {k}" for k in vkeys), *(f"test {k}" for k in tkeys),
              "s / epoch", "samples / s", "parameters", "size"]
    rows = []
    for r, lab, v, t in zip(runs, labels, valid, test):
        ms = r.summary.get("model_size") or {}
        rows.append((lab, r.model, (r.summary.get("best") or {}).get("step"), *(v.get(k) for k in vkeys),
                     *(t.get(k) for k in tkeys), r.summary.get("seconds_per_epoch"),
                     r.summary.get("samples_per_second"), ms.get("parameters"), byte_size(ms.get("bytes"))))
    metric_cols = [(3 + i, k) for i, k in enumerate(vkeys)] + [(3 + len(vkeys) + i, k) for i, k in enumerate(tkeys)]
    bold = _best_cells(rows, metric_cols) if len(runs) > 1 else set()
    run_notes = [f"{lab}: {n}" for r, lab in zip(runs, labels) for n in r.notes]
    body = [f"<h1>{len(runs)} runs compared</h1>",
            table(["run", "directory"], [(lab, str(r.path.resolve())) for r, lab in zip(runs, labels)]),
            "<h2>Results</h2>", table(header, rows, bold), notes_list([*notes, *run_notes]),
            "<h2>Plots</h2>", figures(plots, src), "<h2>Config differences</h2>", _config_diff(runs, labels)]
    return page(f"ctrkit: {len(runs)} runs compared", "".join(body))


def _best_cells(rows: Sequence[Sequence[Any]], cols: Sequence[tuple[int, str]]) -> set[tuple[int, int]]:
    """The (row, column) cells holding the best value of each metric column (highest AUC, lowest LogLoss)."""
    out = set()
    for j, metric in cols:
        vals = [(r[j], i) for i, r in enumerate(rows) if _num(r[j]) and not math.isnan(r[j])]
        if len(vals) > 1:
            best = (max if higher_is_better(metric) else min)(v for v, _ in vals)
            out |= {(i, j) for v, i in vals if v == best}
    return out


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flatten(v, f"{prefix}{k}.") if isinstance(v, dict) and v else {f"{prefix}{k}": v})
    return out


def _config_diff(runs: Sequence[Run], labels: Sequence[str]) -> str:
    flat = [_flatten(r.config) for r in runs]
    keys = list(dict.fromkeys(k for f in flat for k in f))
    missing = object()
    differ = [k for k in keys if len({repr(f.get(k, missing)) for f in flat}) > 1]
    if not differ:
        return "<p>The resolved configs are the same.</p>"
    return table(["key", *labels], [(k, *(repr(f[k]) if k in f else "(absent)" for f in flat)) for k in differ])
