"""Paper items of the floors' robustness runs (App. C.2, C.3, C.4, C.7): the replication by a
second engine (``tableC2_replication``, from the api_floors replication read and the floors'
anchor-slot table) and, from the floor_variants summaries (floorgap.analysis.floor_variants),
``tableC3_finite_m``, ``tableC4_block16`` and ``tableC7_sampling_law``. Values are means over
the variant's anchors (the first of each domain), not population estimates; the tables say how
many anchors.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from floorgap.analysis.floor_variants import covered_floor_ratios
from floorgap.records import read_metadata, read_table
from floorgap.reports.common import (fmt, fmt_pct, fmt_range, fmt_signed, macro_name,
                                     write_table)

__all__ = ["tableC2_replication", "tableC3_finite_m", "tableC4_block16", "tableC7_sampling_law"]


def _rows(path: Path, law: str = "evaluation", paths: int | None = None) -> pd.DataFrame:
    df = read_table(path)
    df = df[df["law"] == law]
    if paths is not None:
        df = df[df["paths"] == paths]
    return df.set_index("slot").sort_index()


def tableC3_finite_m(inputs: Mapping[str, Path], spec: Mapping[str, Any], out_dir: Path
                     ) -> dict[str, str]:
    """Table C.3: T^(0) and the split-half T^(1) at every M on nested paths, the absolute change
    from each M to the largest, and the split-half fit check (T^(0) split - in-sample)."""
    path = inputs["finite_m"]
    df = read_table(path)
    ms = sorted(int(m) for m in df["paths"].unique())
    top = _rows(path, paths=ms[-1])
    slots = list(top.index)
    lines, values = [], {}
    for m in ms:
        r = _rows(path, paths=m)
        lines.append([f"$T^{{(0)}}$, $M={m}$", *[fmt(r.at[k, "t0"], 4) for k in slots]])
        lines.append([f"$T^{{(1)}}$, $M={m}$", *[fmt(r.at[k, "t1_split"], 4) for k in slots]])
    for m in ms[:-1]:
        r = _rows(path, paths=m)
        for stat, sym in (("t0", "0"), ("t1_split", "1")):
            diff = (top[stat] - r[stat]).abs()
            lines.append([f"$|T^{{({sym})}}_{{M={ms[-1]}}}-T^{{({sym})}}_{{M={m}}}|$",
                          *[fmt(diff.at[k], 4) for k in slots]])
            if m == ms[0]:
                values[macro_name("finite", "m", "smallest", "T", sym, "max", "diff")] = fmt(
                    float(diff.iloc[1:].max()), 4)
    lines.append([f"fit check $T^{{(0)}}_{{\\mathrm{{split}}}}-T^{{(0)}}$, $M={ms[-1]}$",
                  *[fmt_signed(top.at[k, "fit_diff"], 4) for k in slots]])
    shown = pd.DataFrame(lines, columns=["slot $k$", *map(str, slots)])
    write_table(df, "tableC3_finite_m", tex_dir=out_dir, latex=shown)
    values[macro_name("finite", "m", "anchors")] = str(int(top["anchors"].max()))
    values[macro_name("finite", "m", "largest")] = str(ms[-1])
    values[macro_name("finite", "m", "smallest")] = str(ms[0])
    values[macro_name("finite", "m", "fit", "max")] = fmt(float(top["fit_diff"].abs().max()), 4)
    return values


def tableC4_block16(inputs: Mapping[str, Path], spec: Mapping[str, Any], out_dir: Path
                    ) -> dict[str, str]:
    """Table C.4: T^(0) and the split-half T^(1) by slot of the longer block, and the share of
    T^(0) one realised token removes."""
    path = inputs["block16"]
    meta = read_metadata(path)
    r = _rows(path)
    slots = list(r.index)
    lines = [["$T^{(0)}_k$", *[fmt(r.at[k, "t0"], 3) for k in slots]],
             ["$T^{(1)}_k$", *["--" if k == 0 else fmt(r.at[k, "t1_split"], 3) for k in slots]],
             ["removed", *["--" if k < 2 else fmt_pct(r.at[k, "share_removed"], 0)
                           for k in slots]]]
    shown = pd.DataFrame(lines, columns=["slot $k$", *map(str, slots)])
    write_table(read_table(path), "tableC4_block16", tex_dir=out_dir, latex=shown,
                column_format="l" + "r" * len(slots))
    last = slots[-1]
    deep = r.loc[2:, "share_removed"]
    return {
        macro_name("block", "gamma"): str(int(meta.get("gamma", last + 1))),
        macro_name("block", "anchors"): str(int(r["anchors"].max())),
        macro_name("block", "T0", "last"): fmt(r.at[last, "t0"], 3),
        macro_name("block", "T1", "last"): fmt(r.at[last, "t1_split"], 3),
        macro_name("block", "accept", "last"): fmt_pct(1 - r.at[last, "t0"]),
        macro_name("block", "removed", "range"): fmt_range(fmt_pct(float(deep.min())),
                                                          fmt_pct(float(deep.max()))),
    }


def tableC7_sampling_law(inputs: Mapping[str, Path], spec: Mapping[str, Any], out_dir: Path
                         ) -> dict[str, str]:
    """Table C.7: on the same anchors, T^(0) and T^(1) under the evaluation law and under the
    drafters' training law, by slot, and the relative change of the final-slot floor."""
    path = inputs["sampling_law"]
    meta = read_metadata(path)
    base, train = _rows(path, "evaluation"), _rows(path, "variant")
    slots = list(base.index)
    lines = [[str(k), fmt(base.at[k, "t0"], 3), fmt(train.at[k, "t0"], 3),
              "--" if k == 0 else fmt(base.at[k, "t1_split"], 3),
              "--" if k == 0 else fmt(train.at[k, "t1_split"], 3)] for k in slots]
    shown = pd.DataFrame(lines, columns=["slot", "$T^{(0)}$ base", "$T^{(0)}$ train",
                                         "$T^{(1)}$ base", "$T^{(1)}$ train"])
    write_table(read_table(path), "tableC7_sampling_law", tex_dir=out_dir, latex=shown)
    law = (meta.get("laws") or {}).get("variant", {})
    last = slots[-1]
    change = train.at[last, "t0"] / base.at[last, "t0"] - 1 if base.at[last, "t0"] > 0 \
        else math.nan
    return {
        macro_name("law", "anchors"): str(int(base["anchors"].max())),
        macro_name("law", "train", "description"):
            f"temperature {law.get('temperature', 1):g}, top-$p$ {law.get('top_p', 1):g}, "
            f"top-$k$ {law.get('top_k', 0)}",
        macro_name("law", "T0", "base", "last"): fmt(base.at[last, "t0"], 3),
        macro_name("law", "T0", "train", "last"): fmt(train.at[last, "t0"], 3),
        macro_name("law", "T0", "change", "last"): fmt_pct(change, 0),
    }


def tableC2_replication(inputs: Mapping[str, Path], spec: Mapping[str, Any], out_dir: Path
                        ) -> dict[str, str]:
    """Table C.2: on the anchors the second engine read, by slot, T^(0) from the rollouts' full
    vocabulary (transformers) and from the engine's top-K reads of its own paths (with the band
    E[r]) and their paired difference; T^(1) by the rollouts' two routes (split-half grouping on
    covered paths, covered-mass weighted, and importance reweighting) and the engine's held-out
    T^(1)."""
    rep = read_table(inputs["replication"])
    meta = read_metadata(inputs["replication"])
    full = read_table(inputs["anchor_slot"])
    rep = rep[rep["complete"]]
    df = rep.merge(full[["anchor_id", "slot", "t0", "t1_split_cov", "t1_covered_mass",
                         "t1_reweighted"]], on=["anchor_id", "slot"], suffixes=("_api", ""),
                   validate="one_to_one")
    rows = []
    for k, g in df.groupby("slot", sort=True):
        split, _ = covered_floor_ratios(g["t1_covered_mass"], g["t1_split_cov"])
        held, _ = covered_floor_ratios(g["t1_covered_mass_api"], g["t1_split_cov_api"])
        rw = g["t1_reweighted"].dropna()
        rows.append({"slot": int(k), "anchors": int(len(g)), "t0_full": float(g["t0"].mean()),
                     "t0_engine": float(g["t0_api"].mean()),
                     "t0_diff": float((g["t0_api"] - g["t0"]).mean()),
                     "band": float(g["omitted"].mean()), "t1_split": split,
                     "t1_importance": float(rw.mean()) if len(rw) else math.nan,
                     "t1_engine": held})
    out = pd.DataFrame(rows)
    k_top = meta.get("top_k", "K")
    shown = pd.DataFrame(
        [[str(r.slot), fmt(r.t0_full, 4), fmt(r.t0_engine, 4), fmt_signed(r.t0_diff, 4),
          fmt(r.band, 4), "--" if r.slot == 0 else fmt(r.t1_split, 4),
          "--" if r.slot == 0 else fmt(r.t1_importance, 4),
          "--" if r.slot == 0 else fmt(r.t1_engine, 4)] for r in out.itertuples(index=False)],
        columns=["slot", "$T^{(0)}$ full", f"$T^{{(0)}}$ top-{k_top}", "difference",
                 "$\\mathbb{E}[r]$", "$T^{(1)}$ split", "$T^{(1)}$ importance",
                 f"$T^{{(1)}}$ top-{k_top}"])
    write_table(out, "tableC2_replication", tex_dir=out_dir, latex=shown)
    deep = out[out["slot"] >= 1]
    last = out.iloc[-1]
    return {
        macro_name("replication", "anchors"): str(int(out["anchors"].max())),
        macro_name("replication", "paths"): str(meta.get("paths", "--")),
        macro_name("replication", "top", "k"): str(k_top),
        macro_name("replication", "T0", "max", "diff"): fmt(float(deep["t0_diff"].abs().max()),
                                                            4),
        macro_name("replication", "T1", "routes", "diff", "last"): fmt_signed(
            float(last["t1_importance"] - last["t1_split"]), 4),
        macro_name("replication", "band", "last"): fmt(float(last["band"]), 4),
    }
