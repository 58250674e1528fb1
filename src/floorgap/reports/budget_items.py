"""Paper items of Appendix E, the drafter budget study: Fig. E and Table E.

Both read ``results/<target>/gaps/budget.parquet`` (``floorgap gaps`` over the ``budget``
evaluation group: every epoch of each study drafter, labelled ``<drafter>@epoch-<e>``) and
each study drafter's training log (``drafters/<drafter>/train_log.jsonl``, whose epoch records
count the blocks trained on). ``spec["budget"]`` holds the config entry of every study drafter
(kind, layers, objective, init, blocks) and ``spec["train_epochs"]`` its epochs.

The held-out risk is the evaluation probe's on the floor paths: R_k for an order-0 drafter,
R^oracle_k (all paths) for an order-1 drafter.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from floorgap.reports.common import fmt, item_figure, macro_name, save_item_figure
from floorgap.reports.gap_items import (
    GapSummary,
    _ci,
    _epoch_of,
    _table,
)

__all__ = ["figE_drafter_learning", "tableE_drafter_budget", "study_runs"]


def _risk_statistic(s: GapSummary, label: str) -> str:
    """R for an order-0 drafter, R^oracle on every path for an order-1 drafter."""
    return "R" if s.get("order", label) == 0 else "R_oracle_all"


def _trained_blocks(inputs: Mapping[str, Path], drafter: str) -> int:
    """Blocks of one training epoch, from the drafter's training log."""
    path = inputs.get(f"log_{drafter}")
    if path is None:
        raise ValueError(f"no training log given for the study drafter {drafter!r} "
                         f"(input log_{drafter})")
    epochs = [r for r in map(json.loads, Path(path).read_text().splitlines())
              if r.get("kind") == "epoch"]
    if not epochs:
        raise ValueError(f"{path} holds no epoch record")
    return int(epochs[-1]["examples"])


def study_runs(inputs: Mapping[str, Path], spec: Mapping[str, Any]) -> pd.DataFrame:
    """One row per study drafter and epoch: its settings, trained blocks and the held-out risk
    by slot with tau (estimate and interval)."""
    s = GapSummary(inputs["summary"])
    rows = []
    for label in s.variants:
        parsed = _epoch_of(label)
        if parsed is None or parsed[0] not in spec["budget"]:
            continue
        drafter, epoch = parsed
        entry = spec["budget"][drafter]
        stat = _risk_statistic(s, label)
        row = {"drafter": drafter, "epoch": epoch, "kind": entry["kind"],
               "layers": int(entry["layers"]), "objective": entry.get("objective", "ce"),
               "init": entry.get("init", "random"), "blocks": _trained_blocks(inputs, drafter),
               "epochs": int(spec["train_epochs"][drafter]), "risk": stat,
               "tau": s.get("tau", label), "tau_lower": s.get("tau", label, field="lower"),
               "tau_upper": s.get("tau", label, field="upper"), "label": label}
        for k in s.slots:
            row[f"R_{k}"] = s.get(stat, label, k)
        rows.append(row)
    if not rows:
        raise ValueError(f"{inputs['summary']} holds no <drafter>@epoch-<e> records of the study "
                         "drafters (is it the budget summary?)")
    return pd.DataFrame(rows).sort_values(["kind", "layers", "objective", "init", "blocks",
                                           "epoch"]).reset_index(drop=True)


def _recipe(row: Mapping[str, Any]) -> str:
    return f"{row['kind']}, {row['layers']}L, {row['objective']}, init {row['init']}"


def figE_drafter_learning(inputs: Mapping[str, Path], spec: Mapping[str, Any], out_dir: Path
                          ) -> dict[str, str]:
    """Fig. E: held-out risk at the first and last slot against training blocks (log axis),
    one line per recipe and epoch (left: R_0, right: R_{gamma-1})."""
    runs = study_runs(inputs, spec)
    last = max(int(c.split("_")[1]) for c in runs.columns if c.startswith("R_"))
    runs["recipe"] = runs.apply(_recipe, axis=1)
    final = runs["epoch"] == runs["epochs"]
    fig, axes = item_figure(spec, 2)
    colours: dict[str, Any] = {}
    # one solid line per recipe through each drafter's final epoch, dashed for earlier epochs
    curves = [(recipe, "final epoch", grp) for recipe, grp in runs[final].groupby("recipe")]
    curves += [(recipe, f"epoch {epoch}", grp)
               for (recipe, epoch), grp in runs[~final].groupby(["recipe", "epoch"])]
    for recipe, which, grp in curves:
        grp = grp.sort_values("blocks")
        for ax, k in zip(axes, (0, last), strict=True):
            line, = ax.plot(grp["blocks"], grp[f"R_{k}"], marker="o" if len(grp) > 1 else "s",
                            linestyle="-" if which == "final epoch" else "--",
                            color=colours.get(recipe), label=f"{recipe}, {which}")
            colours.setdefault(recipe, line.get_color())
    for ax, k in zip(axes, (0, last), strict=True):
        ax.set_xscale("log")
        ax.set_xlabel("training blocks")
        ax.set_ylabel(f"held-out risk at slot {k}")
    axes[1].legend(fontsize="x-small")
    save_item_figure(fig, "figE_drafter_learning", out_dir, spec)
    finals = runs[final]
    best = finals.loc[finals[f"R_{last}"].idxmin()]
    # how fast the best recipe's final-epoch risk falls over its last stretch of data
    curve = finals[finals["recipe"] == best["recipe"]].sort_values("blocks")
    slope = math.nan
    if len(curve) >= 2 and curve["blocks"].iloc[-1] > curve["blocks"].iloc[-2]:
        slope = ((curve["R_0"].iloc[-1] - curve["R_0"].iloc[-2])
                 / math.log10(curve["blocks"].iloc[-1] / curve["blocks"].iloc[-2]))
    return {
        macro_name("budget", "drop", "first"): fmt(-slope, 3),  # per tenfold more blocks
        macro_name("budget", "best", "risk", "first"): fmt(best["R_0"], 2),
        macro_name("budget", "best", "risk", "last"): fmt(best[f"R_{last}"], 2),
        macro_name("budget", "best", "blocks"): str(int(best["blocks"])),
        macro_name("budget", "max", "blocks"): str(int(runs["blocks"].max())),
        macro_name("budget", "min", "blocks"): str(int(runs["blocks"].min())),
    }


def tableE_drafter_budget(inputs: Mapping[str, Path], spec: Mapping[str, Any], out_dir: Path
                          ) -> dict[str, str]:
    """Table E: every study drafter at its final epoch: recipe, trained blocks, held-out risk
    at every slot and the offline accepted length tau with its interval."""
    runs = study_runs(inputs, spec)
    s = GapSummary(inputs["summary"])
    final = runs[runs["epoch"] == runs["epochs"]]
    ks = s.slots
    rows = []
    for _, r in final.iterrows():
        rows.append([r["drafter"].replace("_", "\\_"), str(r["layers"]), r["objective"],
                     r["init"], str(int(r["blocks"])), str(int(r["epochs"])),
                     *[fmt(r[f"R_{k}"], 2) for k in ks], fmt(r["tau"], 2),
                     _ci(s, "tau", r["label"], digits=2)])
    header = ["Drafter", "Layers", "Objective", "Init", "Blocks", "Epochs",
              *[f"$R_{{{k}}}$" for k in ks], "$\\tau$", "95\\% CI"]
    _table(rows, header, "tableE_drafter_budget", out_dir, runs.to_dict("records"))
    values = {}
    for _, r in final.iterrows():
        stem = r["drafter"]
        values[macro_name("budget", stem, "tau")] = fmt(r["tau"], 2)
        values[macro_name("budget", stem, "risk", "first")] = fmt(r["R_0"], 2)
        values[macro_name("budget", stem, "risk", "last")] = fmt(r[f"R_{ks[-1]}"], 2)
        values[macro_name("budget", stem, "blocks")] = str(int(r["blocks"]))
    if any(not math.isfinite(float(r["tau"])) for _, r in final.iterrows()):
        raise ValueError("a study drafter has no finite tau; its evaluation records are incomplete")
    return values
