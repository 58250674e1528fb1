"""Paper items of the gap half: Figs. 4, 6, 7 and Tables 5, 6, 7, 8, 10, 12, 13, F.5, F.6.

Every item reads a gaps summary of the primary target, written by ``floorgap gaps``:
``results/<target>/gaps/summary.parquet`` (the drafters), or for
Table 10 ``trajectory.parquet`` (variants labelled ``<variant>@epoch-<e>``) and for Table 13
``components.parquet`` (the one-epoch arms and their contrasts with the baseline). Each item
writes its figure (``figures/<name>.pdf`` + ``.png``) or table (``paper/tables/<name>.tex`` +
``.csv``) and returns the macros of the numbers the text cites. Signature of an item:
``item(inputs, spec, out_dir) -> {macro: value}`` with ``inputs["summary"]`` the summary path.

``spec["roles"]`` names the variants of the roles ``order0`` (the DFlash-style baseline),
``order1`` (the DSpark-style baseline) and ``ours`` (config ``drafters.roles``);
``spec["lookups"]`` maps the lookup tables evaluated beside them (config ``drafters.lookups``)
to their kinds: Tables 5, 6, 12 give them rows and Figs. 4, 7 reference lines, each beside the
drafters of its order; Table 13 also takes ``baseline`` and ``arms``; figures also take the
plotting options.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from floorgap.analysis.lookup_verdicts import lookup_verdicts
from floorgap.config import KIND_ORDER
from floorgap.reports.common import (ROLE_STEMS, GapSummary, ServedSummary, epoch_of, fmt,
                                     fmt_interval, fmt_pct, fmt_pct_interval, fmt_signed, gap_ci,
                                     item_figure, macro_name, role_stem, role_variants,
                                     save_item_figure, write_item_table, write_table)

__all__ = ["fig4_drafter_decomposition", "fig6_slot_priority", "fig7_prefix_attention",
           "table5_dflash", "table6_dspark", "table7_serving_risk", "table8_dependence",
           "table10_trajectory", "table12_ours_vs_dspark", "table13_components",
           "tableF5_single_slot", "tableF6_sweeps"]

LABELS = {"dflash": "DFlash", "dspark": "DSpark", "ours": "Ours",
          # the one-epoch component arms of Table 13
          "vanilla": "Vanilla DSpark", "short_conv": "Vanilla + short convolution",
          "slot_embeddings": "Vanilla + slot embeddings", "head": "Prefix-attention head",
          "head_conv_slots": "Head + convolution + slot embeddings",
          # the lookup tables (floorgap.models.lookup), labelled by kind
          "unigram": "unigram table", "bigram_committed": "bigram table on $c$",
          "bigram": "bigram table"}


def _open(inputs: Mapping[str, Path], spec: Mapping[str, Any], *required: int
          ) -> tuple[GapSummary, tuple[str, str, str]]:
    """The gaps summary and the role variants (order-0, order-1, ours), those at the indices
    ``required`` checked to be in it."""
    s, roles = GapSummary.of(inputs), role_variants(spec)
    for i in required:
        s.require(roles[i])
    return s, roles


def _served_taus(inputs: Mapping[str, Path]) -> dict[str, pd.Series]:
    """Served tau at temperature 1 (the evaluation law the offline tau is computed under; task
    macro, mean over concurrency) of every system in the serving summary, when the item was
    given one (``served``): system -> summary row. Empty without it or without T = 1."""
    if "served" not in inputs:
        return {}
    served = ServedSummary(inputs["served"])
    if 1.0 not in served.temperatures:
        return {}
    return {v: served.row("tau", v, "macro", 1.0, 0) for v in served.systems}


def _served_cell(served: Mapping[str, pd.Series], name: str) -> str:
    return fmt(served[name]["estimate"], 3) if name in served else "--"


def _stem(spec: Mapping[str, Any], variant: str) -> str:
    """The macro stem of ``variant`` (:func:`floorgap.reports.common.role_stem`); the roles
    are checked first."""
    return role_stem(dict(zip(ROLE_STEMS, role_variants(spec))), variant)


def _baselines(inputs: Mapping[str, Path], spec: Mapping[str, Any]
               ) -> tuple[GapSummary, list[str]]:
    """The gaps summary and the order-0 and order-1 baselines present in it (at least one is
    required)."""
    s, (v0, v1, _) = _open(inputs, spec)
    variants = [v for v in (v0, v1) if v in s.variants]
    if not variants:
        raise ValueError(f"{s.path} has neither {v0!r} nor {v1!r}")
    return s, variants


def _label(v: str) -> str:
    return LABELS.get(v, v)


def _lookups(s: GapSummary, spec: Mapping[str, Any], order: int) -> list[str]:
    """The lookup tables of ``order`` in the summary (``spec["lookups"]``: name -> kind)."""
    tables = spec.get("lookups") or {}
    return [t for t, kind in tables.items()
            if KIND_ORDER.get(str(kind)) == order and t in s.variants]


def _lookup_label(spec: Mapping[str, Any], table: str) -> str:
    return LABELS.get(table, LABELS.get(str((spec.get("lookups") or {}).get(table)), table))


#: Line styles of the lookup tables' reference lines (black, one style per table).
LOOKUP_STYLES = ("--", ":", "-.")


def _lookup_lines(ax, s: GapSummary, spec: Mapping[str, Any], order: int, stat: str,
                  ks: list[int]) -> None:
    """Reference lines of the lookup tables of ``order`` on ``ax``: their ``stat`` by slot."""
    for t, style in zip(_lookups(s, spec, order), LOOKUP_STYLES * 4):
        ax.plot(ks, s.series(stat, t, ks)[0], color="black", linestyle=style, linewidth=1,
                label=_lookup_label(spec, t))


def _lookup_sentence(s: GapSummary, spec: Mapping[str, Any]) -> str:
    """The paper's verdict on the lookup tables: where each role's drafter loses to one of
    its order, or that every drafter beats them at every slot."""
    v0, v1, vo = role_variants(spec)
    pairs = [[d, t] for d in dict.fromkeys((v0, v1, vo)) if d in s.variants
             for t in _lookups(s, spec, 1 if d != v0 else 0)]
    if not pairs:
        return "No lookup table was evaluated beside the drafters."
    losses = [v for v in lookup_verdicts(s.df, pairs) if v.loses]
    if not losses:
        return "Every drafter beats its lookup tables at every slot."
    return "; ".join(f"{_label(v.drafter)} loses to a lookup table ({_lookup_label(spec, v.table)})"
                     f" at slots {', '.join(map(str, v.loses))}" for v in losses) + "."


def _long(s: GapSummary, stats: list[str], variants: list[str], slots: list[int]) -> list[dict]:
    """The csv: one row per statistic x variant x slot (full precision)."""
    fields = ("estimate", "lower", "upper", "n_anchors")
    return [{"statistic": stat, "variant": v, "slot": k, **s.fields(stat, v, k, fields)}
            for v in variants for stat in stats for k in slots]


# -- tables -------------------------------------------------------------------------------------

def table5_dflash(inputs: Mapping[str, Path], spec: Mapping[str, Any], out_dir: Path
                  ) -> dict[str, str]:
    """Table 5: DFlash T0, R, G0 with its interval and G0/R per slot."""
    s, (v, _, _) = _open(inputs, spec, 0)
    ks = s.slots
    rows = [["$T^{(0)}$", *[fmt(s.get("T0", v, k), 2) for k in ks]],
            ["$R$", *[fmt(s.get("R", v, k), 2) for k in ks]],
            ["$G^{(0)}=R-T^{(0)}$", *[fmt(s.get("G0", v, k), 2) for k in ks]],
            ["95\\% CI on $G^{(0)}$", *[gap_ci(s, "G0", v, k) for k in ks]],
            ["$G^{(0)}/R$", *[fmt_pct(s.get("G0_share", v, k)) for k in ks]]]
    tables = _lookups(s, spec, 0)
    rows += [[f"$R$, {_lookup_label(spec, t)}", *[fmt(s.get("R", t, k), 2) for k in ks]]
             for t in tables]
    csv = _long(s, ["T0", "R", "G0", "G0_share"], [v], ks) + _long(s, ["R"], tables, ks)
    csv += _long(s, ["diff_R"], [f"{v}-{t}" for t in tables], ks)
    write_item_table(rows, ["slot", *map(str, ks)], "table5_dflash", out_dir, csv)
    L = s.last
    return {
        macro_name("lookup", "verdict"): _lookup_sentence(s, spec),
        macro_name("dflash", "risk", "last"): fmt(s.get("R", v, L), 2),
        macro_name("dflash", "floor", "last"): fmt(s.get("T0", v, L), 2),
        macro_name("dflash", "gap", "last"): fmt(s.get("G0", v, L), 2),
        macro_name("dflash", "gap", "last", "CI"): gap_ci(s, "G0", v, L),
        macro_name("dflash", "gap", "share", "last"): fmt_pct(s.get("G0_share", v, L)),
        macro_name("dflash", "gap", "first"): fmt(s.get("G0", v, 0), 2),
    }


def _table6_slots(s: GapSummary, spec: Mapping[str, Any]) -> list[int]:
    ks = [int(k) for k in spec.get("table6_slots", []) if 0 <= int(k) < s.gamma]
    return ks or s.slots


def table6_dspark(inputs: Mapping[str, Path], spec: Mapping[str, Any], out_dir: Path
                  ) -> dict[str, str]:
    """Table 6: DSpark per slot on the split-half's covered paths (covered mass c): T1,
    R^oracle, G1 with its interval, exposure and R^self; then the importance route's T1 and G1
    share on every path as the second estimate."""
    s, (_, v, _) = _open(inputs, spec, 1)
    ks = _table6_slots(s, spec)
    rows = [["covered mass $c$", *[fmt(s.get("covered_mass", v, k), 2) for k in ks]],
            ["$T^{(1)}$ (split-half)", *[fmt(s.get("T1", v, k), 2) for k in ks]],
            ["$R^{\\mathrm{oracle}}$", *[fmt(s.get("R_oracle", v, k), 2) for k in ks]],
            ["$G^{(1)}$", *[fmt(s.get("G1", v, k), 2) for k in ks]],
            ["95\\% CI on $G^{(1)}$", *[gap_ci(s, "G1", v, k) for k in ks]],
            ["$E^{\\mathrm{expo}}$", *[fmt(s.get("exposure", v, k), 2) for k in ks]],
            ["$R^{\\mathrm{self}}$", *[fmt(s.get("R_self", v, k), 2) for k in ks]],
            ["$T^{(1)}$ (importance)", *[fmt(s.get("T1_reweighted", v, k), 2) for k in ks]],
            ["$G^{(1)}/R^{\\mathrm{oracle}}$ (importance)",
             *[fmt_pct(s.get("G1_share_reweighted", v, k)) for k in ks]]]
    tables = _lookups(s, spec, 1)
    rows += [[f"$R^{{\\mathrm{{oracle}}}}$, {_lookup_label(spec, t)}",
              *[fmt(s.get("R_oracle", t, k), 2) for k in ks]] for t in tables]
    csv = _long(s, ["covered_mass", "T1", "R_oracle", "G1", "G1_share", "exposure", "R_self",
                    "T1_reweighted", "R_oracle_reweighted", "G1_reweighted",
                    "G1_share_reweighted"], [v], ks)
    csv += _long(s, ["R_oracle", "R_self"], tables, ks)
    csv += _long(s, ["diff_R_oracle"], [f"{v}-{t}" for t in tables], ks)
    write_item_table(rows, ["slot", *map(str, ks)], "table6_dspark", out_dir, csv)
    L = s.last
    return {
        macro_name("dspark", "covered", "mass", "last"): fmt(s.get("covered_mass", v, L), 2),
        macro_name("dspark", "gap", "importance", "share", "last"): fmt_pct(
            s.get("G1_share_reweighted", v, L)),
        macro_name("dspark", "floor", "last"): fmt(s.get("T1", v, L), 2),
        macro_name("dspark", "oracle", "risk", "last"): fmt(s.get("R_oracle", v, L), 2),
        macro_name("dspark", "gap", "last"): fmt(s.get("G1", v, L), 2),
        macro_name("dspark", "gap", "last", "CI"): gap_ci(s, "G1", v, L),
        macro_name("dspark", "gap", "share", "last"): fmt_pct(s.get("G1_share", v, L)),
        macro_name("dspark", "exposure", "last"): fmt(s.get("exposure", v, L), 2),
        macro_name("dspark", "self", "risk", "last"): fmt(s.get("R_self", v, L), 2),
    }


def table7_serving_risk(inputs: Mapping[str, Path], spec: Mapping[str, Any], out_dir: Path
                        ) -> dict[str, str]:
    """Table 7: free vs serving-weighted risk (slots >= 1) for both released drafters."""
    s, (v0, v1, _) = _open(inputs, spec)
    ks = s.slots[1:]
    rows, values = [], {}
    for v, free_label in ((v0, "R_{k}"), (v1, "R_{k}^{\\mathrm{oracle}}")):
        if v not in s.variants:
            continue
        name = _label(v)
        rows += [[f"{name} ${free_label}$", *[fmt(s.get("R_free", v, k), 2) for k in ks]],
                 [f"{name} $R_{{k}}^{{\\mathrm{{serve}}}}$",
                  *[fmt(s.get("R_serve", v, k), 2) for k in ks]],
                 ["difference", *[fmt_signed(s.get("R_serve_minus_free", v, k)) for k in ks]],
                 ["95\\% CI", *[gap_ci(s, "R_serve_minus_free", v, k) for k in ks]]]
        stem, L = _stem(spec, v), s.last
        values[macro_name(stem, "free", "risk", "last")] = fmt(s.get("R_free", v, L), 3)
        values[macro_name(stem, "serve", "risk", "last")] = fmt(s.get("R_serve", v, L), 3)
        values[macro_name(stem, "serve", "minus", "free", "last")] = fmt_signed(
            s.get("R_serve_minus_free", v, L))
    if not rows:
        raise ValueError(f"{s.path} has neither {v0!r} nor {v1!r}")
    write_item_table(rows, ["slot $k$", *map(str, ks)], "table7_serving_risk", out_dir,
                     _long(s, ["R_free", "R_serve", "R_serve_minus_free"],
                           [v for v in (v0, v1) if v in s.variants], ks))
    return values


def table8_dependence(inputs: Mapping[str, Path], spec: Mapping[str, Any], out_dir: Path
                      ) -> dict[str, str]:
    """Table 8: D_k per slot; tau joint vs tau independent in the values."""
    s, variants = _baselines(inputs, spec)
    rows, values = [], {}
    for v in variants:
        rows.append([_label(v), *[fmt(s.get("D", v, k), 3) for k in s.slots]])
        stem = _stem(spec, v)
        values[macro_name(stem, "dependence", "last")] = fmt(s.get("D", v, s.last), 2)
        for stat, *tag in (("tau",), ("tau_independent", "independent"), ("tau_gap", "gap")):
            values[macro_name(stem, "tau", *tag)] = fmt(s.get(stat, v), 3)
        values[macro_name(stem, "tau", "gap", "CI")] = gap_ci(s, "tau_gap", v)
    csv = _long(s, ["D", "S", "marginal"], variants, s.slots)
    csv += _long(s, ["tau", "tau_independent", "tau_gap"], variants, [-1])
    write_item_table(rows, ["slot $k$", *map(str, s.slots)], "table8_dependence", out_dir, csv)
    return values


def table12_ours_vs_dspark(inputs: Mapping[str, Path], spec: Mapping[str, Any], out_dir: Path
                           ) -> dict[str, str]:
    """Table 12: T1, R^oracle and R^self per slot for DSpark and ours."""
    s, (_, v1, vo) = _open(inputs, spec, 1, 2)
    ks = s.slots
    # both drafters on the same paths: one floor row
    rows = [["covered mass $c$", "", *[fmt(s.get("covered_mass", v1, k), 2) for k in ks]],
            ["$T^{(1)}$ (split-half)", "", *[fmt(s.get("T1", v1, k), 2) for k in ks]]]
    tables = _lookups(s, spec, 1)
    for stat, label in (("R_oracle", "$R^{\\mathrm{oracle}}$"),
                        ("R_self", "$R^{\\mathrm{self}}$")):
        rows.append([label, _label(v1), *[fmt(s.get(stat, v1, k), 2) for k in ks]])
        rows.append(["", _label(vo), *[fmt(s.get(stat, vo, k), 2) for k in ks]])
        rows += [["", _lookup_label(spec, t), *[fmt(s.get(stat, t, k), 2) for k in ks]]
                 for t in tables]
    pair = f"{vo}-{v1}"
    csv = _long(s, ["covered_mass", "T1", "R_oracle", "R_self", "G1", "exposure",
                    "G1_reweighted"], [v1, vo, *tables], ks)
    csv += _long(s, ["diff_R_oracle", "diff_R_self", "diff_G1", "diff_exposure",
                     "gap_reduction"], [pair], ks)
    csv += _long(s, ["tau"], [v1, vo], [-1]) + _long(s, ["diff_tau"], [pair], [-1])
    latex = pd.DataFrame(rows, columns=["Metric", "Drafter", *map(str, ks)])
    write_table(pd.DataFrame(csv), "table12_ours_vs_dspark", tex_dir=out_dir, latex=latex,
                column_format="ll" + "r" * len(ks))
    L = s.last
    return {
        macro_name("ours", "gap", "reduction", "last"): fmt_pct(s.get("gap_reduction", pair, L)),
        macro_name("ours", "gap", "reduction", "last", "CI"): fmt_pct_interval(
            s.get("gap_reduction", pair, L, field="lower"),
            s.get("gap_reduction", pair, L, field="upper")),
        macro_name("ours", "gap", "last"): fmt(s.get("G1", vo, L), 2),
        macro_name("ours", "vs", "dspark", "gap", "last"): fmt(s.get("G1", v1, L), 2),
        macro_name("ours", "exposure", "last"): fmt(s.get("exposure", vo, L), 2),
        macro_name("ours", "vs", "dspark", "exposure", "last"): fmt(s.get("exposure", v1, L), 2),
        macro_name("ours", "self", "risk", "last"): fmt(s.get("R_self", vo, L), 2),
        macro_name("ours", "vs", "dspark", "self", "risk", "last"): fmt(s.get("R_self", v1, L), 2),
        macro_name("ours", "tau"): fmt(s.get("tau", vo), 3),
        macro_name("ours", "vs", "dspark", "tau", "change"): fmt_signed(s.get("diff_tau", pair), 3),
        macro_name("ours", "vs", "dspark", "tau", "change", "CI"): gap_ci(s, "diff_tau", pair),
    }


def table10_trajectory(inputs: Mapping[str, Path], spec: Mapping[str, Any], out_dir: Path
                       ) -> dict[str, str]:
    """Table 10: accepted length tau after every epoch of one training run (the offline tau of
    the evaluation probe on the floor paths), per trajectory variant, and the final weights'
    served tau at T = 1 where the serving benchmark served the variant ("--" otherwise)."""
    s = GapSummary.of(inputs)
    runs: dict[str, dict[int, str]] = {}
    for label in s.variants:
        parsed = epoch_of(label)
        if parsed is not None:
            runs.setdefault(parsed[0], {})[parsed[1]] = label
    if not runs:
        raise ValueError(f"{s.path} holds no <variant>@epoch-<e> records (is it the trajectory "
                         "summary?)")
    n_epochs = max(max(e) for e in runs.values())
    epochs = list(range(1, n_epochs + 1))
    served = _served_taus(inputs)
    rows, csv, values = [], [], {}
    for v, by_epoch in sorted(runs.items()):
        taus = [s.get("tau", by_epoch[e]) if e in by_epoch else math.nan for e in epochs]
        # the served drafter is the variant's final weights: its last epoch
        rows.append([_label(v), *[fmt(t, 3) for t in taus], _served_cell(served, v)])
        rows.append(["95\\% CI", *[gap_ci(s, "tau", by_epoch[e]) if e in by_epoch else "--"
                                     for e in epochs],
                     fmt_interval(served[v]["lower"], served[v]["upper"])
                     if v in served else "--"])
        for e, label in sorted(by_epoch.items()):
            csv.append({"variant": v, "epoch": e, "tau": s.get("tau", label),
                        "lower": s.get("tau", label, field="lower"),
                        "upper": s.get("tau", label, field="upper"),
                        "R_self_last": s.get("R_self_all", label, s.last),
                        "n_anchors": s.get("tau", label, field="n_anchors"),
                        "served_tau": served[v]["estimate"] if v in served and e == max(by_epoch)
                        else math.nan})
        done = [e for e in epochs if e in by_epoch]
        first, last = s.get("tau", by_epoch[done[0]]), s.get("tau", by_epoch[done[-1]])
        stem = _stem(spec, v)
        values[macro_name(stem, "trajectory", "tau", "first")] = fmt(first, 2)
        values[macro_name(stem, "trajectory", "tau", "last")] = fmt(last, 2)
        values[macro_name(stem, "trajectory", "epochs")] = str(done[-1])
        values[macro_name(stem, "trajectory", "gain")] = fmt_signed(last - first, 3)
    write_item_table(rows, ["Epoch", *map(str, epochs), "Served ($T=1$)"], "table10_trajectory",
                     out_dir, csv)
    return values


def table13_components(inputs: Mapping[str, Path], spec: Mapping[str, Any], out_dir: Path
                       ) -> dict[str, str]:
    """Table 13: accepted length of the one-epoch component arms and the paired change from
    the baseline arm (``spec["baseline"]``; ``spec["arms"]`` orders the rows), and each arm's
    served tau at T = 1 where the serving benchmark served it ("--" otherwise)."""
    s = GapSummary.of(inputs)
    if "baseline" not in spec:
        raise ValueError("the item's spec lacks the baseline arm (drafters.components.baseline)")
    base = str(spec["baseline"])
    s.require(base)
    arms = [str(a) for a in spec.get("arms", s.variants)]
    for a in arms:
        s.require(a)
    served = _served_taus(inputs)
    rows, csv, values = [], [], {}
    for a in arms:
        pair = f"{a}-{base}"
        tau = s.get("tau", a)
        diff = math.nan if a == base else s.get("diff_tau", pair)
        rows.append([_label(a), fmt(tau, 3), "--" if a == base else fmt_signed(diff, 3),
                     "--" if a == base else gap_ci(s, "diff_tau", pair), _served_cell(served, a)])
        csv.append({"arm": a, "baseline": base, "tau": tau,
                    "tau_lower": s.get("tau", a, field="lower"),
                    "tau_upper": s.get("tau", a, field="upper"), "change": diff,
                    "change_lower": s.get("diff_tau", pair, field="lower"),
                    "change_upper": s.get("diff_tau", pair, field="upper"),
                    "n_anchors": s.get("tau", a, field="n_anchors"),
                    "served_tau": served[a]["estimate"] if a in served else math.nan})
        values[macro_name("components", a, "tau")] = fmt(tau, 2)
        if a != base:
            values[macro_name("components", a, "change")] = fmt_signed(diff, 3)
    best = max(arms, key=lambda a: s.get("tau", a))
    values[macro_name("components", "best")] = _label(best)
    write_item_table(rows, ["One-epoch configuration", "Accepted length", "Change from baseline",
                            "95\\% CI", "Served ($T=1$)"], "table13_components", out_dir, csv)
    return values


def tableF5_single_slot(inputs: Mapping[str, Path], spec: Mapping[str, Any], out_dir: Path
                        ) -> dict[str, str]:
    """Table F.5: held-out single-slot best-response gains per slot with intervals."""
    s, variants = _baselines(inputs, spec)
    rows, values = [], {}
    for v in variants:
        rows.append([f"{_label(v)} $\\Delta\\tau_{{k}}^{{\\mathrm{{BR}}}}$",
                     *[fmt(s.get("dtau_br", v, k), 3) for k in s.slots]])
        rows.append(["95\\% CI", *[gap_ci(s, "dtau_br", v, k) for k in s.slots]])
        gains = [s.get("dtau_br", v, k) for k in s.slots]
        opt = [s.get("dtau_br_optimism", v, k) for k in s.slots]
        stem = (_stem(spec, v), "best", "response")
        values[macro_name(*stem, "first")] = fmt(gains[0], 3)
        values[macro_name(*stem, "last")] = fmt(gains[-1], 3)
        values[macro_name(*stem, "argmin")] = str(int(np.nanargmin(gains)))
        values[macro_name(*stem, "argmax")] = str(int(np.nanargmax(gains)))
        values[macro_name(*stem, "optimism", "max")] = fmt(float(np.nanmax(opt)))
    write_item_table(rows, ["slot $k$", *map(str, s.slots)], "tableF5_single_slot", out_dir,
                     _long(s, ["dtau_br", "dtau_br_in_sample", "dtau_br_optimism"], variants,
                           s.slots))
    return values


def tableF6_sweeps(inputs: Mapping[str, Path], spec: Mapping[str, Any], out_dir: Path
                   ) -> dict[str, str]:
    """Table F.6: sum of isolated gains vs coordinate sweeps in both directions."""
    s, variants = _baselines(inputs, spec)
    rows, values = [], {}
    n = s.gamma - 1
    for v in variants:
        rows.append([_label(v), fmt(s.get("sweep_isolated_sum", v), 2),
                     f"{fmt(s.get('sweep_forward', v), 2)} {gap_ci(s, 'sweep_forward', v)}",
                     f"{fmt(s.get('sweep_backward', v), 2)} {gap_ci(s, 'sweep_backward', v)}"])
        stem = _stem(spec, v)
        for stat, *tag in (("sweep_forward", "forward"), ("sweep_backward", "backward"),
                           ("sweep_isolated_sum", "isolated", "sum"),
                           ("sweep_forward_ratio", "ratio")):
            values[macro_name(stem, "sweep", *tag)] = fmt(s.get(stat, v), 2)
        values[macro_name(stem, "sweep", "direction", "difference")] = fmt(
            abs(s.get("sweep_forward", v) - s.get("sweep_backward", v)), 3)
    header = ["", "sum of isolated gains", f"sweep $0\\!\\to\\!{n}$", f"sweep ${n}\\!\\to\\!0$"]
    stats = ["sweep_isolated_sum", "sweep_forward", "sweep_backward",
             "sweep_forward_minus_isolated", "sweep_backward_minus_isolated",
             "sweep_forward_ratio", "sweep_backward_ratio"]
    write_item_table(rows, header, "tableF6_sweeps", out_dir, _long(s, stats, variants, [-1]))
    return values


# -- figures ------------------------------------------------------------------------------------


def _stack(ax, ks: list[int], parts: list[tuple[str, np.ndarray]], title: str) -> None:
    bottom = np.zeros(len(ks))
    for label, y in parts:
        y = np.nan_to_num(y)
        ax.bar(ks, y, bottom=bottom, label=label, width=0.7)
        bottom = bottom + y
    ax.set(xticks=ks, xlabel="slot $k$", ylabel="rejection risk", title=title)
    ax.legend(loc="upper left")


def fig4_drafter_decomposition(inputs: Mapping[str, Path], spec: Mapping[str, Any],
                               out_dir: Path) -> dict[str, str]:
    """Fig. 4: DFlash R = T0 + G0 (left); DSpark R^self = T1 + G1 + exposure (right)."""
    s, (v0, v1, _) = _open(inputs, spec, 0, 1)
    ks = s.slots
    fig, (left, right) = item_figure(spec, 2)
    _stack(left, ks, [("floor $T^{(0)}$", s.series("T0", v0, ks)[0]),
                      ("gap $G^{(0)}$", s.series("G0", v0, ks)[0])], _label(v0))
    _stack(right, ks, [("floor $T^{(1)}$", s.series("T1", v1, ks)[0]),
                       ("gap $G^{(1)}$", s.series("G1", v1, ks)[0]),
                       ("exposure", s.series("exposure", v1, ks)[0])], _label(v1))
    # reference lines: the lookup tables' risk on the same scale as each stack's total
    for ax, order, stat in ((left, 0, "R"), (right, 1, "R_self")):
        _lookup_lines(ax, s, spec, order, stat, ks)
        ax.legend(loc="upper left")
    save_item_figure(fig, "fig4_drafter_decomposition", out_dir, spec)
    L = s.last
    return {
        macro_name("fig", "four", "dflash", "gap", "last"): fmt(s.get("G0", v0, L), 2),
        macro_name("fig", "four", "dspark", "gap", "last"): fmt(s.get("G1", v1, L), 2),
        macro_name("fig", "four", "dspark", "exposure", "last"): fmt(s.get("exposure", v1, L), 2),
    }


def _line(ax, ks: list[int], series: tuple[np.ndarray, np.ndarray, np.ndarray], label: str,
          marker: str = "o") -> None:
    est, lo, hi = series
    (h,) = ax.plot(ks, est, marker=marker, label=label)
    if np.isfinite(lo).any():
        ax.fill_between(ks, lo, hi, alpha=0.2, color=h.get_color(), linewidth=0)


def fig6_slot_priority(inputs: Mapping[str, Path], spec: Mapping[str, Any], out_dir: Path
                       ) -> dict[str, str]:
    """Fig. 6: model gap by slot (left) and held-out single-slot gain by slot (right)."""
    s, variants = _baselines(inputs, spec)
    ks = s.slots
    fig, (left, right) = item_figure(spec, 2)
    values = {}
    for v in variants:
        gap = "G0" if v == role_variants(spec)[0] else "G1"
        _line(left, ks, s.series(gap, v, ks), _label(v))
        _line(right, ks, s.series("dtau_br", v, ks), _label(v))
        gains = s.series("dtau_br", v, ks)[0]
        values[macro_name("fig", "six", v, "gain", "ratio", "first", "last")] = fmt(
            gains[0] / gains[-1] if gains[-1] else float("nan"), 2)
    left.set_ylabel("model gap")
    right.set_ylabel("$\\Delta\\tau_k^{\\mathrm{BR}}$ (held out)")
    for ax in (left, right):
        ax.set(xlabel="slot $k$", xticks=ks)
        ax.legend()
    save_item_figure(fig, "fig6_slot_priority", out_dir, spec)
    return values


def fig7_prefix_attention(inputs: Mapping[str, Path], spec: Mapping[str, Any], out_dir: Path
                          ) -> dict[str, str]:
    """Fig. 7: ours vs DSpark per slot: model gap, exposure and self-conditioned risk."""
    s, (_, v1, vo) = _open(inputs, spec, 1, 2)
    ks = s.slots
    fig, axes = item_figure(spec, 3)
    for ax, (stat, title) in zip(axes, (("G1", "model gap $G^{(1)}$"),
                                        ("exposure", "exposure"),
                                        ("R_self", "$R^{\\mathrm{self}}$")), strict=True):
        _line(ax, ks, s.series(stat, v1, ks), _label(v1), "o")
        _line(ax, ks, s.series(stat, vo, ks), _label(vo), "s")
        _lookup_lines(ax, s, spec, 1, stat, ks)   # reference: the tables of the same order
        ax.set(title=title, xlabel="slot $k$", xticks=ks)
    axes[0].legend()
    save_item_figure(fig, "fig7_prefix_attention", out_dir, spec)
    pair = f"{vo}-{v1}"
    L = s.last
    return {
        macro_name("fig", "seven", "gap", "reduction", "last"): fmt_pct(
            s.get("gap_reduction", pair, L)),
        macro_name("fig", "seven", "exposure", "change", "last"): fmt_signed(
            s.get("diff_exposure", pair, L)),
        macro_name("fig", "seven", "self", "risk", "change", "last"): fmt_signed(
            s.get("diff_R_self", pair, L)),
    }
