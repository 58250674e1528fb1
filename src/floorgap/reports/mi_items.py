"""Table 4 (App. D.3): locality of missing path information, rho_{k,m} by slot and pooled.

Reads the MI records of one target (``results/<target>/mi/<domain>.parquet``, every domain),
keeps the screened-in anchors and, for every slot k and order m < k, the anchor's
n = C_{k,0} - C_{k,m} and d = C_{k,0} - C_{k,k}. rho_{k,m} is the ratio of Hajek sums of n and
d (paper B.2), per slot and pooled over slots, with prompt-cluster percentile intervals; ESS
gates (the configured thresholds and M/2) give the sensitivity rows of App. C.5. Cells where m
>= k (the last m tokens are the whole realised prefix) are dashes.

Outputs: ``paper/tables/table4_mi_locality.{tex,csv}``; the macros go to the values fragment
``paper/values/table4_mi_locality.tex`` (written by :mod:`floorgap.report`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from floorgap.estimators.aggregate import DEFAULT_BOOT_SEED
from floorgap.estimators.mi import ess_gate_sensitivity, recovery_bootstrap, recovery_fraction
from floorgap.records import read_metadata, read_table
from floorgap.reports.common import macro_name, write_table

ITEM = "table4_mi_locality"
_ORDER_WORDS = {1: "One", 2: "Two", 3: "Three", 4: "Four"}


@dataclass(frozen=True)
class MIArrays:
    """Screened-in anchors as arrays: n (A, K, J), d (A, K), ess (A, K, J) over slots
    ``slots`` (K) and ``orders`` (J); ``mask`` marks the cells with m < k; ``pi`` (A,),
    ``prompts`` (A,) the cluster of each anchor."""

    n: torch.Tensor
    d: torch.Tensor
    ess: torch.Tensor
    mask: torch.Tensor
    pi: torch.Tensor
    prompts: list[str]
    domains: list[str]
    slots: list[int]
    orders: list[int]


def load_records(paths: Sequence[str | Path]) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Concatenate MI record files; check that they were measured with one configuration."""
    frames, metas = [], []
    for p in paths:
        frames.append(read_table(p))
        metas.append(read_metadata(p))
    if not frames:
        raise ValueError("no MI record files given")
    keys = ("target", "mi", "law", "gamma", "forward_batch")
    first = {k: metas[0].get(k) for k in keys}
    for p, meta in zip(paths, metas):
        if {k: meta.get(k) for k in keys} != first:
            raise ValueError(f"{p} was measured with a different configuration than {paths[0]}")
    return pd.concat(frames, ignore_index=True), dict(first, files=[str(p) for p in paths])


def records_to_arrays(frame: pd.DataFrame) -> MIArrays:
    """Arrays of the screened-in anchors (sorted by anchor id; slots >= 1)."""
    kept = frame[frame["screened"].astype(bool)].copy()
    if kept.empty:
        raise ValueError("no anchor passed the screen; nothing to aggregate")
    anchors = sorted(kept["anchor_id"].unique())
    slots = sorted(int(s) for s in kept["slot"].unique())
    orders = sorted(int(m) for m in kept["order"].unique())
    a_ix = {a: i for i, a in enumerate(anchors)}
    k_ix = {k: i for i, k in enumerate(slots)}
    m_ix = {m: i for i, m in enumerate(orders)}
    A, K, J = len(anchors), len(slots), len(orders)
    nan = float("nan")
    n = torch.full((A, K, J), nan, dtype=torch.float64)
    d = torch.full((A, K), nan, dtype=torch.float64)
    ess = torch.full((A, K, J), nan, dtype=torch.float64)
    ai = torch.tensor(kept["anchor_id"].map(a_ix).to_numpy())
    ki = torch.tensor(kept["slot"].map(k_ix).to_numpy())
    mi = torch.tensor(kept["order"].map(m_ix).to_numpy())
    col = lambda name: torch.tensor(kept[name].to_numpy(float))  # noqa: E731
    n[ai, ki, mi] = col("c_k0") - col("c_km")
    d[ai, ki] = col("c_k0") - col("c_kk")
    ess[ai, ki, mi] = col("ess")
    mask = torch.tensor([[m < k for m in orders] for k in slots]).expand(A, K, J)
    per_anchor = kept.drop_duplicates("anchor_id").set_index("anchor_id").loc[anchors]
    return MIArrays(n=n, d=d, ess=ess, mask=mask.clone(),
                    pi=torch.tensor(per_anchor["pi"].to_numpy(float)),
                    prompts=[str(p) for p in per_anchor["prompt_id"]],
                    domains=[str(x) for x in per_anchor["domain"]], slots=slots, orders=orders)


def ess_thresholds(gates: Sequence[float], paths: int) -> list[tuple[float, str]]:
    """The sensitivity thresholds: the configured gates and M/2, each once, with macro keys."""
    named: dict[float, list[str]] = {}
    for g in gates:
        named.setdefault(float(g), []).append(f"{float(g):g}".replace(".", "p"))
    named.setdefault(paths / 2.0, []).append("HalfPaths")
    return [(t, keys) for t, keys in sorted(named.items())]  # type: ignore[misc]


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


def _order_word(m: int) -> str:
    return _ORDER_WORDS.get(m, str(m))


def mi_locality(frame: pd.DataFrame, meta: Mapping[str, Any], *, ess_gates: Sequence[float],
                n_boot: int, level: float, seed: int = DEFAULT_BOOT_SEED
                ) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, str]]:
    """Table 4: (csv frame, LaTeX frame, macros) from the concatenated MI records."""
    paths = int(meta["mi"]["paths"])
    arr = records_to_arrays(frame)
    n, d, pi, mask = arr.n, arr.d, arr.pi, arr.mask
    est = recovery_fraction(n, d, pi, mask)
    boot = recovery_bootstrap(n, d, arr.prompts, pi, mask, n_boot=n_boot, seed=seed,
                              level=level)
    gates = ess_thresholds(ess_gates, paths)
    sens = ess_gate_sensitivity(n, d, arr.ess, [0.0] + [t for t, _ in gates], pi, mask)
    cells_mask = mask & torch.isfinite(n) & torch.isfinite(d).unsqueeze(-1)

    n_all = frame["anchor_id"].nunique()
    n_kept = len(arr.prompts)
    n_prompts = len(set(arr.prompts))
    slots_shown = [(ki, k) for ki, k in enumerate(arr.slots) if any(m < k for m in arr.orders)]
    ps, pl = boot.per_slot, boot.pooled

    rows: list[dict[str, Any]] = []
    for ki, k in slots_shown:
        for j, m in enumerate(arr.orders):
            ok = m < k
            rows.append({"section": "slot", "slot": k, "ess_gate": 0.0, "order": m,
                         "rho": float(ps.estimate[ki, j]) if ok else float("nan"),
                         "lower": float(ps.lower[ki, j]) if ok else float("nan"),
                         "upper": float(ps.upper[ki, j]) if ok else float("nan"),
                         "cells": int(cells_mask[:, ki, j].sum())})
    for j, m in enumerate(arr.orders):
        rows.append({"section": "pooled", "slot": -1, "ess_gate": 0.0, "order": m,
                     "rho": float(pl.estimate[j]), "lower": float(pl.lower[j]),
                     "upper": float(pl.upper[j]), "cells": int(cells_mask[:, :, j].sum())})
    for t, res in sens[1:]:
        for j, m in enumerate(arr.orders):
            rows.append({"section": "ess_gate", "slot": -1, "ess_gate": t, "order": m,
                         "rho": float(res.pooled[j]), "lower": float("nan"),
                         "upper": float("nan"), "cells": int(res.n_cells_pooled[j])})
    for row in rows:
        row.update(anchors=n_kept, prompts=n_prompts)
    for dom in sorted(set(arr.domains)):
        pick = [i for i, x in enumerate(arr.domains) if x == dom]
        sel = torch.tensor(pick)
        res = recovery_fraction(n[sel], d[sel], pi[sel], mask[sel])
        for j, m in enumerate(arr.orders):
            rows.append({"section": f"domain:{dom}", "slot": -1, "ess_gate": 0.0, "order": m,
                         "rho": float(res.pooled[j]), "lower": float("nan"),
                         "upper": float("nan"), "cells": int(res.n_cells_pooled[j]),
                         "anchors": len(pick),
                         "prompts": len({arr.prompts[i] for i in pick})})
    csv = pd.DataFrame(rows)
    csv["paths"] = paths

    # LaTeX: slot rows, the pooled row (bold), then the ESS-gate rows (pooled, cells).
    headers = ["slot $k$"] + [f"$\\rho_{{k,{m}}}$" for m in arr.orders]
    tex_rows = []
    for ki, k in slots_shown:
        cells = []
        for j, m in enumerate(arr.orders):
            if m >= k:
                cells.append("--")
            else:
                cells.append(f"{_pct_tex(float(ps.estimate[ki, j]))} "
                             f"[{_pct(float(ps.lower[ki, j]))}, {_pct(float(ps.upper[ki, j]))}]")
        tex_rows.append([str(k)] + cells)
    tex_rows.append(["pooled"] + [
        f"\\textbf{{{_pct_tex(float(pl.estimate[j]))}}} "
        f"[{_pct(float(pl.lower[j]))}, {_pct(float(pl.upper[j]))}]"
        for j in range(len(arr.orders))])
    for (t, keys), (_, res) in zip(gates, sens[1:]):
        label = f"ESS $\\geq$ {t:g}" + (" ($M/2$)" if "HalfPaths" in keys else "")
        tex_rows.append([f"pooled, {label}"] + [
            f"{_pct_tex(float(res.pooled[j]))} ({int(res.n_cells_pooled[j])})"
            for j in range(len(arr.orders))])
    latex = pd.DataFrame(tex_rows, columns=headers)

    # Macros.
    v: dict[str, str] = {}
    v[macro_name("mi", "paths")] = str(paths)
    v[macro_name("mi", "screen", "paths")] = str(int(meta["mi"]["screen_paths"]))
    v[macro_name("mi", "threshold", "nats")] = f"{float(meta['mi']['threshold_nats']):g}"
    v[macro_name("mi", "anchors")] = str(n_all)
    v[macro_name("mi", "eligible", "anchors")] = str(n_kept)
    v[macro_name("mi", "eligible", "prompts")] = str(n_prompts)
    v[macro_name("mi", "screened", "out")] = str(n_all - n_kept)
    v[macro_name("mi", "screened", "share")] = _pct_tex(n_kept / n_all)
    v[macro_name("mi", "level")] = f"{100 * level:g}\\%"
    v[macro_name("mi", "bootstrap")] = str(n_boot)
    for j, m in enumerate(arr.orders):
        w = _order_word(m)
        base = ("mi", "rho", "order", w)
        v[macro_name(*base, "pooled")] = _pct_tex(float(pl.estimate[j]))
        v[macro_name(*base, "pooled", "lower")] = _pct_tex(float(pl.lower[j]))
        v[macro_name(*base, "pooled", "upper")] = _pct_tex(float(pl.upper[j]))
        v[macro_name(*base, "pooled", "CI")] = (f"[{_pct(float(pl.lower[j]))}, "
                                                f"{_pct(float(pl.upper[j]))}]")
        per_slot = [float(est.per_slot[ki, j]) for ki, k in slots_shown if m < k]
        per_slot = [x for x in per_slot if math.isfinite(x)]
        v[macro_name(*base, "slot", "min")] = _pct_tex(min(per_slot)) if per_slot else "--"
        v[macro_name(*base, "slot", "max")] = _pct_tex(max(per_slot)) if per_slot else "--"
        slots_m = [k for _, k in slots_shown if m < k]
        v[macro_name("mi", "order", w, "first", "slot")] = str(slots_m[0]) if slots_m else "--"
        v[macro_name("mi", "cells", "order", w)] = str(int(cells_mask[:, :, j].sum()))
        e = arr.ess[:, :, j][cells_mask[:, :, j]]
        v[macro_name("mi", "ess", "median", "order", w)] = (
            f"{float(e.median()):.1f}" if e.numel() else "--")
        # sensitivity: the pooled estimate without a gate and under every gate
        gated = [float(res.pooled[j]) for _, res in sens]
        finite = [x for x in gated if math.isfinite(x)]
        v[macro_name("mi", "ess", "gate", "rho", "order", w, "min")] = (
            _pct_tex(min(finite)) if finite else "--")
        v[macro_name("mi", "ess", "gate", "rho", "order", w, "max")] = (
            _pct_tex(max(finite)) if finite else "--")
        v[macro_name("mi", "ess", "gate", "spread", "order", w)] = (
            f"{100 * (max(finite) - min(finite)):.1f}" if finite else "--")
        for (t, keys), (_, res) in zip(gates, sens[1:]):
            for key in keys:
                v[macro_name("mi", "ess", "gate", key, "rho", "order", w)] = _pct_tex(
                    float(res.pooled[j]))
                v[macro_name("mi", "ess", "gate", key, "cells", "order", w)] = str(
                    int(res.n_cells_pooled[j]))
    return csv, latex, v


def table4_mi_locality(inputs: Mapping[str, Path], spec: Mapping[str, Any],
                       out_dir: Path) -> dict[str, str]:
    """Report item (``floorgap report table4_mi_locality``): Table 4 from the MI
    record files ``inputs`` (one per domain, any keys); ``spec`` holds ``analysis``
    (``bootstrap``, ``level``, optional ``seed``) and ``ess_gates``. Writes the tex and csv
    into ``out_dir`` and returns the macros."""
    if not inputs:
        raise ValueError("table4_mi_locality needs the MI record files as inputs")
    records = [inputs[key] for key in sorted(inputs)]
    analysis = spec.get("analysis", {})
    frame, meta = load_records(records)
    csv, latex, macros = mi_locality(
        frame, meta, ess_gates=[float(g) for g in spec.get("ess_gates", [])],
        n_boot=int(analysis.get("bootstrap", 10_000)), level=float(analysis.get("level", 0.95)),
        seed=int(analysis.get("seed", DEFAULT_BOOT_SEED)))
    write_table(csv, ITEM, tex_dir=out_dir, latex=latex,
                column_format="l" + "r" * (latex.shape[1] - 1))
    return macros
