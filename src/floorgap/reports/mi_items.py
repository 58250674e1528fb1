"""Table 4 (App. D.3): locality of missing path information, rho_{k,m} by slot and pooled.

Formats the summary of :func:`floorgap.analysis.mi.summarise_locality` (rho_{k,m} per slot
and pooled with prompt-cluster intervals, the ESS-gate sensitivity rows of App. C.5, the
per-domain rows). Cells where m >= k (the last m tokens are the whole realised prefix) are
dashes.

Outputs: ``paper/tables/table4_mi_locality.{tex,csv}``; the macros go to the values fragment
``paper/values/table4_mi_locality.tex`` (written by ``floorgap report``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from floorgap.analysis.mi import MILocality, load_records, summarise_locality
from floorgap.estimators.aggregate import DEFAULT_BOOT_SEED
from floorgap.reports.common import fmt_range, macro_name, write_table

ITEM = "table4_mi_locality"
_ORDER_WORDS = {1: "One", 2: "Two", 3: "Three", 4: "Four"}


def _pct(x: float) -> str:
    """A share in percent with one decimal (a LaTeX minus sign; ``--`` when undefined)."""
    if x is None or not math.isfinite(x):
        return "--"
    text = f"{100 * x:.1f}"
    if text == "-0.0":
        return "0.0"
    return "$-$" + text[1:] if text.startswith("-") else text


def _pct_tex(x: float) -> str:
    text = _pct(x)
    return text if text == "--" else text + "\\%"


def _ci(row: pd.Series) -> str:
    """``[lower, upper]`` of a row, in percent."""
    return f"[{_pct(row['lower'])}, {_pct(row['upper'])}]"


def _order_word(m: int) -> str:
    return _ORDER_WORDS.get(m, str(m))


def _section(summary: MILocality, section: str) -> pd.DataFrame:
    """The rows of one section of the summary table."""
    return summary.table[summary.table["section"] == section]


def _gate_rows(summary: MILocality, threshold: float) -> pd.DataFrame:
    """The pooled rows of one ESS gate, indexed by order."""
    rows = _section(summary, "ess_gate")
    return rows[rows["ess_gate"] == threshold].set_index("order")


def mi_locality_latex(summary: MILocality) -> pd.DataFrame:
    """The LaTeX frame: slot rows, the pooled row (bold), then the ESS-gate rows (pooled,
    cells)."""
    orders = summary.orders
    headers = ["slot $k$"] + [f"$\\rho_{{k,{m}}}$" for m in orders]
    slots = _section(summary, "slot")
    tex_rows = []
    for k in summary.slots:
        row = slots[slots["slot"] == k].set_index("order")
        cells = [f"{_pct_tex(row.at[m, 'rho'])} {_ci(row.loc[m])}" if m < k else "--"
                 for m in orders]
        tex_rows.append([str(k)] + cells)
    pl = _section(summary, "pooled").set_index("order")
    tex_rows.append(["pooled"] + [f"\\textbf{{{_pct_tex(pl.at[m, 'rho'])}}} {_ci(pl.loc[m])}"
                                  for m in orders])
    for t, keys in summary.gates:
        gate = _gate_rows(summary, t)
        label = f"ESS $\\geq$ {t:g}" + (" ($M/2$)" if "HalfPaths" in keys else "")
        tex_rows.append([f"pooled, {label}"] + [
            f"{_pct_tex(gate.at[m, 'rho'])} ({int(gate.at[m, 'cells'])})" for m in orders])
    return pd.DataFrame(tex_rows, columns=headers)


def _run_macros(summary: MILocality) -> dict[str, str]:
    """Macros of the run: paths, screen, anchor counts, bootstrap settings."""
    cfg = summary.mi_config
    n_all, n_kept = summary.n_anchors, summary.n_kept
    return {
        macro_name("mi", "paths"): str(int(cfg["paths"])),
        macro_name("mi", "screen", "paths"): str(int(cfg["screen_paths"])),
        macro_name("mi", "threshold", "nats"): f"{float(cfg['threshold_nats']):g}",
        macro_name("mi", "anchors"): str(n_all),
        macro_name("mi", "eligible", "anchors"): str(n_kept),
        macro_name("mi", "eligible", "prompts"): str(summary.n_prompts),
        macro_name("mi", "screened", "out"): str(n_all - n_kept),
        macro_name("mi", "screened", "share"): _pct_tex(n_kept / n_all),
        macro_name("mi", "level"): f"{100 * summary.level:g}\\%",
        macro_name("mi", "bootstrap"): str(summary.n_boot),
    }


def _order_macros(summary: MILocality, m: int) -> dict[str, str]:
    """Macros of order m: pooled rho with interval, per-slot range, cells, ESS and gates."""
    w = _order_word(m)
    base = ("mi", "rho", "order", w)
    pooled = _section(summary, "pooled").set_index("order").loc[m]
    extra = summary.per_order.loc[m]
    slots_m = [k for k in summary.slots if m < k]
    gate_min, gate_max = float(extra["gate_rho_min"]), float(extra["gate_rho_max"])
    v = {
        macro_name(*base, "pooled"): _pct_tex(pooled["rho"]),
        macro_name(*base, "pooled", "lower"): _pct_tex(pooled["lower"]),
        macro_name(*base, "pooled", "upper"): _pct_tex(pooled["upper"]),
        macro_name(*base, "pooled", "CI"): _ci(pooled),
        macro_name(*base, "slot", "min"): _pct_tex(extra["slot_min"]),
        macro_name(*base, "slot", "max"): _pct_tex(extra["slot_max"]),
        macro_name("mi", "order", w, "first", "slot"): str(slots_m[0]) if slots_m else "--",
        macro_name("mi", "cells", "order", w): str(int(pooled["cells"])),
        macro_name("mi", "ess", "median", "order", w): (
            f"{float(extra['ess_median']):.1f}" if int(pooled["cells"]) else "--"),
        # sensitivity: the pooled estimate without a gate and under every gate
        macro_name("mi", "ess", "gate", "rho", "order", w, "range"): fmt_range(
            _pct_tex(gate_min), _pct_tex(gate_max)),
        macro_name("mi", "ess", "gate", "spread", "order", w): (
            f"{100 * (gate_max - gate_min):.1f}" if math.isfinite(gate_min) else "--"),
    }
    for t, keys in summary.gates:
        gate = _gate_rows(summary, t).loc[m]
        for key in keys:
            v[macro_name("mi", "ess", "gate", key, "rho", "order", w)] = _pct_tex(gate["rho"])
            v[macro_name("mi", "ess", "gate", key, "cells", "order", w)] = str(int(gate["cells"]))
    return v


def mi_locality_macros(summary: MILocality) -> dict[str, str]:
    """Every Table 4 macro of the summary."""
    v = _run_macros(summary)
    for m in summary.orders:
        v.update(_order_macros(summary, m))
    return v


def table4_mi_locality(inputs: Mapping[str, Path], spec: Mapping[str, Any],
                       out_dir: Path) -> dict[str, str]:
    """Report item (``floorgap report table4_mi_locality``): Table 4 from the MI
    record files ``inputs`` (one per domain, any keys); ``spec`` holds ``analysis``
    (``bootstrap``, ``level``, optional ``seed``) and ``ess_gates``. Writes the tex and csv
    into ``out_dir`` and returns the macros."""
    if not inputs:
        raise ValueError("table4_mi_locality needs the MI record files as inputs")
    records = [inputs[key] for key in sorted(inputs)]
    analysis = spec["analysis"]
    frame, meta = load_records(records)
    summary = summarise_locality(
        frame, meta, ess_gates=[float(g) for g in spec.get("ess_gates", [])],
        n_boot=int(analysis["bootstrap"]), level=float(analysis["level"]),
        seed=int(analysis.get("seed", DEFAULT_BOOT_SEED)))
    latex = mi_locality_latex(summary)
    write_table(summary.table, ITEM, tex_dir=out_dir, latex=latex,
                column_format="l" + "r" * (latex.shape[1] - 1))
    return mi_locality_macros(summary)
