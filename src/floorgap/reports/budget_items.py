"""Paper items of Appendix E, the drafter budget study: Fig. E and Table E.

Both read ``results/<target>/gaps/budget.parquet`` (``floorgap gaps`` over the ``budget``
evaluation group: every epoch of the study's variants, labelled ``<drafter>@epoch-<e>``, and the
kept weights of each study arm, labelled by its name) and each study drafter's training log
(``drafters/<drafter>/train_log.jsonl``, whose epoch records count the blocks and optimiser
steps trained and hold the held-out risk on the training record's held-out sequences).
``spec["budget"]`` holds the config entry of every study drafter (kind, layers, objective, init,
vocab, mask_embedding, blocks) and of every study table (a lookup table fitted on ``blocks``,
named in ``spec["lookups"]``), ``spec["train_epochs"]`` each drafter's epochs.

The study keeps data and optimiser steps apart: (a) epochs at fixed data (the variants' epochs),
(b) data: the kept arms of each recipe trained at several sizes (the default's arms at a fixed
number of steps, blocks x epochs about constant; a data-curve study's arms each at its best
held-out epoch), beside the tables fitted on the same subsets, (c) one setting changed at a time
(the other arms, against the (b) arm with as many blocks). The held-out risk is the evaluation
probe's on the floor paths: R_k for an order-0 drafter or table, R^oracle_k (all paths) for an
order-1 one.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from floorgap.records import best_epoch
from floorgap.reports.common import (GapSummary, epoch_of, fmt, fmt_signed, gap_ci, item_figure,
                                     macro_name, save_item_figure, tex_text, write_item_table)

__all__ = ["figE_drafter_learning", "tableE_drafter_budget", "study_runs"]

#: The first-slot risk the study's extrapolation aims at (the drafter-convergence target).
TARGET_RISK_FIRST = 0.50


def _risk_statistic(s: GapSummary, label: str) -> str:
    """R for an order-0 drafter, R^oracle on every path for an order-1 drafter."""
    return "R" if s.get("order", label) == 0 else "R_oracle_all"


def _training_log(inputs: Mapping[str, Path], drafter: str) -> list[dict[str, Any]]:
    """The epoch records of one study drafter's training log."""
    path = inputs.get(f"log_{drafter}")
    if path is None:
        raise ValueError(f"no training log given for the study drafter {drafter!r} "
                         f"(input log_{drafter})")
    epochs = [r for r in map(json.loads, Path(path).read_text().splitlines())
              if r.get("kind") == "epoch"]
    if not epochs:
        raise ValueError(f"{path} holds no epoch record")
    return epochs


def _table_row(drafter: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    """A study table's settings: fitted on ``blocks``, no layers, epochs or optimiser steps."""
    return {"drafter": drafter, "epoch": 0, "weights": "table", "kind": entry["kind"],
            "layers": 0, "objective": "", "init": "", "vocab": 0, "mask": "",
            "blocks": int(entry["blocks"]), "epochs": 0, "steps": 0, "heldout_R_0": math.nan}


def _drafter_row(inputs: Mapping[str, Path], spec: Mapping[str, Any], drafter: str,
                 epoch: int | None) -> dict[str, Any]:
    """A study drafter's settings, its blocks of one epoch (from its training log), epochs,
    optimiser steps and the log's held-out slot-0 risk at its kept epoch."""
    entry = spec["budget"][drafter]
    log = _training_log(inputs, drafter)
    trained = int(spec["train_epochs"][drafter])
    kept = best_epoch(log)
    return {"drafter": drafter, "epoch": epoch if epoch is not None else trained,
            "weights": "epoch" if epoch is not None else "kept", "kind": entry["kind"],
            "layers": int(entry["layers"]), "objective": entry.get("objective", "ce"),
            "init": entry.get("init", "random"), "vocab": int(entry.get("vocab") or 0),
            "mask": "embedding" if entry.get("mask_embedding") else "token",
            "blocks": int(log[-1]["examples"]), "epochs": trained,
            "steps": int(sum(r.get("steps", 0) for r in log)),
            # the log's held-out sequences at the kept (best held-out) epoch, slot 0
            "heldout_R_0": next((r["heldout"]["tv_by_slot"][0] for r in log
                                 if "heldout" in r and int(r["epoch"]) == kept), math.nan)}


def study_runs(inputs: Mapping[str, Path], spec: Mapping[str, Any]) -> pd.DataFrame:
    """One row per evaluated study drafter or table: its settings, the blocks of one epoch,
    its epochs and optimiser steps, which weights were evaluated (``epoch`` e of a studied
    variant, the ``kept`` weights of an arm: its best held-out epoch, or a ``table`` fitted on
    the arm's subset), and the held-out risk by slot with tau (estimate and interval)."""
    s = GapSummary(inputs["summary"])
    tables = spec.get("lookups") or {}
    rows = []
    for label in s.variants:
        parsed = epoch_of(label)
        drafter, epoch = parsed if parsed is not None else (label, None)
        if drafter not in spec["budget"]:
            continue
        row = (_table_row(drafter, spec["budget"][drafter]) if drafter in tables
               else _drafter_row(inputs, spec, drafter, epoch))
        stat = _risk_statistic(s, label)
        row.update({"risk": stat, "tau": s.get("tau", label),
                    "tau_lower": s.get("tau", label, field="lower"),
                    "tau_upper": s.get("tau", label, field="upper"), "label": label})
        rows.append(row | {f"R_{k}": s.get(stat, label, k) for k in s.slots})
    if not rows:
        raise ValueError(f"{inputs['summary']} holds no records of the study drafters (is it "
                         "the budget summary?)")
    return pd.DataFrame(rows).sort_values(["kind", "layers", "objective", "init", "vocab",
                                           "mask", "blocks", "epoch"]).reset_index(drop=True)


def _recipe(row: Mapping[str, Any]) -> str:
    if row["weights"] == "table":
        return f"{row['kind']} table"
    vocab = f"vocab {row['vocab']}" if row["vocab"] else "full vocab"
    return (f"{row['kind']}, {row['layers']}L, {row['objective']}, init {row['init']}, {vocab}, "
            f"mask {row['mask']}")


def _parts(runs: pd.DataFrame, spec: Mapping[str, Any]
           ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(a) the studied variants' epochs, (b) the kept arms of each recipe trained at several
    sizes (the data), (c) the kept arms of the other recipes (one change each), (d) the tables
    fitted on the arms' subsets; (b) to (d) carry their ``recipe``."""
    runs = runs.assign(recipe=runs.apply(_recipe, axis=1))
    epochs = runs[runs["weights"] == "epoch"]
    kept = runs[runs["weights"] == "kept"]
    sizes = kept.groupby("recipe")["blocks"].nunique()
    curves = set(sizes[sizes > 1].index)
    return (epochs, kept[kept["recipe"].isin(curves)], kept[~kept["recipe"].isin(curves)],
            runs[runs["weights"] == "table"])


def _base_curve(data: pd.DataFrame) -> pd.DataFrame:
    """The recipe the extrapolation follows: an order-0 one (R_0 is its risk) before an order-1
    one, then the one with the most sizes."""
    if data.empty:
        return data
    key = data.groupby("recipe").agg(order1=("risk", lambda r: (r != "R").any()),
                                     sizes=("blocks", "nunique"))
    best = key.sort_values(["order1", "sizes"], ascending=[True, False]).index[0]
    return data[data["recipe"] == best]


def _fit_per_decade(blocks: pd.Series, risk: pd.Series) -> tuple[float, float]:
    """Least-squares (intercept, slope) of risk on log10(blocks); NaN with fewer than two
    distinct sizes."""
    x, y = np.log10(blocks.to_numpy(float)), risk.to_numpy(float)
    ok = np.isfinite(y)
    if len(set(x[ok])) < 2:
        return math.nan, math.nan
    slope, intercept = np.polyfit(x[ok], y[ok], 1)
    return float(intercept), float(slope)


def _epoch_sentence(epochs: pd.DataFrame) -> str:
    """What the epoch curve (a) says about more epochs on the same data, from its first-slot
    risk: still falling at the last epoch, or lowest before it."""
    if epochs.empty:
        return "no drafter was studied epoch by epoch."
    by_epoch = epochs.groupby("epoch")["R_0"].min().sort_index()
    best, last = int(by_epoch.idxmin()), int(by_epoch.index.max())
    if best == last:
        return (f"the first-slot risk is lowest after the last epoch, {last}, so it still falls "
                "there and more epochs on the same data may still lower it.")
    return (f"the first-slot risk is lowest after epoch {best} of {last} and no lower after "
            f"the later ones, so more epochs on the same data did not lower it beyond epoch "
            f"{best}.")


def _data_sentence(slope: float, need: float) -> str:
    """What the data curve (b) says: the first-slot risk's change per tenfold more blocks and,
    when it falls, the straight line's extrapolation to the target risk."""
    if not math.isfinite(slope):
        return "fewer than two sizes were trained, so no line is fitted."
    if slope >= 0:
        return (f"the first-slot risk rises by {slope:.3f} per tenfold increase in training "
                "blocks, so on these sizes more data at a fixed number of steps did not lower it.")
    blocks = f"{need:,.0f}" if math.isfinite(need) else "no finite number of"
    return (f"the first-slot risk falls by {-slope:.3f} per tenfold increase in training "
            f"blocks, and a straight line through these points reaches "
            f"$R_0={TARGET_RISK_FIRST:.2f}$ at {blocks} blocks (an extrapolation beyond the "
            "sizes studied, so a rough guide only).")


def figE_drafter_learning(inputs: Mapping[str, Path], spec: Mapping[str, Any], out_dir: Path
                          ) -> dict[str, str]:
    """Fig. E: (a) held-out risk at the first and last slot by epoch on all the data (the
    training log's held-out sequences dotted), (b) against training blocks (log axis) for
    each recipe trained at several sizes, beside the tables fitted on the same subsets, (c) one
    setting changed at a time."""
    runs = study_runs(inputs, spec)
    last = max(int(c.split("_")[1]) for c in runs.columns if c.startswith("R_"))
    epochs, data, changes, tables = _parts(runs, spec)
    fig, axes = item_figure(spec, 3)
    for drafter, grp in epochs.groupby("drafter"):
        grp = grp.sort_values("epoch")
        for k, style in ((0, "o-"), (last, "s--")):
            axes[0].plot(grp["epoch"], grp[f"R_{k}"], style, label=f"{drafter} $R_{{{k}}}$")
        log = _training_log(inputs, drafter)
        held = [r for r in log if "heldout" in r]
        if held:
            for k in (0, last):
                axes[0].plot([r["epoch"] for r in held],
                             [r["heldout"]["tv_by_slot"][k] for r in held], ":", color="grey",
                             label="held-out training sequences" if k == 0 else None)
    axes[0].set_xlabel("epoch (all the data)")
    for recipe, grp in data.groupby("recipe", sort=True):
        grp = grp.sort_values("blocks")
        name = f"{grp['kind'].iloc[0]} ({grp['init'].iloc[0]})"
        line = None
        for k, style in ((0, "o-"), (last, "s--")):
            line, = axes[1].plot(grp["blocks"], grp[f"R_{k}"], style,
                                 color=None if line is None else line.get_color(),
                                 label=f"{name} $R_{{{k}}}$")
        held = grp[grp["heldout_R_0"].notna()]
        if not held.empty:  # the training log's held-out sequences at the kept epoch
            axes[1].plot(held["blocks"], held["heldout_R_0"], ":", color=line.get_color(),
                         label=f"{name} held-out $R_0$")
    for kind, grp in tables.groupby("kind", sort=True):
        grp = grp.sort_values("blocks")
        for k, style in ((0, "x-"), (last, "+--")):
            axes[1].plot(grp["blocks"], grp[f"R_{k}"], style, color="black", linewidth=0.8,
                         label=f"{kind} table $R_{{{k}}}$")
    if not (data.empty and tables.empty):
        axes[1].set_xscale("log")
    axes[1].set_xlabel("training blocks (kept weights)")
    base = _base_curve(data)   # the (b) recipe the changed arms are set against
    ref = {int(b): r for b, r in base.set_index("blocks").iterrows()}
    names = list(changes["drafter"])
    y = np.arange(len(names))
    if len(names):
        axes[2].plot(changes["R_0"], y, "o", label="$R_0$")
        axes[2].plot(changes[f"R_{last}"], y, "s", label=f"$R_{{{last}}}$")
        for b, r in ref.items():
            if b in set(changes["blocks"]):
                axes[2].axvline(r["R_0"], color="grey", linestyle=":", linewidth=1)
                axes[2].axvline(r[f"R_{last}"], color="grey", linestyle="--", linewidth=1)
        axes[2].set_yticks(y, names, fontsize="x-small")
    axes[2].set_xlabel("held-out risk (grey: unchanged recipe)")
    axes[0].set_ylabel("held-out risk")
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="x-small")
    save_item_figure(fig, "figE_drafter_learning", out_dir, spec)
    kept = runs[runs["weights"] == "kept"]
    best = (kept if not kept.empty else runs).sort_values(f"R_{last}").iloc[0]
    intercept, slope = _fit_per_decade(base["blocks"], base["R_0"]) if len(base) else \
        (math.nan, math.nan)
    need = 10 ** ((TARGET_RISK_FIRST - intercept) / slope) if slope < 0 else math.inf
    best_row = (epochs.sort_values("R_0").iloc[0] if not epochs.empty else best)
    return {
        macro_name("budget", "epoch", "sentence"): _epoch_sentence(epochs),
        macro_name("budget", "data", "sentence"): _data_sentence(slope, need),
        macro_name("budget", "change", "first"): fmt_signed(slope, 3),  # per tenfold blocks
        macro_name("budget", "fixed", "steps"): str(int(base["steps"].median()))
        if len(base) else "0",
        macro_name("budget", "best", "epoch"): str(int(best_row["epoch"])),
        macro_name("budget", "epochs", "studied"): str(int(epochs["epoch"].max()))
        if len(epochs) else "0",
        macro_name("budget", "best", "risk", "first"): fmt(best["R_0"], 2),
        macro_name("budget", "best", "risk", "last"): fmt(best[f"R_{last}"], 2),
        macro_name("budget", "best", "blocks"): str(int(best["blocks"])),
        macro_name("budget", "max", "blocks"): str(int(runs["blocks"].max())),
        macro_name("budget", "min", "blocks"): str(int(runs["blocks"].min())),
    }


def tableE_drafter_budget(inputs: Mapping[str, Path], spec: Mapping[str, Any], out_dir: Path
                          ) -> dict[str, str]:
    """Table E: every study drafter evaluated (the variants by epoch, the arms' kept weights)
    and every study table: recipe, blocks, epochs, optimiser steps, held-out risk at every slot
    and the offline accepted length tau with its interval."""
    runs = study_runs(inputs, spec)
    s = GapSummary(inputs["summary"])
    ks = s.slots
    rows = []
    for _, r in runs.iterrows():
        name = r["drafter"] + {"epoch": f" @{r['epoch']}", "kept": "",
                               "table": f" ({r['kind']} table)"}[r["weights"]]
        settings = ([str(r["layers"]), tex_text(r["objective"]), tex_text(r["init"]),
                     str(r["vocab"] or "full"), tex_text(r["mask"])]
                    if r["weights"] != "table" else ["--"] * 5)
        rows.append([tex_text(name), *settings, str(int(r["blocks"])),
                     str(int(r["steps"])) if r["weights"] != "table" else "--",
                     *[fmt(r[f"R_{k}"], 2) for k in ks],
                     fmt(r["tau"], 2), gap_ci(s, "tau", r["label"], digits=2)])
    header = ["Drafter", "Layers", "Objective", "Init", "Vocab", "Mask", "Blocks", "Steps",
              *[f"$R_{{{k}}}$" for k in ks], "$\\tau$", "95\\% CI"]
    write_item_table(rows, header, "tableE_drafter_budget", out_dir, runs.to_dict("records"))
    values = {}
    for _, r in runs[runs["weights"] != "epoch"].iterrows():
        stem = r["drafter"]
        values[macro_name("budget", stem, "tau")] = fmt(r["tau"], 2)
        values[macro_name("budget", stem, "risk", "first")] = fmt(r["R_0"], 2)
        values[macro_name("budget", stem, "risk", "last")] = fmt(r[f"R_{ks[-1]}"], 2)
        values[macro_name("budget", stem, "blocks")] = str(int(r["blocks"]))
    if any(not math.isfinite(float(r["tau"])) for _, r in runs.iterrows()):
        raise ValueError("a study drafter has no finite tau; its evaluation records are incomplete")
    return values
