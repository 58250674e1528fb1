"""One drafter's rejection split into information floor and model gap, by slot.

The decomposition stage (``floorgap decomposition``) reads the gaps summary of the ``decompose``
group (``results/<target>/gaps/decompose.parquet``) and the floors summary of the same target,
and writes, for one drafter, three files with the same numbers:

* ``<name>.csv``: long format (``statistic, slot, estimate, lower, upper``; slot -1 for tau);
* ``<name>.tex``: a bare ``tabular``, one row per slot;
* ``<name>.md``: the same as a small markdown table for a terminal.

The statistics are those of :mod:`floorgap.analysis.gaps`, each decomposition on one population
so its parts add up: order 0 (DFlash-style) R = T^(0) + G^(0) on the anchors with a floor; order
1 (DSpark-style) R^oracle = T^(1) + G^(1) and R^self = R^oracle + exposure on the paths the
split-half floor covers (weighted by the covered mass c), with the importance route's T^(1) and
G^(1) share as the second estimate. From the floors summary comes the floor of the other
information order on every anchor (the order-1 floor for an order-0 drafter: what seeing its
predecessor would allow; the order-0 floor for an order-1 drafter), with a ``floors_`` prefix.

Beside them, each lookup table of the drafter's order evaluated on the same anchors and paths
(``lookups``): its risk (``R@<table>`` or ``R_oracle@<table>``), the drafter's paired
difference from it (``diff_R@<table>`` / ``diff_R_oracle@<table>``) and one verdict line per
table ("loses to a lookup table at slots ..."), which tells an under-trained drafter from one
that is up against its floor.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from floorgap.analysis.lookup_verdicts import LOOKUP_DIFF, LookupVerdict, lookup_verdicts
from floorgap.records import atomic_path
from floorgap.reports.common import GapSummary, LongSummary, fmt, fmt_interval, fmt_pct, tex_text

__all__ = ["COLUMNS", "ORDER_STATS", "Decomposition", "by_slot_cells", "decompose",
           "plain_interval", "plain_number", "write_decomposition"]

#: The csv's columns.
COLUMNS = ["statistic", "slot", "estimate", "lower", "upper"]
#: The gaps statistics of each order, in the csv's order.
ORDER_STATS: dict[int, list[str]] = {
    0: ["T0", "R", "G0", "G0_share"],
    1: ["covered_mass", "T1", "R_oracle", "G1", "G1_share", "exposure", "R_self",
        "T1_reweighted", "R_oracle_reweighted", "G1_reweighted", "G1_share_reweighted"],
}
#: The floors-summary statistic of the other order: (csv name, floors statistic).
OTHER_FLOOR = {0: ("floors_T1", "T1_split_covered"), 1: ("floors_T0", "T0")}


@dataclass
class Decomposition:
    """One drafter's decomposition: its name, order and kind, the target, gamma, the interval
    level, the long table (:data:`COLUMNS`), the lookup tables beside it and the verdict
    against each."""

    drafter: str
    order: int
    kind: str
    target: str
    gamma: int
    level: float
    table: pd.DataFrame
    lookups: tuple[str, ...] = ()
    verdicts: tuple[LookupVerdict, ...] = ()

    def value(self, statistic: str, slot: int = -1, field: str = "estimate") -> float:
        """One number of the table (NaN when absent)."""
        t = self.table
        row = t[(t["statistic"] == statistic) & (t["slot"] == slot)]
        return float(row[field].iloc[0]) if len(row) else math.nan


def _floors_value(floors: LongSummary, statistic: str, slot: int, field: str) -> float:
    df = floors.df
    row = df[(df["statistic"] == statistic) & (df["domain"] == "all") & (df["slot"] == slot)]
    return float(row[field].iloc[0]) if len(row) else math.nan


def _check_same_run(gaps: GapSummary, floors: LongSummary) -> None:
    """The two summaries describe one target and block length."""
    if gaps.target and floors.target and gaps.target != floors.target:
        raise ValueError(f"{gaps.path} is of target {gaps.target}, {floors.path} of "
                         f"{floors.target}; give the floors summary of the same target")
    f_gamma = floors.meta.get("gamma")
    if f_gamma is not None and int(f_gamma) != gaps.gamma:
        raise ValueError(f"{gaps.path} has gamma {gaps.gamma}, {floors.path} gamma {f_gamma}; "
                         "give summaries of the same run")


def lookup_risk(order: int) -> str:
    """The risk a drafter of ``order`` is compared with a lookup table on."""
    return LOOKUP_DIFF[order].removeprefix("diff_")


def decompose(gaps_path: str | Path, floors_path: str | Path, drafter: str, *,
              kind: str = "", level: float = 0.95, lookups: Sequence[str] = ()
              ) -> Decomposition:
    """The decomposition of ``drafter`` (a variant of the gaps summary at ``gaps_path``) with
    the other order's floor from the floors summary at ``floors_path`` and the lookup tables
    ``lookups`` (variants of the same summary, of the drafter's order, with the paired
    differences as contrasts); scope "all" domains. Raises ValueError when the drafter or a
    table is missing or the files describe different runs."""
    gaps, floors = GapSummary(gaps_path), LongSummary(floors_path)
    gaps.require(drafter)
    _check_same_run(gaps, floors)
    order = int(gaps.get("order", drafter))
    if order not in ORDER_STATS:
        raise ValueError(f"{gaps_path}: drafter {drafter!r} has order {order}; expected 0 or 1")
    rows = [{"statistic": stat, "slot": k, **gaps.fields(stat, drafter, k)}
            for stat in ORDER_STATS[order] for k in gaps.slots]
    name, source = OTHER_FLOOR[order]
    rows += [{"statistic": name, "slot": k,
              **{f: _floors_value(floors, source, k, f) for f in ("estimate", "lower", "upper")}}
             for k in gaps.slots]
    rows.append({"statistic": "tau", "slot": -1, **gaps.fields("tau", drafter)})
    risk, diff = lookup_risk(order), LOOKUP_DIFF[order]
    for t in lookups:
        gaps.require(t)
        if int(gaps.get("order", t)) != order:
            raise ValueError(f"{gaps_path}: lookup table {t!r} is not of order {order}")
        for stat, variant in ((risk, t), (diff, f"{drafter}-{t}")):
            rows += [{"statistic": f"{stat}@{t}", "slot": k, **gaps.fields(stat, variant, k)}
                     for k in gaps.slots]
    table = pd.DataFrame(rows, columns=COLUMNS)
    verdicts = tuple(lookup_verdicts(gaps.df, [[drafter, t] for t in lookups]))
    return Decomposition(drafter=drafter, order=order, kind=kind, target=gaps.target,
                         gamma=gaps.gamma, level=level, table=table, lookups=tuple(lookups),
                         verdicts=verdicts)


# -------------------------------------------------------------------------- presentation

#: Columns of the by-slot table: (header in LaTeX, header in markdown, statistic, how shown).
_SHOWN: dict[int, list[tuple[str, str, str, str]]] = {
    0: [("$T^{(0)}$", "T0 (floor)", "T0", "num"),
        ("$R$", "R", "R", "num"),
        ("$G^{(0)}$", "G0 (gap)", "G0", "num"),
        ("CI on $G^{(0)}$", "G0 CI", "G0", "ci"),
        ("$G^{(0)}/R$", "G0/R", "G0_share", "pct"),
        ("$T^{(1)}$ (order 1)", "T1 (order-1 floor)", "floors_T1", "num")],
    1: [("$c$", "c (covered)", "covered_mass", "num"),
        ("$T^{(1)}$", "T1 (floor)", "T1", "num"),
        ("$R^{\\mathrm{oracle}}$", "R_oracle", "R_oracle", "num"),
        ("$G^{(1)}$", "G1 (gap)", "G1", "num"),
        ("CI on $G^{(1)}$", "G1 CI", "G1", "ci"),
        ("$G^{(1)}/R^{\\mathrm{oracle}}$", "G1/R_oracle", "G1_share", "pct"),
        ("exposure", "exposure", "exposure", "num"),
        ("$R^{\\mathrm{self}}$", "R_self", "R_self", "num"),
        ("$G^{(1)}/R^{\\mathrm{oracle}}$ (importance)", "G1/R_oracle (importance)",
         "G1_share_reweighted", "pct"),
        ("$T^{(0)}$ (order 0)", "T0 (order-0 floor)", "floors_T0", "num")],
}


def _shown(d: Decomposition) -> list[tuple[str, str, str, str]]:
    """The by-slot columns: the order's own, then the risk of each lookup table and the
    interval of the drafter's paired difference from it."""
    risk, diff = lookup_risk(d.order), LOOKUP_DIFF[d.order]
    tex_risk = "$R$" if d.order == 0 else "$R^{\\mathrm{oracle}}$"
    extra = []
    for t in d.lookups:
        tex_t = tex_text(t)
        extra += [(f"{tex_risk} {tex_t}", f"{risk} {t}", f"{risk}@{t}", "num"),
                  (f"CI on $\\Delta$ vs {tex_t}", f"CI minus {t}", f"{diff}@{t}", "ci")]
    return _SHOWN[d.order] + extra


def _cell(d: Decomposition, stat: str, slot: int, how: str, latex: bool) -> str:
    est = d.value(stat, slot)
    lo, hi = d.value(stat, slot, "lower"), d.value(stat, slot, "upper")
    if how == "ci" and not (math.isfinite(lo) and math.isfinite(hi)):
        return "--"
    if latex:
        return {"num": lambda: fmt(est), "pct": lambda: fmt_pct(est),
                "ci": lambda: fmt_interval(lo, hi)}[how]()
    return {"num": lambda: plain_number(est), "pct": lambda: _plain_pct(est),
            "ci": lambda: plain_interval(lo, hi)}[how]()


def plain_number(value: float, digits: int = 3) -> str:
    """A number for a terminal or a page: fixed decimals, "--" when not finite, no "-0.000"."""
    if not math.isfinite(value):
        return "--"
    return f"{value + 0.0:.{digits}f}" if abs(value) >= 0.5 * 10 ** -digits else f"{0:.{digits}f}"


def plain_interval(lower: float, upper: float, digits: int = 3) -> str:
    """An interval for a terminal or a page: ``[lower, upper]`` as :func:`plain_number`."""
    return f"[{plain_number(lower, digits)}, {plain_number(upper, digits)}]"


def _plain_pct(value: float) -> str:
    return "--" if not math.isfinite(value) else f"{100 * value:.1f}%"


def _rows(d: Decomposition, latex: bool) -> list[list[str]]:
    return [[str(k), *[_cell(d, stat, k, how, latex) for _, _, stat, how in _shown(d)]]
            for k in range(d.gamma)]


def _ci_label(level: float, latex: bool) -> str:
    pct = f"{100 * level:g}"
    return f"{pct}\\%" if latex else f"{pct}%"


def _headline(d: Decomposition) -> str:
    identity = ("R = T0 + G0 on the anchors with a floor" if d.order == 0 else
                "R_oracle = T1 + G1 and R_self = R_oracle + exposure on the covered paths")
    kind = f"{d.kind}, " if d.kind else ""
    return f"drafter {d.drafter} ({kind}order {d.order}) on {d.target}: {identity}"


def to_latex(d: Decomposition) -> str:
    """The by-slot ``tabular`` with tau and its interval in the last row."""
    header, rows = by_slot_cells(d, latex=True)
    tau = (f"$\\tau$ = {fmt(d.value('tau'))} {_ci_label(d.level, True)} CI "
           f"{fmt_interval(d.value('tau', -1, 'lower'), d.value('tau', -1, 'upper'))}")
    lines = [f"\\begin{{tabular}}{{l{'r' * (len(header) - 1)}}}", r"\toprule",
             " & ".join(header) + r" \\", r"\midrule",
             *[" & ".join(row) + r" \\" for row in rows], r"\midrule",
             f"\\multicolumn{{{len(header)}}}{{l}}{{{tau}}} \\\\", r"\bottomrule",
             r"\end{tabular}", ""]
    return "\n".join(lines)


def by_slot_cells(d: Decomposition, latex: bool) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the by-slot table, as LaTeX or plain text cells."""
    pick = 0 if latex else 1
    header = ["slot", *[shown[pick].replace("CI", f"{_ci_label(d.level, latex)} CI")
                        for shown in _shown(d)]]
    return header, _rows(d, latex)


def to_markdown(d: Decomposition) -> str:
    """The same table for a terminal: a headline, a markdown table, tau and the verdicts."""
    header, rows = by_slot_cells(d, latex=False)
    lines = [f"{_headline(d)}", "", _md_row(header), _md_row(["---"] * len(header)),
             *[_md_row(row) for row in rows], "",
             f"tau (offline accepted length) = {plain_number(d.value('tau'))} "
             f"({_ci_label(d.level, False)} CI "
             f"{plain_interval(d.value('tau', -1, 'lower'), d.value('tau', -1, 'upper'))})", "",
             *[f"- {v.sentence()}" for v in d.verdicts], *([""] if d.verdicts else [])]
    return "\n".join(lines)


def _md_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def write_decomposition(d: Decomposition, paths: Mapping[str, str | Path]) -> None:
    """Write the ``csv``, ``tex`` and ``md`` files named in ``paths``, each atomically."""
    writers = {"csv": lambda tmp: d.table.to_csv(tmp, index=False),
               "tex": lambda tmp: tmp.write_text(to_latex(d)),
               "md": lambda tmp: tmp.write_text(to_markdown(d))}
    unknown = set(paths) - set(writers)
    if unknown:
        raise ValueError(f"unknown decomposition file kinds {sorted(unknown)}; expected "
                         f"{sorted(writers)}")
    for key, path in paths.items():
        with atomic_path(path) as tmp:
            writers[key](tmp)
