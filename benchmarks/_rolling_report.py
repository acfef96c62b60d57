"""benchmarks/incremental.py's printed rows and tables (one line per period, a markdown table per dataset)."""

from __future__ import annotations

from typing import Any

ARMS = ("incremental", "retrain", "frozen")


def line(unit: str, rec: dict[str, Any]) -> str:
    cells = [f"{unit} {rec['t']}->{rec['t'] + 1} new {rec['new_rows']:>6} all {rec['all_rows']:>6}"]
    for arm in ARMS:
        r = rec[arm]
        cells.append(f"{arm[:4]} AUC {r['auc']:.4f} GAUC {r['gauc']:.4f}"
                     + (f" {r['train_s']:5.1f}s (ep {r['best_epoch']}/{r['epochs']:g})" if "train_s" in r else "")
                     + (" refresh" if arm == "incremental" and r.get("refresh") else ""))
    return " | ".join(cells)


def table(name: str, unit: str, recs: list[dict[str, Any]], s: dict[str, Any]) -> str:
    head = f"| {unit} -> next | new / all rows | " + " | ".join(
        f"{a} AUC | {a} GAUC" for a in ARMS) + " | inc train s | retrain train s |"
    rows = [f"\n{name}\n", head, "|" + "---|" * (head.count("|") - 1)]
    for r in recs:
        rows.append(f"| {r['t']} -> {r['t'] + 1} | {r['new_rows']} / {r['all_rows']} | " + " | ".join(
            f"{r[a]['auc']:.4f} | {r[a]['gauc']:.4f}" for a in ARMS)
            + f" | {r['incremental']['train_s']:.1f}{' (refresh)' if r['incremental'].get('refresh') else ''}"
            f" | {r['retrain']['train_s']:.1f} |")
    rows.append("| mean t>=1 | | " + " | ".join(f"{s[a]['auc']:.4f} | {s[a]['gauc']:.4f}" for a in ARMS)
                + f" | {s['incremental']['train_s_total']:.1f} (total) | {s['retrain']['train_s_total']:.1f} (total) |")
    rows.append("seconds, t>=1 totals: " + "; ".join(
        f"{a}: train {s[a]['train_s_total']:.1f}, job {s[a]['job_s_total']:.1f}, preprocess {s[a]['prep_s_total']:.1f}"
        for a in ARMS[:2]) + f"; frozen: preprocess {s['frozen']['prep_s_total']:.1f}")
    return "\n".join(rows) + "\n"
