"""Paper items of the reach sections: the final-slot decomposition across targets (Sec. 3.4:
``fig5_cross_target``), the floors read through an API with their omitted-mass bounds and the
matched-path check (App. C.6: ``tableC6_api_floors``), the serving bounds a reported accepted
length implies (App. F.3: ``tableF3_serving_bounds``) and the notation (App. A.1:
``table2_notation``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from floorgap.estimators.serving import largest_risk_lower_bound
from floorgap.notation import NOTATION
from floorgap.records import read_metadata, read_table
from floorgap.reports.common import (GapSummary, fmt, fmt_interval, fmt_pct, fmt_range, item_figure,
                                     macro_name, role_variants, save_item_figure, tex_text,
                                     write_table)

__all__ = ["fig5_cross_target", "tableC6_api_floors", "tableF3_serving_bounds", "table2_notation"]


def _count(row: pd.Series, name: str) -> str:
    if f"{name}_contained" not in row or pd.isna(row.get(f"{name}_contained")):
        return "--"
    return f"{int(row[f'{name}_contained'])}/{int(row['anchors'])}"


def tableC6_api_floors(inputs: Mapping[str, Path], spec: Mapping[str, Any], out_dir: Path
                       ) -> dict[str, str]:
    """Table C.6 (API floors): by slot, the top-K floors T~^(0) and the order-1 plug-in with
    their omitted-mass bounds, the full-vocabulary floors on the same paths and how many anchors
    the bounds contain, the held-out T~^(1), the share one realised token removes and E[r]."""
    df = read_table(inputs["summary"])
    meta = read_metadata(inputs["summary"])
    rows = df[df["scope"] == "all"].sort_values("slot")
    matched = "full_t0" in rows
    header = ["Slot", "$\\widetilde T^{(0)}$", "bounds", "$T^{(0)}$ full", "in",
              "$\\widetilde T^{(1)}$ plug-in", "bounds", "$T^{(1)}$ full", "in",
              "$\\widetilde T^{(1)}$ held-out", "removed", "$\\mathbb{E}[r]$"]
    shown = [[str(int(r["slot"])), fmt(r["t0"], 4), fmt_interval(r["t0_lower"], r["t0_upper"], 4),
              fmt(r.get("full_t0", math.nan), 4), _count(r, "t0"), fmt(r["t1_plugin"], 4),
              fmt_interval(r["t1_plugin_lower"], r["t1_plugin_upper"], 4),
              fmt(r.get("full_t1_plugin", math.nan), 4), _count(r, "t1_plugin"),
              fmt(r["t1_held_out"], 4), fmt_pct(r["t1_removed_share"]), fmt(r["omitted"], 4)]
             for _, r in rows.iterrows()]
    write_table(rows, "tableC6_api_floors", tex_dir=out_dir,
                latex=pd.DataFrame(shown, columns=header))
    last = rows.iloc[-1]
    deep = rows[rows["slot"] >= 2]["t1_removed_share"]
    values = {
        macro_name("api", "anchors"): str(int(meta.get("anchors", last["anchors"]))),
        macro_name("api", "complete", "last"): str(int(last["anchors"])),
        macro_name("api", "paths"): str(meta.get("paths", "--")),
        macro_name("api", "top", "k"): str(meta.get("top_k", "--")),
        # what the stage recorded of its endpoint, and whether it teacher-forced the paths
        macro_name("api", "endpoint"): tex_text(meta["endpoint"]),
        macro_name("api", "matched", "said"): "done" if matched else "not done",
        macro_name("api", "T0", "last"): fmt(last["t0"], 3),
        macro_name("api", "T1", "held", "out", "last"): fmt(last["t1_held_out"], 3),
        macro_name("api", "omitted", "last"): fmt(last["omitted"], 4),
        macro_name("api", "removed", "range"): fmt_range(
            *(fmt_pct(x) if len(deep) else "--" for x in (deep.min(), deep.max()))),
    }
    # without the matched check (a remote endpoint) the text's matched values read "--"
    values[macro_name("api", "matched", "cells")] = (str(int(rows["anchors"].sum()))
                                                     if matched else "--")
    for name in ("t0", "t1_plugin"):
        stem = "T0" if name == "t0" else "T1"
        values[macro_name("api", "matched", stem, "contained")] = (
            str(int(rows[f"{name}_contained"].sum())) if matched else "--")
        values[macro_name("api", "matched", stem, "max", "diff")] = (
            fmt(float(rows[f"{name}_max_abs_diff"].max()), 4) if matched else "--")
    return values


def _own_taus(path: Path) -> list[dict[str, Any]]:
    """The project's served drafters: task-macro tau (mean over concurrency) per temperature."""
    df = read_table(path)
    hit = df[(df["statistic"] == "tau") & (df["task"] == "macro") & (df["concurrency"] == 0)
             & (df["system"] != "ar")]
    return [{"label": f"{r.system} (served here, T={float(r.temperature):g})",
             "tau": float(r.estimate), "source": "serving benchmark"}
            for r in hit.itertuples(index=False)]


def tableF3_serving_bounds(inputs: Mapping[str, Path], spec: Mapping[str, Any], out_dir: Path
                           ) -> dict[str, str]:
    """Table F.3: the lower bound r_min on the largest per-slot risk implied by an accepted length
    alone (no independence across slots), for the published numbers the config lists and for
    the project's own served drafters."""
    gamma = int(spec["gamma"])
    entries = [dict(e) for e in spec.get("published", [])]
    entries += [{**e, "gamma": gamma} for e in _own_taus(inputs["summary"])]
    rows = [{"label": e["label"], "source": e.get("source", ""), "gamma": int(e["gamma"]),
             "tau": float(e["tau"]),
             "r_min": largest_risk_lower_bound(float(e["tau"]), int(e["gamma"]))} for e in entries]
    df = pd.DataFrame(rows, columns=["label", "source", "gamma", "tau", "r_min"])
    shown = pd.DataFrame([[r.label.replace("_", "\\_"), r.source.replace("#", "\\#"),
                           str(r.gamma), fmt(r.tau, 3), fmt(r.r_min, 3)]
                          for r in df.itertuples(index=False)],
                         columns=["Report", "Source", "$\\gamma$", "$\\tau$",
                                  "$r_{\\min}$ (largest $R_k$ at least)"])
    write_table(df, "tableF3_serving_bounds", tex_dir=out_dir, latex=shown,
                column_format="llrrr")
    own = df[df["source"] == "serving benchmark"]
    published = df.iloc[:len(spec.get("published", []))]
    first = published.iloc[0] if len(published) else None
    shown_first = (("--",) * 3 if first is None else
                   (fmt(first["tau"], 3), str(int(first["gamma"])), fmt(first["r_min"], 3)))
    values = {macro_name("bound", "published", key): text
              for key, text in zip(("tau", "gamma", "r"), shown_first)}
    values[macro_name("bound", "own", "r", "max")] = fmt(float(own["r_min"].max()), 3) \
        if len(own) else "--"
    values[macro_name("bound", "published", "rows")] = str(len(spec.get("published", [])))
    return values


def table2_notation(inputs: Mapping[str, Path], spec: Mapping[str, Any], out_dir: Path
                    ) -> dict[str, str]:
    """Table 2: the notation, from :data:`floorgap.notation.NOTATION` (which the docstrings of
    the named code also use)."""
    df = pd.DataFrame([{"symbol": s.symbol, "meaning": s.meaning, "code": "; ".join(s.homes)}
                       for s in NOTATION])
    shown = pd.DataFrame([[s.symbol, s.meaning] for s in NOTATION], columns=["Symbol", "Meaning"])
    write_table(df, "table2_notation", tex_dir=out_dir, latex=shown,
                column_format="lp{0.7\\linewidth}")
    return {macro_name("notation", "rows"): str(len(NOTATION))}


def fig5_cross_target(inputs: Mapping[str, Path], spec: Mapping[str, Any], out_dir: Path
                      ) -> dict[str, str]:
    """Fig. 5: the final-slot floor-gap decomposition of every target: T^(0) and G^(0) of the
    order-0 drafter (stacking to R) and T^(1) and G^(1) of the order-1 drafter (stacking to
    R^oracle, on the covered paths), with the gaps' intervals; the values give the ranges of
    G^(0)/R and G^(1)/R^oracle across targets. The targets whose records say they were prompted
    without a chat template (``prompts: plain``, base models) are marked under their names and
    listed in a macro."""
    v0, v1, _ = role_variants(spec)
    targets = [k[len("gaps_"):] for k in inputs if k.startswith("gaps_")]
    if not targets:
        raise ValueError("fig5_cross_target needs one --input gaps_<target>=<gaps summary>")
    rows = []
    # how each target's prompts were formatted, as its records say (None: older records)
    prompts = {t: read_metadata(inputs[f"gaps_{t}"]).get("prompts") for t in targets}
    for t in targets:
        s = GapSummary(inputs[f"gaps_{t}"])
        s.require(v0)
        s.require(v1)
        L = s.last
        row = {"target": t, "slot": L}
        for stat, v in (("T0", v0), ("G0", v0), ("R", v0), ("G0_share", v0), ("T1", v1),
                        ("G1", v1), ("R_oracle", v1), ("G1_share", v1),
                        ("R_oracle_all", v1)):
            for field in ("estimate", "lower", "upper"):
                row[f"{stat}_{field}"] = s.get(stat, v, L, field=field)
        rows.append(row)
    df = pd.DataFrame(rows)
    fig, (left, right) = item_figure(spec, 2)
    x = np.arange(len(targets))
    for ax, floor, gap, title in ((left, "T0", "G0", f"order 0 ({v0})"),
                                  (right, "T1", "G1", f"order 1 ({v1}, oracle)")):
        ax.bar(x, df[f"{floor}_estimate"], label=f"floor $T^{{({floor[1]})}}$")
        err = np.vstack([df[f"{gap}_estimate"] - df[f"{gap}_lower"],
                         df[f"{gap}_upper"] - df[f"{gap}_estimate"]])
        ax.bar(x, df[f"{gap}_estimate"], bottom=df[f"{floor}_estimate"], yerr=err, capsize=3,
               label=f"gap $G^{{({gap[1]})}}$")
        ax.set_xticks(x)
        # a base model's corpus uses plain prompts (no chat template): say so under its name
        ax.set_xticklabels([f"{t}\n(plain prompts)" if prompts[t] == "plain" else t
                            for t in targets], rotation=20, ha="right")
        ax.set_title(title)
        ax.legend()
    left.set_ylabel(f"risk at the final slot $k={int(df['slot'].max())}$")
    save_item_figure(fig, "fig5_cross_target", out_dir, spec)
    s0, s1 = df["G0_share_estimate"], df["G1_share_estimate"]
    plain = [t for t in targets if prompts[t] == "plain"]
    return {
        # the targets prompted without a chat template (base models), or "none"
        macro_name("cross", "plain", "prompt", "targets"): ", ".join(
            f"\\texttt{{{t}}}" for t in plain) or "none",
        macro_name("cross", "targets"): str(len(targets)),
        macro_name("cross", "target", "list"): ", ".join(f"\\texttt{{{t}}}" for t in targets),
        macro_name("cross", "dflash", "gap", "share", "range"): fmt_range(
            fmt_pct(float(s0.min()), 0), fmt_pct(float(s0.max()), 0)),
        macro_name("cross", "dspark", "gap", "share", "range"): fmt_range(
            fmt_pct(float(s1.min()), 0), fmt_pct(float(s1.max()), 0)),
        # on one population: the oracle risk on every path against T^(0) on every path
        macro_name("cross", "dspark", "above", "T0"): str(int(
            (df["R_oracle_all_estimate"] > df["T0_estimate"]).sum())),
    }
