"""Paper items of the floors stage: Fig. 2, Fig. 3, Fig. D.2, Table 3 and Table D.1.

Every item reads only the floors summary of the primary target
(``results/<target>/floors/summary.parquet``, written by ``floorgap floors``), writes
its figure (``figures/<name>.pdf`` + ``.png``) or table (``paper/tables/<name>.tex`` + ``.csv``)
and returns the macros of the numbers the text cites. Signature of an item:
``item(inputs, spec, out_dir) -> {macro: value}`` with ``inputs["summary"]`` the summary path,
``spec`` the plotting options (figures only) and ``out_dir`` the output folder.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from floorgap.reports.common import (LongSummary, fmt, fmt_interval, fmt_pct, fmt_pct_interval,
                                     fmt_signed, item_figure, macro_name, save_item_figure,
                                     tex_text, write_table)

__all__ = ["FloorSummary", "domain_label", "fig2_floor_by_slot", "fig3_floor_by_domain",
           "figD2_kmedian", "table3_floor_intervals", "tableD1_concentration", "tableC6_top20"]


class FloorSummary(LongSummary):
    """Lookup over the long-format floors summary."""

    columns = LongSummary.columns | {"n_anchors"}
    kind = "floors summary"

    def __init__(self, path: str | Path):
        super().__init__(path)
        self.gamma = int(self.scalar("gamma"))
        self.last = self.gamma - 1
        self.slots = list(range(1, self.gamma))
        self.domains = [d for d in self.df["domain"].unique() if d != "all"]

    def rows(self, statistic: str, domain: str = "all") -> pd.DataFrame:
        """Rows of one statistic and scope, indexed by slot."""
        df = self.df[(self.df["statistic"] == statistic) & (self.df["domain"] == domain)]
        return df.set_index("slot").sort_index()

    def get(self, statistic: str, slot: int, domain: str = "all", field: str = "estimate"
            ) -> float:
        df = self.rows(statistic, domain)
        return float(df.at[slot, field]) if slot in df.index else float("nan")

    def scalar(self, statistic: str, domain: str = "all") -> float:
        return self.get(statistic, -1, domain)

    def series(self, statistic: str, slots: list[int], domain: str = "all"
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        df = self.rows(statistic, domain).reindex(slots)
        return tuple(df[c].to_numpy(float, copy=True) for c in ("estimate", "lower", "upper"))

    @property
    def level(self) -> float:
        return float((self.meta.get("analysis") or {}).get("level", 0.95))


#: Separator of the domain ordering in the values (LaTeX text mode).
ORDER_SEP = " \\textgreater{} "


def domain_label(domain: str, facts: Mapping[str, Any] | None) -> str:
    """A domain's display name; a stand-in says which dataset stands in, e.g.
    "mbpp (HumanEval stand-in)"."""
    facts = facts or {}
    if facts.get("stand_in_for"):
        return f"{domain} ({facts.get('dataset_short') or 'substitute'} stand-in)"
    return domain


def _count(value: float) -> str:
    return "--" if not math.isfinite(value) else str(round(value))


# -- figures ------------------------------------------------------------------------------------

def _figure(spec: Mapping[str, Any]):
    fig, (ax,) = item_figure(spec)
    return fig, ax


def _common_values(s: FloorSummary) -> dict[str, str]:
    return {
        macro_name("floor", "target"): tex_text(s.target),
        macro_name("floor", "anchors"): _count(s.scalar("n_anchors")),
        macro_name("floor", "prompts"): _count(s.scalar("n_prompts")),
        macro_name("floor", "domains"): str(len(s.domains)),
        macro_name("floor", "paths"): _count(s.scalar("paths_per_anchor")),
        macro_name("floor", "gamma"): str(s.gamma),
        macro_name("floor", "last", "slot"): str(s.last),
        macro_name("floor", "top", "K"): _count(s.scalar("store_top_k")),
        macro_name("floor", "bootstrap"): _count(s.scalar("bootstrap_replicates")),
        macro_name("floor", "level"): fmt_pct(s.level, 0),
        macro_name("floor", "records", "corrupt"): _count(s.scalar("records_corrupt")),
        macro_name("floor", "records", "missing"): _count(s.scalar("records_missing")),
        macro_name("floor", "stand", "ins"): _stand_ins(s),
        macro_name("floor", "domain", "list"): _and_list(map(tex_text, s.domains)),
    }


def _and_list(items: Iterable[str]) -> str:
    """``a, b and c``."""
    items = list(items)
    return " and ".join([", ".join(items[:-1]), items[-1]]) if len(items) > 1 else "".join(items)


def _stand_ins(s: FloorSummary) -> str:
    """The sentence that says which domains read a shipped stand-in for their dataset."""
    facts = s.meta.get("domains") or {}
    labels = [domain_label(d, facts.get(d)) for d in s.domains
              if (facts.get(d) or {}).get("stand_in_for")]
    if not labels:
        return "Every domain reads its own dataset."
    return ("Where a domain's dataset is not installable here a shipped set stands in for it, "
            "and every output carries its label: " + ", ".join(map(tex_text, labels)) + ".")


def fig2_floor_by_slot(inputs: Mapping[str, Path], spec: Mapping[str, Any],
                       out_dir: Path) -> dict[str, str]:
    """Fig. 2: T^(0) and T^(1) by slot, with prompt-bootstrap intervals. T^(1) is the
    split-half grouping estimate on its covered paths (the headline, paper App. B.3) with the
    bounds c T_cov .. c T_cov + 1 - c as a band; the importance route is the second estimate
    (App. C.2), drawn dashed."""
    s = FloorSummary.of(inputs)
    slots = list(range(s.gamma))
    x = np.array(slots)
    t0, t0_lo, t0_hi = s.series("T0", slots)
    t1, t1_lo, t1_hi = s.series("T1_split_covered", slots)
    rw = s.series("T1_reweighted", slots)[0]
    rw[0] = 0.0  # T^(1)_0 = 0: the committed token fixes the context
    lo_b = s.series("T1_split_lower", slots)[0]
    up_b = s.series("T1_split_upper", slots)[0]

    fig, ax = _figure(spec)
    ax.fill_between(x, lo_b, up_b, color="0.55", alpha=0.18, lw=0,
                    label=r"$T^{(1)}$ bounds ($c$)")
    ax.fill_between(x, t0_lo, t0_hi, color="C0", alpha=0.22, lw=0)
    ax.plot(x, t0, color="C0", marker="o", label=r"$T^{(0)}$")
    ax.fill_between(x, t1_lo, t1_hi, color="C3", alpha=0.22, lw=0)
    ax.plot(x, t1, color="C3", marker="^", label=r"$T^{(1)}$ split-half")
    ax.plot(x, rw, color="0.3", ls="--", marker="x", lw=0.9, label=r"$T^{(1)}$ importance")
    # TV floors lie in [0, 1]; the headroom holds the legend
    ax.set(xlabel="slot $k$", ylabel="information floor (TV)", xticks=slots, ylim=(0, 1.0),
           xlim=(-0.2, s.last + 0.2))
    handles, labels = ax.get_legend_handles_labels()
    order = [1, 2, 3, 0]  # T0, T1 split-half, T1 importance, bounds
    ax.legend([handles[i] for i in order], [labels[i] for i in order], loc="upper left",
              ncol=2, handlelength=1.5, columnspacing=0.8, borderaxespad=0.1,
              labelspacing=0.25)
    save_item_figure(fig, "fig2_floor_by_slot", out_dir, spec)
    return {**_common_values(s), **_fig2_values(s)}


#: The two routes to T^(1) and their share removed: (macro tag, T1 statistic, share statistic).
T1_ROUTES = (((), "T1_split_covered", "share_removed_split_covered"),
             (("importance",), "T1_reweighted", "share_removed_reweighted"))


def _fig2_values(s: FloorSummary) -> dict[str, str]:
    values: dict[str, str] = {}
    last = s.last
    for k in s.slots:
        values[macro_name("floor", "T0", "slot", k)] = fmt(s.get("T0", k))
        values[macro_name("floor", "covered", "mass", "slot", k)] = fmt(
            s.get("T1_covered_mass", k), 2)
    values[macro_name("floor", "T0", "last")] = fmt(s.get("T0", last))
    values[macro_name("floor", "max", "accept", "slot", 1)] = fmt_pct(1 - s.get("T0", 1), 0)
    values[macro_name("floor", "max", "accept", "last")] = fmt_pct(1 - s.get("T0", last), 0)
    for tag, t1_stat, share_stat in T1_ROUTES:
        for k in s.slots:
            values[macro_name("floor", "T1", *tag, "slot", k)] = fmt(s.get(t1_stat, k))
            values[macro_name("floor", "share", "removed", *tag, "slot", k)] = fmt_pct(
                s.get(share_stat, k))
        values[macro_name("floor", "T1", *tag, "last")] = fmt(s.get(t1_stat, last))
        t1 = [s.get(t1_stat, k) for k in s.slots[1:]]
        values[macro_name("floor", "T1", *tag, "max")] = fmt(np.nanmax(t1))
        shares = [s.get(share_stat, k) for k in s.slots[1:]]
        values[macro_name("floor", "share", "removed", *tag, "min")] = fmt_pct(
            np.nanmin(shares), 0)
        values[macro_name("floor", "share", "removed", *tag, "max")] = fmt_pct(
            np.nanmax(shares), 0)
        lo, hi = np.nanmin(shares), np.nanmax(shares)
        values[macro_name("floor", "share", "removed", *tag, "range")] = (
            f"{fmt_pct(lo, 0)}--{fmt_pct(hi, 0)}" if np.isfinite([lo, hi]).all() else "--")
        values[macro_name("floor", "share", "removed", *tag, "pooled")] = fmt_pct(
            s.get(share_stat, -1))
    values[macro_name("floor", "covered", "mass", "min")] = fmt(
        np.nanmin([s.get("T1_covered_mass", k) for k in s.slots]), 2)
    ess = [s.get("T1_reweighted_ess_mean", k) for k in s.slots]
    values[macro_name("floor", "ess", "min")] = fmt(np.nanmin(ess), 1)
    values[macro_name("floor", "ess", "max")] = fmt(np.nanmax(ess), 1)
    values[macro_name("floor", "reveal", "paths")] = _count(s.scalar("reveal_paths"))
    fit = [abs(s.get("T0_split_minus_T0", k)) for k in s.slots]
    values[macro_name("floor", "split", "fit", "max")] = fmt(np.nanmax(fit))
    return values


def fig3_floor_by_domain(inputs: Mapping[str, Path], spec: Mapping[str, Any],
                         out_dir: Path) -> dict[str, str]:
    """Fig. 3: T^(0) per slot per domain with prompt-bootstrap intervals."""
    s = FloorSummary.of(inputs)
    slots = list(range(s.gamma))
    facts = s.meta.get("domains") or {}
    fig, ax = _figure(spec)
    n = len(s.domains)
    markers = ["o", "s", "^", "D", "v", "P", "X", "*"]
    for i, d in enumerate(s.domains):
        est, lo, hi = s.series("T0", slots, d)
        x = np.array(slots) + (i - (n - 1) / 2) * 0.09
        ax.errorbar(x, est, yerr=[np.clip(est - lo, 0, None), np.clip(hi - est, 0, None)],
                    color=f"C{i}", marker=markers[i % len(markers)], capsize=1.5,
                    elinewidth=0.7, label=domain_label(d, facts.get(d)))
    ax.set(xlabel="slot $k$", ylabel=r"order-0 floor $T^{(0)}_k$ (TV)", xticks=slots,
           ylim=(0, 1.0))
    ax.legend(loc="lower right", handlelength=1.6, borderaxespad=0.2, labelspacing=0.25)
    save_item_figure(fig, "fig3_floor_by_domain", out_dir, spec)

    last = s.last
    values: dict[str, str] = {}
    at_last = {}
    for d in s.domains:
        at_last[d] = s.get("T0", last, d)
        values[macro_name("floor", "domain", d, "last")] = fmt(at_last[d])
        values[macro_name("floor", "domain", d, "slot", 1)] = fmt(s.get("T0", 1, d))
        values[macro_name("floor", "domain", d, "T1", "last")] = fmt(
            s.get("T1_split_covered", last, d))
        values[macro_name("floor", "domain", d, "anchors")] = _count(s.scalar("n_anchors", d))
        values[macro_name("floor", "domain", d, "prompts")] = _count(s.scalar("n_prompts", d))
        values[macro_name("floor", "domain", d, "label")] = domain_label(d, facts.get(d))
    values[macro_name("floor", "domain", "counts")] = _and_list(
        f"{tex_text(d)} {_count(s.scalar('n_anchors', d))} over {_count(s.scalar('n_prompts', d))}"
        for d in s.domains)
    ranked = sorted((d for d in at_last if math.isfinite(at_last[d])),
                    key=lambda d: -at_last[d])
    # \textgreater: a bare ">" prints as an inverted question mark in LaTeX's default encoding
    values[macro_name("floor", "domain", "order", "last")] = ORDER_SEP.join(ranked) or "--"
    if ranked:
        values[macro_name("floor", "domain", "highest", "last")] = ranked[0]
        values[macro_name("floor", "domain", "lowest", "last")] = ranked[-1]
    # Slots at which every open-ended domain is above every constrained one (paper Sec. 3.1).
    open_ended = [d for d in ("alpaca", "arena-hard") if d in s.domains]
    constrained = [d for d in ("gsm8k", "mbpp") if d in s.domains]
    if open_ended and constrained:
        above = [k for k in s.slots
                 if min(s.get("T0", k, d) for d in open_ended)
                 > max(s.get("T0", k, d) for d in constrained)]
        values[macro_name("floor", "domain", "open", "above", "slots")] = str(len(above))
    return values


def figD2_kmedian(inputs: Mapping[str, Path], spec: Mapping[str, Any],
                  out_dir: Path) -> dict[str, str]:
    """Fig. D.2: share of T^(0) removed by K oracle-routed prototypes per slot (K >= 2), with
    prompt-bootstrap intervals and a band down to the worst restart's share (restart spread)."""
    s = FloorSummary.of(inputs)
    ks = sorted(int(k) for k in (s.meta.get("analysis") or {}).get("kmedian_k", []))
    if not ks:
        ks = sorted(int(st.rsplit("K", 1)[1]) for st in s.df["statistic"].unique()
                    if st.startswith("kmedian_objective_K"))
    ks = [k for k in ks if k > 1]
    slots = s.slots
    x = np.array(slots, dtype=float)
    fig, ax = _figure(spec)
    markers = ["o", "s", "^", "D", "v"]
    n = len(ks)
    for i, K in enumerate(ks):
        est, lo, hi = s.series(f"kmedian_share_removed_K{K}", slots)
        worst = s.series(f"kmedian_share_removed_worst_K{K}", slots)[0]
        xs = x + (i - (n - 1) / 2) * 0.08
        ax.fill_between(xs, 100 * worst, 100 * est, color=f"C{i}", alpha=0.18, lw=0)
        ax.errorbar(xs, 100 * est, yerr=[100 * np.clip(est - lo, 0, None),
                                         100 * np.clip(hi - est, 0, None)],
                    color=f"C{i}", marker=markers[i % len(markers)], capsize=1.5,
                    elinewidth=0.7, label=f"$K={K}$")
    ax.set(xlabel="slot $k$", ylabel=r"share of $T^{(0)}_k$ removed (%)", xticks=slots,
           ylim=(0, 100))
    ax.legend(loc="upper right", handlelength=1.6, borderaxespad=0.2, labelspacing=0.25,
              title="prototypes (band: worst restart)",
              title_fontsize=ax.xaxis.label.get_size() - 1)
    save_item_figure(fig, "figD2_kmedian", out_dir, spec)

    last = s.last
    values: dict[str, str] = {}
    for K in ks:
        stat = f"kmedian_share_removed_K{K}"
        shares = [s.get(stat, k) for k in slots]
        for tag, share in (("last", s.get(stat, last)), ("min", np.nanmin(shares)),
                           ("max", np.nanmax(shares)), ("pooled", s.get(stat, -1))):
            values[macro_name("kmedian", "share", "K", K, tag)] = fmt_pct(share, 0)
    values[macro_name("kmedian", "spread", "zero", "share")] = fmt_pct(
        s.scalar("kmedian_spread_zero_share"), 0)
    values[macro_name("kmedian", "spread", "PNinety")] = fmt(s.scalar("kmedian_spread_p90"))
    values[macro_name("kmedian", "spread", "mean", "max")] = fmt(
        s.scalar("kmedian_spread_mean_max"))
    values[macro_name("kmedian", "spread", "max")] = fmt(s.scalar("kmedian_spread_max"), 2)
    values[macro_name("kmedian", "restarts")] = str(
        (s.meta.get("analysis") or {}).get("kmedian_restarts", "--"))
    return values


# -- tables -------------------------------------------------------------------------------------

#: The columns of a table's csv (:func:`_long`).
LONG_COLUMNS = ["quantity", "statistic", "domain", "slot", "estimate", "lower", "upper",
                "n_anchors"]


def _long(s: FloorSummary, rows: list[tuple[str, str, str]], slots: list[int] | None = None,
          columns: list[str] = LONG_COLUMNS) -> pd.DataFrame:
    """CSV frame: one row per (quantity, statistic, domain) x slot (default ``s.slots``)."""
    frames = []
    for label, stat, domain in rows:
        df = s.rows(stat, domain).reindex(s.slots if slots is None else slots).reset_index()
        df.insert(0, "quantity", label)
        df["statistic"], df["domain"] = stat, domain
        frames.append(df[columns])
    return pd.concat(frames, ignore_index=True)


def _slot_table(rows: list[list[str]], slots: list[int]) -> pd.DataFrame:
    """The LaTeX frame of a table with one column per slot."""
    return pd.DataFrame(rows, columns=["slot $k$"] + [str(k) for k in slots])


def table3_floor_intervals(inputs: Mapping[str, Path], spec: Mapping[str, Any],
                           out_dir: Path) -> dict[str, str]:
    """Table 3: per slot, the prompt-bootstrap intervals of T^(0), of T^(1) by split-half
    grouping (the headline, with its covered mass) and by the importance route (the second
    estimate, with its mean ESS), and of the share of T^(0) that one realised token removes
    by each route."""
    s = FloorSummary.of(inputs)
    interval_rows = [
        (r"$T_{k}^{(0)}$ (full vocabulary)", "T0", "num"),
        (r"$T_{k}^{(1)}$ (split-half, covered)", "T1_split_covered", "num"),
        (r"\quad covered mass $c_k$", "T1_covered_mass", "point"),
        (r"$(T_{k}^{(0)}-T_{k}^{(1)})/T_{k}^{(0)}$ (split-half)",
         "share_removed_split_covered", "pct"),
        (r"$T_{k}^{(1)}$ (importance route)", "T1_reweighted", "num"),
        (r"\quad mean ESS", "T1_reweighted_ess_mean", "one"),
        (r"$(T_{k}^{(0)}-T_{k}^{(1)})/T_{k}^{(0)}$ (importance)", "share_removed_reweighted",
         "pct"),
    ]

    def interval(stat: str, k: int, pct: bool = False) -> str:
        lo, hi = s.get(stat, k, field="lower"), s.get(stat, k, field="upper")
        return fmt_pct_interval(lo, hi) if pct else fmt_interval(lo, hi)

    def cell(stat: str, k: int, kind: str) -> str:
        return (interval(stat, k, kind == "pct") if kind in ("num", "pct")
                else fmt(s.get(stat, k), 2 if kind == "point" else 1))

    shown = _slot_table([[label, *[cell(stat, k, kind) for k in s.slots]]
                         for label, stat, kind in interval_rows], s.slots)
    csv = _long(s, [(label, stat, "all") for label, stat, _ in interval_rows])
    write_table(csv, "table3_floor_intervals", tex_dir=out_dir, latex=shown)

    last = s.last
    values: dict[str, str] = {}
    for k in s.slots:
        values[macro_name("floor", "interval", "T0", "slot", k)] = interval("T0", k)
    values[macro_name("floor", "interval", "T0", "last")] = interval("T0", last)
    for tag, t1_stat, share_stat in T1_ROUTES:
        for k in s.slots:
            values[macro_name("floor", "interval", "T1", *tag, "slot", k)] = interval(t1_stat, k)
            values[macro_name("floor", "interval", "share", *tag, "slot", k)] = interval(
                share_stat, k, True)
        values[macro_name("floor", "interval", "T1", *tag, "last")] = interval(t1_stat, last)
        values[macro_name("floor", "interval", "share", *tag, "last")] = interval(
            share_stat, last, True)
        # Slot 1: T^(1) is 0 by identity; the estimate is the numerical resolution (Sec. C.1).
        values[macro_name("floor", "T1", *tag, "slot", 1, "residual")] = fmt(s.get(t1_stat, 1))
    return values


def tableD1_concentration(inputs: Mapping[str, Path], spec: Mapping[str, Any],
                          out_dir: Path) -> dict[str, str]:
    """Table D.1: how the order-0 floor is spread over anchors (mean, median, top-decile
    share, share below 0.01 and their share of the total) and the effective support of the
    block prefixes with its correlation with the floor, per slot."""
    s = FloorSummary.of(inputs)
    facts = s.meta.get("domains") or {}
    spec_rows: list[tuple[str, str, str, str]] = [
        (r"mean $T_{k}^{(0)}$", "T0", "all", "num"),
        (r"median $T_{k}^{(0)}$", "T0_median", "all", "num"),
        (r"top-decile share of the total", "T0_topdecile_share", "all", "pct"),
        (r"share of anchors with $T_{k}^{(0)}<0.01$", "T0_share_below_001", "all", "pct"),
        (r"\quad their share of the total", "T0_below_001_share_of_total", "all", "pct"),
        (r"median $N_{\mathrm{eff}}$ ($k$-token prefixes)", "neff_median", "all", "one"),
        (r"p90 $N_{\mathrm{eff}}$", "neff_p90", "all", "one"),
        (r"share with no collision ($N_{\mathrm{eff}}=M$)", "neff_at_cap_share", "all", "pct"),
        (r"corr.\ $\log N_{\mathrm{eff}}$, $T_{k}^{(0)}$", "corr_log_neff_T0", "all", "corr"),
        (r"corr.\ $N_{\mathrm{eff}}$, $T_{k}^{(0)}$", "corr_neff_T0", "all", "corr"),
    ]
    spec_rows += [(rf"\quad corr.\ $\log N_{{\mathrm{{eff}}}}$, {domain_label(d, facts.get(d))}",
                   "corr_log_neff_T0", d, "corr") for d in s.domains]
    render = {"num": fmt, "pct": lambda v: fmt_pct(v, 0), "one": lambda v: fmt(v, 1),
              "corr": fmt_signed}
    shown = _slot_table([[label, *[render[kind](s.get(stat, k, domain)) for k in s.slots]]
                         for label, stat, domain, kind in spec_rows], s.slots)
    csv = _long(s, [(label, stat, domain) for label, stat, domain, _ in spec_rows])
    write_table(csv, "tableD1_concentration", tex_dir=out_dir, latex=shown)

    last = s.last
    values: dict[str, str] = {}
    for k, tag in ((1, ("slot", 1)), (last, ("last",))):
        values[macro_name("floor", "top", "decile", *tag)] = fmt_pct(
            s.get("T0_topdecile_share", k), 0)
        values[macro_name("floor", "below", "share", *tag)] = fmt_pct(
            s.get("T0_share_below_001", k), 0)
        values[macro_name("floor", "below", "total", *tag)] = fmt_pct(
            s.get("T0_below_001_share_of_total", k))
        values[macro_name("floor", "median", *tag)] = fmt(s.get("T0_median", k))
        values[macro_name("floor", "mean", *tag)] = fmt(s.get("T0", k))
    values[macro_name("floor", "neff", "prefix", "tokens")] = str(last)
    values[macro_name("floor", "neff", "median", "last")] = fmt(s.get("neff_median", last), 1)
    values[macro_name("floor", "neff", "PNinety", "last")] = fmt(s.get("neff_p90", last), 1)
    values[macro_name("floor", "neff", "min", "last")] = fmt(s.get("neff_min", last), 1)
    values[macro_name("floor", "neff", "max", "last")] = fmt(s.get("neff_max", last), 1)
    values[macro_name("floor", "neff", "cap", "share", "last")] = fmt_pct(
        s.get("neff_at_cap_share", last), 0)
    values[macro_name("floor", "corr", "log", "last")] = fmt_signed(s.get("corr_log_neff_T0", last))
    values[macro_name("floor", "corr", "raw", "last")] = fmt_signed(s.get("corr_neff_T0", last))
    for d in s.domains:
        values[macro_name("floor", "corr", "log", d, "last")] = fmt_signed(
            s.get("corr_log_neff_T0", last, d), 3)
    for tag, stat in (("log", "corr_log_neff_T0"), ("raw", "corr_neff_T0")):
        finite = [v for v in (s.get(stat, last, d) for d in s.domains) if math.isfinite(v)]
        if finite:
            values[macro_name("floor", "corr", tag, "domain", "min")] = fmt_signed(min(finite))
            values[macro_name("floor", "corr", tag, "domain", "max")] = fmt_signed(max(finite))
    return values


def tableC6_top20(inputs: Mapping[str, Path], spec: Mapping[str, Any],
                  out_dir: Path) -> dict[str, str]:
    """Table C.6 (calibration): on the same anchors and paths, the order-0 floor of top-20 reads
    (the API cap) against the full vocabulary: the paired difference with its interval, the
    band E[r] and the cells where the difference leaves the band (a theorem: none). Rollouts
    that stored fewer than 20 entries per read give "--"."""
    s = FloorSummary.of(inputs)
    slots = list(range(s.gamma))
    four, signed = partial(fmt, digits=4), partial(fmt_signed, digits=4)
    quantities = [(r"$T_{k}^{(0)}$, full vocabulary", "T0", four),
                  (r"$\widetilde T_{k}^{(0)}$, top-20", "T0_top20", four),
                  (r"paired difference (top-20 $-$ full)", "T0_top20_minus_full", signed),
                  (r"band $\mathbb{E}[r]$", "T0_top20_band", four),
                  ("cells outside the band", "top20_band_violations", _count)]
    shown = _slot_table([[label, *[show(s.get(stat, k)) for k in slots]]
                         for label, stat, show in quantities], slots)
    csv = _long(s, [(label, stat, "all") for label, stat, _ in quantities], slots,
                ["quantity", "slot", "estimate", "lower", "upper", "n_anchors"])
    write_table(csv, "tableC6_top20", tex_dir=out_dir, latex=shown)
    diffs = [abs(s.get("T0_top20_minus_full", k)) for k in s.slots]
    finite = [d for d in diffs if math.isfinite(d)]
    viol = [s.get("top20_band_violations", k) for k in slots]
    return {
        macro_name("topTwenty", "max", "abs", "diff"): fmt(max(finite), 4) if finite else "--",
        macro_name("topTwenty", "band", "last"): fmt(s.get("T0_top20_band", s.last), 4),
        macro_name("topTwenty", "diff", "last"): fmt_signed(
            s.get("T0_top20_minus_full", s.last), 4),
        macro_name("topTwenty", "diff", "last", "CI"): fmt_interval(
            s.get("T0_top20_minus_full", s.last, field="lower"),
            s.get("T0_top20_minus_full", s.last, field="upper"), 4),
        macro_name("topTwenty", "violations"): _count(sum(v for v in viol if math.isfinite(v)))
        if any(math.isfinite(v) for v in viol) else "--",
    }
