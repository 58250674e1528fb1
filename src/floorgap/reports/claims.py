"""The paper's empirical findings as checks on the run: the claims table and "What held on this
run" (``claims``).

Every finding of the paper's Sections 3-4 and Appendices C-H that a run of this workflow can
test is one :class:`Claim`: where the paper states it, the claim in our words, the statistic of
the run's summaries it reads (:class:`Evidence`: estimates with their prompt-bootstrap
intervals), a :class:`Check` that can fail, and the value the paper publishes for its target.
The verdict of a claim on a run is one of :data:`VERDICTS`:

* ``holds``: every element the check reads has its interval on the claimed side;
* ``does not hold``: some element has its interval wholly on the other side;
* ``not resolved``: neither (an interval straddles the threshold);
* ``not measured``: the run has no finite value of the statistic (its config does not run
  what the claim reads).

Statistics without an interval (counts, floor variants on a few anchors) are decided on the
point estimate, and the table says so. The item writes ``paper/tables/claims.{csv,tex}`` and
the macros the text cites: each claim's verdict, the run's numbers, the paper's value and the
words of a sentence that follow the run's direction, the counts of each verdict, and the
run's setting (target, device, sample sizes, drafters) that every other sentence of the
paper names instead of typing one config's values.

Size: about 950 lines, most of it the table of claims itself (:data:`CLAIMS`, one entry per
finding of the paper) and the small readers that take each claim's statistic out of the
summaries; the verdict rules and the item are short.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from floorgap.analysis.mi import MILocality, load_records, summarise_locality
from floorgap.records import read_table
from floorgap.reports.common import (GapSummary, ServedSummary, fmt, fmt_pct, macro_name,
                                     role_variants, tex_text, write_table)
from floorgap.reports.floor_items import FloorSummary

__all__ = ["VERDICTS", "Evidence", "Check", "Claim", "CLAIMS", "RunSummaries", "judge",
           "direction", "evaluate", "count_line", "claims"]

log = logging.getLogger("floorgap.claims")

HOLDS, NOT_HELD, UNRESOLVED, NOT_MEASURED = ("holds", "does not hold", "not resolved",
                                             "not measured")
#: The verdicts, in the order the table and the counts list them.
VERDICTS = (HOLDS, NOT_HELD, UNRESOLVED, NOT_MEASURED)


@dataclass(frozen=True)
class Evidence:
    """The values a claim reads from the run: one element per slot, domain, target or epoch
    (``labels``), each an estimate with its interval (NaN bounds: no interval)."""

    labels: list[str]
    estimate: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    pct: bool = False

    @classmethod
    def of(cls, labels: Sequence[object], est: Sequence[float], lo: Sequence[float] | None = None,
           hi: Sequence[float] | None = None, pct: bool = False) -> Evidence:
        n = len(est)
        nan = [math.nan] * n
        arr = lambda x: np.asarray(nan if x is None else x, dtype=float)
        return cls([str(x) for x in labels], arr(est), arr(lo), arr(hi), pct)

    @property
    def finite(self) -> np.ndarray:
        return np.isfinite(self.estimate)

    def show(self, i: int) -> str:
        """Element ``i`` as the table prints it: estimate and interval (when there is one)."""
        f = (lambda v: fmt_pct(v)) if self.pct else (lambda v: fmt(v, 3))
        text = f(self.estimate[i])
        if math.isfinite(self.lower[i]) and math.isfinite(self.upper[i]):
            text += f" [{f(self.lower[i])}, {f(self.upper[i])}]"
        return text


Kind = Literal["above", "below", "within", "rises", "falls"]


@dataclass(frozen=True)
class Check:
    """How a claim is decided. ``above``/``below``: every element's interval above (below)
    ``threshold``; ``within``: every interval inside [``threshold``, ``high``]; ``rises``/
    ``falls``: the last element's interval above (below) the first one's."""

    kind: Kind
    threshold: float = 0.0
    high: float = math.nan

    def describe(self, pct: bool) -> str:
        f = (lambda v: fmt_pct(v, 0)) if pct else (lambda v: f"{v:g}")
        return {"above": f"above {f(self.threshold)}", "below": f"below {f(self.threshold)}",
                "within": f"in [{f(self.threshold)}, {f(self.high)}]",
                "rises": "last above first", "falls": "last below first"}[self.kind]

    def element(self, est: float, lo: float, hi: float) -> int:
        """+1 (on the claimed side), -1 (wholly on the other side) or 0 (straddles) for one
        element; without an interval the estimate decides."""
        if not (math.isfinite(lo) and math.isfinite(hi)):
            lo = hi = est
        if self.kind == "above":
            return 1 if lo > self.threshold else (-1 if hi <= self.threshold else 0)
        if self.kind == "below":
            return 1 if hi < self.threshold else (-1 if lo >= self.threshold else 0)
        inside = self.threshold <= lo and hi <= self.high
        outside = hi < self.threshold or lo > self.high
        return 1 if inside else (-1 if outside else 0)

    def points(self, ev: Evidence) -> tuple[int, int]:
        """(elements whose estimate is on the claimed side, elements with an estimate)."""
        ok = ev.finite
        if self.kind in ("rises", "falls"):
            if ok.sum() < 2:
                return 0, 0
            first, last = ev.estimate[ok][0], ev.estimate[ok][-1]
            return int((last > first) if self.kind == "rises" else (last < first)), 1
        side = [self.element(e, math.nan, math.nan) == 1 for e in ev.estimate[ok]]
        return int(sum(side)), len(side)


def judge(check: Check, ev: Evidence | None) -> str:
    """The verdict of ``check`` on ``ev`` (one of :data:`VERDICTS`)."""
    if ev is None or not ev.finite.any():
        return NOT_MEASURED
    ok = ev.finite
    est, lo, hi = ev.estimate[ok], ev.lower[ok], ev.upper[ok]
    if check.kind in ("rises", "falls"):
        if len(est) < 2:
            return NOT_MEASURED
        up = check.kind == "rises"
        bounded = all(map(math.isfinite, (lo[0], hi[0], lo[-1], hi[-1])))
        a_lo, a_hi = (lo[0], hi[0]) if bounded else (est[0], est[0])
        b_lo, b_hi = (lo[-1], hi[-1]) if bounded else (est[-1], est[-1])
        if (b_lo > a_hi) if up else (b_hi < a_lo):
            return HOLDS
        if (b_hi < a_lo) if up else (b_lo > a_hi):
            return NOT_HELD
        # without intervals equal endpoints are the only way to leave it open
        return UNRESOLVED if bounded or est[-1] == est[0] else NOT_HELD
    sides = [check.element(*x) for x in zip(est, lo, hi)]
    if any(s < 0 for s in sides):
        return NOT_HELD
    return HOLDS if all(s > 0 for s in sides) else UNRESOLVED


# ------------------------------------------------------------------ the run's summaries

@dataclass
class RunSummaries:
    """The summaries of one run, each opened when a claim first reads it (``None`` where the
    run has no such file). ``inputs`` are the item's files (keys ``<kind>__<name>``), ``spec``
    its options (roles, MI analysis settings)."""

    inputs: Mapping[str, Path]
    spec: Mapping[str, Any]
    _cache: dict[str, Any] = field(default_factory=dict)

    def _path(self, key: str) -> Path | None:
        path = self.inputs.get(key)
        return Path(path) if path is not None and Path(path).exists() else None

    def _open(self, key: str, reader: Callable[[Path], Any]) -> Any:
        if key not in self._cache:
            path = self._path(key)
            self._cache[key] = None if path is None else reader(path)
        return self._cache[key]

    def __getattr__(self, name: str) -> Any:
        """``floors``, ``gaps``, ``trajectory``, ``components``, ``served``, ``api``: the
        summary of :data:`SUMMARY_FILES` (opened once), ``None`` where the run has none."""
        if name not in SUMMARY_FILES:
            raise AttributeError(name)
        return self._open(*SUMMARY_FILES[name])

    def variant_table(self, name: str) -> pd.DataFrame | None:
        """A floor variant's summary (``finite_m``, ``block16``, ``sampling_law``)."""
        return self._open(f"floor_variants__{name}", read_table)

    @property
    def cross(self) -> dict[str, GapSummary]:
        return {k[len("cross_target__gaps_"):]: GapSummary(p) for k, p in self.inputs.items()
                if k.startswith("cross_target__gaps_") and Path(p).exists()}

    @cached_property
    def mi(self) -> MILocality | None:
        paths = [self._path(k) for k in sorted(self.inputs) if k.startswith("mi__")]
        if not paths or None in paths:
            return None
        frame, meta = load_records(paths)
        analysis = self.spec["analysis"]
        return summarise_locality(frame, meta, ess_gates=[float(g) for g in self.spec["ess_gates"]],
                                  n_boot=int(analysis["bootstrap"]),
                                  level=float(analysis["level"]), seed=int(analysis["seed"]))

    @property
    def roles(self) -> tuple[str, str, str]:
        return role_variants(self.spec)


#: The summaries the claims read by name: (the item's input key, its reader).
SUMMARY_FILES: dict[str, tuple[str, Callable[[Path], Any]]] = {
    "floors": ("floors__summary", FloorSummary),
    "gaps": ("gaps__summary", GapSummary),
    "trajectory": ("gaps_trajectory__summary", GapSummary),
    "components": ("gaps_components__summary", GapSummary),
    "served": ("serving__summary", ServedSummary),
    "api": ("api_floors__summary", read_table),
}

Reader = Callable[[RunSummaries], "Evidence | None"]


@dataclass(frozen=True)
class Claim:
    """One finding of the paper: ``key`` (its macro stem), ``where`` (section, table or
    figure), ``claim`` (our words), ``statistic`` (what of the run it reads), ``check``,
    ``paper`` (the published value for the paper's target, LaTeX), ``read`` (the run's
    :class:`Evidence`, ``None`` where the run has none)."""

    key: str
    where: str
    claim: str
    statistic: str
    check: Check
    paper: str
    read: Reader
    #: the words of the run's direction: a trend's (up, down; default rises, falls), or a
    #: one-element check's (on the claimed side, not); the text cites them as
    #: ``\\fgClaim<Key>Direction``
    words: tuple[str, str] | None = None


# ------------------------------------------------------------------ readers

def _slot_labels(slots: Sequence[int]) -> list[str]:
    return [f"k={k}" for k in slots]


def _floor(stat: str, first: int = 1, *, pct: bool = False, ends: bool = False) -> Reader:
    """A floors-summary statistic over slots ``first``..last (only the two ends with
    ``ends``)."""
    def read(r: RunSummaries) -> Evidence | None:
        s = r.floors
        if s is None:
            return None
        slots = list(range(first, s.gamma))
        slots = [slots[0], slots[-1]] if ends and len(slots) > 1 else slots
        return Evidence.of(_slot_labels(slots), *s.series(stat, slots), pct=pct)
    return read


def _floor_at(stat: str, slot: int | str, *, pct: bool = False) -> Reader:
    """A floors-summary statistic at one slot (``"last"``: the final one)."""
    def read(r: RunSummaries) -> Evidence | None:
        s = r.floors
        if s is None:
            return None
        k = s.last if slot == "last" else int(slot)
        return Evidence.of([f"k={k}"], *s.series(stat, [k]), pct=pct)
    return read


def _mean_minus_median(r: RunSummaries) -> Evidence | None:
    """Final-slot mean minus median T^(0) (a point value: the summary pairs no interval)."""
    s = r.floors
    return None if s is None else Evidence.of(
        [f"k={s.last}"], [s.get("T0", s.last) - s.get("T0_median", s.last)])


def _open_above_constrained(r: RunSummaries) -> Evidence | None:
    """Per slot: the lowest open-ended domain's T^(0) minus the highest constrained one's, with
    the gap between their intervals as the interval (both sides' worst cases)."""
    s = r.floors
    if s is None:
        return None
    open_, closed = ([d for d in names if d in s.domains]
                     for names in (("alpaca", "arena-hard"), ("gsm8k", "mbpp")))
    if not (open_ and closed):
        return None
    est, lo, hi = [], [], []
    for k in s.slots:
        o = [[s.get("T0", k, d, f) for f in ("estimate", "lower", "upper")] for d in open_]
        c = [[s.get("T0", k, d, f) for f in ("estimate", "lower", "upper")] for d in closed]
        est.append(min(x[0] for x in o) - max(x[0] for x in c))
        lo.append(min(x[1] for x in o) - max(x[2] for x in c))
        hi.append(min(x[2] for x in o) - max(x[1] for x in c))
    return Evidence.of(_slot_labels(s.slots), est, lo, hi)


def _gap(stat: str, role: int, first: int = 1, *, pct: bool = False, ends: bool = False,
         last_only: bool = False) -> Reader:
    """A gaps-summary statistic of the drafter of ``role`` (0: order-0 baseline, 1: order-1
    baseline, 2: ours) over slots ``first``..last (only the two ends with ``ends``, only the
    last with ``last_only``)."""
    def read(r: RunSummaries) -> Evidence | None:
        s, v = r.gaps, r.roles[role]
        if s is None or v not in s.variants:
            return None
        slots = list(range(first, s.gamma))
        slots = [s.last] if last_only else ([slots[0], slots[-1]] if ends else slots)
        return Evidence.of(_slot_labels(slots), *s.series(stat, v, slots), pct=pct)
    return read


def _gap_scalar(stat: str, role: int) -> Reader:
    def read(r: RunSummaries) -> Evidence | None:
        s, v = r.gaps, r.roles[role]
        if s is None or v not in s.variants:
            return None
        return Evidence.of([v], *[[s.get(stat, v, field=f)] for f in ("estimate", "lower",
                                                                       "upper")])
    return read


def _contrast(stat: str, a: int, b: int, *, pct: bool = False) -> Reader:
    """A paired contrast of the gaps summary, drafter ``a`` minus drafter ``b`` (roles): a
    scalar (``diff_tau``) or its value at the final slot."""
    def read(r: RunSummaries) -> Evidence | None:
        s = r.gaps
        if s is None:
            return None
        pair = f"{r.roles[a]}-{r.roles[b]}"
        if not (s.df["variant"] == pair).any():
            return None
        k = -1 if stat == "diff_tau" else s.last
        return Evidence.of([pair if k < 0 else f"k={k}"], *s.series(stat, pair, [k]), pct=pct)
    return read


def _minus(a: Sequence, b: Sequence) -> tuple:
    """``a - b`` of two (estimate, lower, upper) triples, with the worst-case interval (the
    summaries pair no difference of these)."""
    (ea, la, ha), (eb, lb, hb) = a, b
    return ea - eb, la - hb, ha - lb


def _gap_minus(stat_a: str, stat_b: str, role: int, first: int = 0) -> Reader:
    """``stat_a - stat_b`` of one drafter by slot, with the worst-case gap between the two
    intervals as the interval (the summary holds no paired difference of these)."""
    def read(r: RunSummaries) -> Evidence | None:
        s, v = r.gaps, r.roles[role]
        if s is None or v not in s.variants:
            return None
        ks = list(range(first, s.gamma))
        return Evidence.of(_slot_labels(ks), *_minus(s.series(stat_a, v, ks),
                                                     s.series(stat_b, v, ks)))
    return read


def _cross(stat: str, role: int, *, pct: bool = False, minus: str | None = None) -> Reader:
    """A final-slot gaps statistic on every target of the run (``minus``: less another
    statistic of the same drafter on the same paths, worst-case interval)."""
    def read(r: RunSummaries) -> Evidence | None:
        cross = r.cross
        v = r.roles[role]
        rows, labels = [], []
        for t, s in cross.items():
            if v not in s.variants:
                continue
            row = [x[0] for x in s.series(stat, v, [s.last])]
            if minus is not None:
                row = _minus(row, [x[0] for x in s.series(minus, v, [s.last])])
            rows.append(row)
            labels.append(t)
        return Evidence.of(labels, *zip(*rows), pct=pct) if rows else None
    return read


def _mi_pooled(*orders: int, pct: bool = True) -> Reader:
    """Pooled rho_{k,m} for each of ``orders`` (the elements, in order)."""
    def read(r: RunSummaries) -> Evidence | None:
        mi = r.mi
        if mi is None:
            return None
        t = mi.table[mi.table["section"] == "pooled"].set_index("order")
        rows = [[float(t.at[m, f]) if m in t.index else math.nan
                 for f in ("rho", "lower", "upper")] for m in orders]
        return Evidence.of([f"m={m}" for m in orders], *zip(*rows), pct=pct)
    return read


def _mi_gate_spread(r: RunSummaries) -> Evidence | None:
    """The spread of the pooled order-1 recovery across the ESS gates (largest minus
    smallest; a point value)."""
    mi = r.mi
    if mi is None or 1 not in mi.per_order.index:
        return None
    row = mi.per_order.loc[1]
    return Evidence.of(["m=1"], [float(row["gate_rho_max"]) - float(row["gate_rho_min"])],
                       pct=True)


def _kmedian(r: RunSummaries) -> Evidence | None:
    """Final-slot share of T^(0) removed by K prototypes, at the smallest and largest K >= 2."""
    s = r.floors
    if s is None:
        return None
    ks = sorted(int(st.rsplit("K", 1)[1]) for st in s.df["statistic"].unique()
                if st.startswith("kmedian_share_removed_K"))
    ks = [k for k in ks if k > 1]
    if len(ks) < 2:
        return None
    rows = [[s.get(f"kmedian_share_removed_K{k}", s.last, field=f)
             for f in ("estimate", "lower", "upper")] for k in (ks[0], ks[-1])]
    return Evidence.of([f"K={ks[0]}", f"K={ks[-1]}"], *zip(*rows), pct=True)


def _trajectory(r: RunSummaries) -> Evidence | None:
    """Offline tau of ours after its first and last evaluated epoch."""
    s = r.trajectory
    if s is None:
        return None
    ours = r.roles[2]
    labels = sorted((lab for lab in s.variants if lab.startswith(f"{ours}@epoch-")),
                    key=lambda lab: int(lab.rsplit("-", 1)[1]))
    if len(labels) < 2:
        return None
    rows = [[s.get("tau", lab, field=f) for f in ("estimate", "lower", "upper")]
            for lab in (labels[0], labels[-1])]
    return Evidence.of([labels[0], labels[-1]], *zip(*rows))


def _components_best(r: RunSummaries) -> Evidence | None:
    """The combined arm's paired tau change from the baseline arm minus the best other arm's
    (a point value: positive when the combined arm is best)."""
    s = r.components
    base, arms = r.spec.get("components_baseline"), list(r.spec.get("arms") or [])
    combined = "head_conv_slots"
    if s is None or combined not in arms or base is None:
        return None
    tau = {a: s.get("tau", a) for a in arms}
    others = [t for a, t in tau.items() if a != combined and math.isfinite(t)]
    if not others or not math.isfinite(tau[combined]):
        return None
    return Evidence.of([combined], [tau[combined] - max(others)])


def _served_diff(stat: str, temperature: float) -> Reader:
    """Served ours minus DSpark (task macro; tau averaged over concurrency, speedup at the
    sequential level), a point value."""
    def read(r: RunSummaries) -> Evidence | None:
        s = r.served
        _, v1, vo = r.roles
        if s is None or v1 not in s.systems or vo not in s.systems \
                or temperature not in s.temperatures:
            return None
        conc = 0 if stat == "tau" else min(s.levels)
        a, b = (float(s.row(stat, v, "macro", temperature, conc)["estimate"]) for v in (vo, v1))
        return Evidence.of([f"T={temperature:g}"], [a / b - 1], pct=True)
    return read


def _served_speedup(r: RunSummaries) -> Evidence | None:
    """The order-1 baseline's sequential speedup over AR at each temperature (point values)."""
    s = r.served
    v1 = r.roles[1]
    if s is None or v1 not in s.systems:
        return None
    seq = min(s.levels)
    return Evidence.of([f"T={t:g}" for t in s.temperatures],
                       [float(s.row("speedup", v1, "macro", t, seq)["estimate"])
                        for t in s.temperatures])


def _variant(name: str, column: str, *, first: int = 1, ends: bool = False,
             pct: bool = False) -> Reader:
    """A floor variant's column by slot under the evaluation law, at its largest path count
    (means over its anchors; point values)."""
    def read(r: RunSummaries) -> Evidence | None:
        df = r.variant_table(name)
        if df is None:
            return None
        df = df[df["law"] == "evaluation"]
        if "paths" in df:
            df = df[df["paths"] == df["paths"].max()]
        df = df.set_index("slot").sort_index()
        slots = [k for k in df.index if k >= first]
        slots = [slots[0], slots[-1]] if ends and len(slots) > 1 else slots
        return Evidence.of(_slot_labels(slots), df.loc[slots, column].to_numpy(float), pct=pct)
    return read


def _finite_m_change(r: RunSummaries) -> Evidence | None:
    """|T^(0) at the largest M - T^(0) at the smallest M| by slot (point values)."""
    df = r.variant_table("finite_m")
    if df is None:
        return None
    df = df[df["law"] == "evaluation"]
    ms = sorted(df["paths"].unique())
    if len(ms) < 2:
        return None
    a, b = (df[df["paths"] == m].set_index("slot")["t0"] for m in (ms[0], ms[-1]))
    diff = (b - a).abs().loc[1:]
    return Evidence.of(_slot_labels(diff.index), diff.to_numpy(float))


def _law_change(r: RunSummaries) -> Evidence | None:
    """Final-slot T^(0) under the training law minus under the evaluation law (point)."""
    df = r.variant_table("sampling_law")
    if df is None:
        return None
    base, train = (df[df["law"] == law].set_index("slot")["t0"] for law in ("evaluation",
                                                                           "variant"))
    last = int(base.index.max())
    return Evidence.of([f"k={last}"], [float(train.at[last] - base.at[last])])


def _api_removed(r: RunSummaries) -> Evidence | None:
    """The share of the truncated order-0 floor one realised token removes through the API,
    slots 2 onwards (point values)."""
    df = r.api
    if df is None:
        return None
    rows = df[(df["scope"] == "all") & (df["slot"] >= 2)].sort_values("slot")
    return Evidence.of(_slot_labels(rows["slot"].astype(int)),
                       rows["t1_removed_share"].to_numpy(float), pct=True)


# ------------------------------------------------------------------ the claims

_ABOVE0, _BELOW0 = Check("above", 0.0), Check("below", 0.0)

#: The paper's findings this workflow checks, in the paper's order.
CLAIMS: tuple[Claim, ...] = (
    # Sec. 3.1: the cost of parallel blindness
    Claim("floor_zero_at_slot_zero", "Sec. 3.1, Tab. 5",
          "Nothing in the block is missing at slot 0, so its order-0 floor is zero.",
          "$T^{(0)}_0$", Check("below", 1e-3), "0.00", _floor_at("T0", 0)),
    Claim("floor_positive", "App. C.8, Tab. 3",
          "The order-0 floor is above zero at every slot from 1 on.",
          "$T^{(0)}_k$, $k\\ge1$", _ABOVE0, "[0.055, 0.101] at $k=1$ to [0.239, 0.334] at $k=6$",
          _floor("T0")),
    Claim("floor_rises_with_slot", "Sec. 3.1, Fig. 2",
          "The order-0 floor rises from slot 1 to the final slot.",
          "$T^{(0)}_1$, $T^{(0)}_{\\gamma-1}$", Check("rises"), "0.078 to 0.286",
          _floor("T0", ends=True)),
    Claim("acceptance_cap_last", "Sec. 3.1, abstract",
          "Parallel blindness binds: the final-slot floor is at least 0.1, so an ideal "
          "all-parallel drafter accepts less than 90\\% there.",
          "$T^{(0)}_{\\gamma-1}$", Check("above", 0.1), "0.286 (cap 71\\%)",
          _floor_at("T0", "last")),
    Claim("open_domains_above", "Sec. 3.1, Fig. 3",
          "The open-ended domains (alpaca, arena-hard) have higher order-0 floors than the "
          "constrained ones (gsm8k, mbpp) at every slot from 1 on.",
          "lowest open minus highest constrained $T^{(0)}_k$", _ABOVE0, "every slot 1-6",
          _open_above_constrained),
    Claim("floor_concentrated_slot_one", "Sec. 3.1",
          "At slot 1 the top decile of anchors carries most of the floor.",
          "top-decile share of $T^{(0)}_1$", Check("above", 0.5), "60\\%",
          _floor_at("T0_topdecile_share", 1, pct=True)),
    Claim("most_anchors_near_zero_slot_one", "Sec. 3.1",
          "At slot 1 most anchors have a floor below 0.01.",
          "share of anchors with $T^{(0)}_1<0.01$", Check("above", 0.5), "two thirds",
          _floor_at("T0_share_below_001", 1, pct=True)),
    Claim("concentration_falls_with_depth", "Sec. 3.1",
          "The floor spreads over more anchors with depth: the top decile's share falls from "
          "slot 1 to the final slot.",
          "top-decile share, $k=1$ and $\\gamma-1$", Check("falls"), "60\\% to 27\\%",
          _floor("T0_topdecile_share", ends=True, pct=True)),
    Claim("floor_right_skewed_last", "Sec. 3.1",
          "At the final slot the mean floor exceeds the median.",
          "mean minus median $T^{(0)}_{\\gamma-1}$", _ABOVE0, "0.286 against 0.199",
          _mean_minus_median),
    # Sec. 3.2: how much conditioning is needed
    Claim("one_token_removes_most", "Sec. 3.2, abstract, Tab. 3",
          "One realised predecessor removes at least 86\\% of the order-0 floor at every slot "
          "from 2 on (split-half grouping).",
          "$(T^{(0)}_k-T^{(1)}_k)/T^{(0)}_k$, $k\\ge2$", Check("above", 0.86), "86-100\\%",
          _floor("share_removed_split_covered", 2, pct=True)),
    Claim("one_token_removes_most_importance", "Sec. 3.2, App. C.2",
          "The importance route, the second estimate, also finds at least 86\\% removed at "
          "every slot from 2 on.",
          "share removed (importance), $k\\ge2$", Check("above", 0.86), "86-100\\%",
          _floor("share_removed_reweighted", 2, pct=True)),
    Claim("order_one_floor_small", "Sec. 3.2, Tab. 3",
          "The order-1 floor stays small (below 0.1) at every slot.",
          "$T^{(1)}_k$ (split-half, covered)", Check("below", 0.1), "at most 0.041",
          _floor("T1_split_covered", 1)),
    Claim("order_one_resolution", "App. C.1",
          "At slot 1, where the order-1 floor is zero by identity, the estimator returns "
          "nearly zero (below 0.01).",
          "$T^{(1)}_1$", Check("below", 0.01), "$1\\times10^{-3}$",
          _floor_at("T1_split_covered", 1)),
    Claim("mi_one_token", "Sec. 3.2, Tab. 4",
          "The last realised token recovers at least 90\\% of the missing path information "
          "(pooled over slots).",
          "$\\rho_{k,1}$ pooled", Check("above", 0.9), "94.3\\% [91.8, 96.2]",
          _mi_pooled(1)),
    Claim("mi_two_tokens", "Sec. 3.2, Tab. 4",
          "Two realised tokens recover at least 98\\% of it.",
          "$\\rho_{k,2}$ pooled", Check("above", 0.98), "99.0\\% [98.3, 99.5]", _mi_pooled(2)),
    Claim("mi_more_tokens_more", "Sec. 3.2, Tab. 4",
          "More realised tokens recover more: the pooled recovery rises from one to four "
          "tokens.",
          "$\\rho_{k,1}$, $\\rho_{k,4}$ pooled", Check("rises"), "94.3\\% to 99.8\\%",
          _mi_pooled(1, 4)),
    Claim("mi_gate_insensitive", "App. C.5",
          "The order-1 recovery hardly moves under effective-sample-size gates (spread below "
          "5 points).",
          "spread of pooled $\\rho_{k,1}$ over the gates", Check("below", 0.05),
          "93.9-95.2\\% (1.3 points)", _mi_gate_spread),
    Claim("effective_support_small", "Sec. 3.2, App. D.1",
          "The final-slot block prefixes concentrate on a few paths: median effective support "
          "below 3.",
          "median $N_{\\mathrm{eff}}$", Check("below", 3.0), "1.8",
          _floor_at("neff_median", "last")),
    Claim("support_predicts_floor", "App. D.1",
          "Anchors with a larger effective support have higher final-slot floors (positive "
          "correlation on the log scale).",
          "corr.\\ $\\log N_{\\mathrm{eff}}$, $T^{(0)}_{\\gamma-1}$", _ABOVE0, "$+0.90$",
          _floor_at("corr_log_neff_T0", "last")),
    Claim("prototypes_help_more_with_k", "App. D.2, Fig. D.2",
          "More oracle-routed prototypes remove more of the final-slot floor.",
          "share removed at the smallest and largest $K$", Check("rises"),
          "43\\% ($K=2$) to 71\\% ($K=4$)", _kmedian),
    # Sec. 3.3: how far drafters are from their floors
    Claim("dflash_gap_majority", "Sec. 3.3, Tab. 5",
          "Most of the order-0 drafter's rejection is model gap at every slot from 1 on.",
          "$G^{(0)}_k/R_k$", Check("above", 0.5), "55-67\\%",
          _gap("G0_share", 0, pct=True)),
    Claim("dflash_gap_share_last_range", "Abstract, Sec. 3.4",
          "At the final slot the order-0 drafter's model gap is 43-64\\% of its rejection.",
          "$G^{(0)}_{\\gamma-1}/R_{\\gamma-1}$", Check("within", 0.43, 0.64), "43-64\\%",
          _gap("G0_share", 0, pct=True, last_only=True)),
    Claim("dflash_gap_exceeds_floor", "Sec. 3.3, Fig. 4",
          "The order-0 drafter's model gap exceeds its floor at every slot.",
          "$G^{(0)}_k-T^{(0)}_k$", _ABOVE0, "every slot",
          _gap_minus("G0", "T0", 0)),
    Claim("dflash_risk_rises", "Sec. 3.3, Tab. 5",
          "The order-0 drafter's risk rises from slot 0 to the final slot.",
          "$R_0$, $R_{\\gamma-1}$", Check("rises"), "0.14 to 0.64",
          _gap("R", 0, 0, ends=True)),
    Claim("dflash_gap_share_falls", "App. E.1, Tab. 5",
          "The gap's share of the order-0 drafter's rejection falls from slot 1 to the final "
          "slot.",
          "$G^{(0)}_k/R_k$, $k=1$ and $\\gamma-1$", Check("falls"), "67.3\\% to 55.0\\%",
          _gap("G0_share", 0, pct=True, ends=True)),
    Claim("dspark_gap_share", "Sec. 3.3, Tab. 6",
          "Fed the target's predecessor, the order-1 drafter's rejection is at least 85\\% "
          "model gap at every slot from 1 on.",
          "$G^{(1)}_k/R^{\\mathrm{oracle}}_k$", Check("above", 0.85), "89-100\\%",
          _gap("G1_share", 1, pct=True)),
    Claim("dspark_gap_share_last_range", "Abstract, Sec. 3.4",
          "At the final slot the order-1 drafter's gap is 85-92\\% of its oracle rejection.",
          "$G^{(1)}_{\\gamma-1}/R^{\\mathrm{oracle}}_{\\gamma-1}$", Check("within", 0.85, 0.92),
          "85-92\\%", _gap("G1_share", 1, pct=True, last_only=True)),
    Claim("dspark_exposure_positive", "Sec. 3.3, Tab. 6",
          "Feeding the order-1 drafter its own predecessor costs more than the target's: "
          "positive exposure at every slot from 1 on.",
          "$E^{\\mathrm{expo}}_k$", _ABOVE0, "0.12 ($k=2$) to 0.21 ($k=6$)",
          _gap("exposure", 1)),
    Claim("dspark_exposure_rises", "Sec. 3.3, Tab. 6",
          "The exposure rises from slot 1 to the final slot.",
          "$E^{\\mathrm{expo}}_1$, $E^{\\mathrm{expo}}_{\\gamma-1}$", Check("rises"),
          "0.08 to 0.21", _gap("exposure", 1, ends=True)),
    # Sec. 3.4: across targets
    Claim("cross_dspark_above_floor", "Sec. 3.4, Fig. 5",
          "On every target, the order-1 drafter's oracle risk at the final slot is above the "
          "order-0 floor (both on every path).",
          "$R^{\\mathrm{oracle}}_{\\gamma-1}-T^{(0)}_{\\gamma-1}$ per target", _ABOVE0,
          "every target (0.37 against 0.29 on Qwen3-4B)",
          _cross("R_oracle_all", 1, minus="T0")),
    Claim("cross_dflash_gap_majority", "Sec. 3.4, Fig. 5",
          "On every target the model gap is at least 40\\% of the order-0 drafter's final-slot "
          "rejection.",
          "$G^{(0)}_{\\gamma-1}/R_{\\gamma-1}$ per target", Check("above", 0.4), "43-64\\%",
          _cross("G0_share", 0, pct=True)),
    # Sec. 3.5: from per-slot risk to serving
    Claim("serving_risk_lower", "Sec. 3.5, Tab. 7",
          "Weighting by the chance of reaching a slot lowers the order-0 drafter's risk at "
          "every slot from 1 on.",
          "$R^{\\mathrm{serve}}_k-R_k$", _BELOW0, "$-0.07$ to $-0.42$",
          _gap("R_serve_minus_free", 0)),
    Claim("serving_reduction_grows", "Sec. 3.5, Tab. 7",
          "That reduction grows with depth: the difference falls from slot 1 to the final "
          "slot.",
          "$R^{\\mathrm{serve}}_k-R_k$, $k=1$ and $\\gamma-1$", Check("falls"),
          "$-0.07$ to $-0.42$", _gap("R_serve_minus_free", 0, ends=True)),
    Claim("dependence_raises_tau", "App. F.2, Tab. 8",
          "Accept factors are positively dependent: the accepted length exceeds the "
          "independent-slots value.",
          "$\\tau-\\tau^{\\mathrm{indep}}$ (order 0)", _ABOVE0, "4.574 against 3.397",
          _gap_scalar("tau_gap", 0)),
    Claim("early_slots_first", "Sec. 3.5, App. F.5",
          "Improving one slot helps most early: the single-slot best-response gain falls from "
          "slot 0 to the final slot.",
          "$\\Delta\\tau^{\\mathrm{BR}}_0$, $\\Delta\\tau^{\\mathrm{BR}}_{\\gamma-1}$",
          Check("falls"), "0.221 to 0.056", _gap("dtau_br", 0, 0, ends=True)),
    Claim("gap_grows_with_slot", "Sec. 3.5",
          "The order-0 drafter's model gap grows from slot 0 to the final slot.",
          "$G^{(0)}_0$, $G^{(0)}_{\\gamma-1}$", Check("rises"), "0.14 to 0.35 ($2.6\\times$)",
          _gap("G0", 0, 0, ends=True)),
    Claim("sweep_superadditive", "App. F.6",
          "Improving all slots in a sweep gains more than the sum of the single-slot gains.",
          "forward sweep minus isolated sum (order 0)", _ABOVE0, "2.15 against 0.98",
          _gap_scalar("sweep_forward_minus_isolated", 0)),
    # Sec. 4: the prefix-attention head
    Claim("ours_gap_lower", "Sec. 4, Fig. 7",
          "The prefix-attention head shrinks the final-slot model gap relative to the order-1 "
          "baseline.",
          "relative gap reduction at $\\gamma-1$", _ABOVE0, "25.5\\% (0.33 to 0.24)",
          _contrast("gap_reduction", 2, 1, pct=True), ("shrinks", "widens")),
    Claim("ours_exposure_higher", "Sec. 4, Tab. 12",
          "The head's exposure at the final slot is higher than the order-1 baseline's.",
          "paired exposure difference at $\\gamma-1$", _ABOVE0, "0.21 to 0.26",
          _contrast("diff_exposure", 2, 1)),
    Claim("ours_tau_higher", "Sec. 4, Tab. 1",
          "The head raises the accepted length over the order-1 baseline (offline, paired).",
          "$\\tau$ ours minus order-1 baseline", _ABOVE0, "$+3.93\\%$ served at $T=1$",
          _contrast("diff_tau", 2, 1)),
    Claim("served_tau_higher", "Sec. 4, Tab. 1",
          "Served, the head's accepted length is above the order-1 baseline's at $T=1$.",
          "served $\\tau$ ratio minus 1, $T=1$", _ABOVE0, "$+3.93\\%$ (4.75 to 4.94)",
          _served_diff("tau", 1.0)),
    Claim("served_speedup", "Sec. 4, Tab. 1",
          "Served block drafting is faster than plain decoding: the order-1 baseline's "
          "sequential speedup is above 1.",
          "speedup over AR", Check("above", 1.0), "$3.62\\times$ ($T=0$), $3.34\\times$ ($T=1$)",
          _served_speedup),
    Claim("trajectory_rises", "App. H.3, Tab. 10",
          "The head's accepted length rises with training epochs.",
          "offline $\\tau$ after the first and last epoch", Check("rises"), "4.29 to 4.94",
          _trajectory),
    Claim("components_combined_best", "App. H.6, Tab. 13",
          "Of the one-epoch arms, the head with convolution and slot embeddings is best.",
          "its $\\tau$ minus the best other arm's", _ABOVE0, "+0.20 over vanilla (best)",
          _components_best),
    # Appendix C: robustness
    Claim("split_fit_check_small", "App. C.3",
          "Fitting the order-0 barycentre on half of the paths and scoring it on the other "
          "moves the floor by less than 0.01.",
          "$T^{(0)}_{\\mathrm{split}}-T^{(0)}$", Check("within", -0.01, 0.01),
          "at most 0.006", _floor("T0_split_minus_T0")),
    Claim("finite_m_insensitive", "App. C.3, Tab. C.3",
          "More paths per anchor change the order-0 floor by less than 0.01.",
          "$|T^{(0)}$ at the largest $-$ smallest $M|$", Check("below", 0.01),
          "at most $2.4\\times10^{-3}$", _finite_m_change),
    Claim("long_block_rises", "App. C.4, Tab. C.4",
          "In a longer block the order-0 floor keeps rising to the last slot.",
          "$T^{(0)}_1$, $T^{(0)}_{\\mathrm{last}}$ ($\\gamma=16$)", Check("rises"),
          "0.08 to 0.473", _variant("block16", "t0", ends=True)),
    Claim("long_block_removed", "App. C.4, Tab. C.4",
          "In the longer block one realised token still removes at least 80\\% of the floor "
          "from slot 2 on.",
          "share removed, $k\\ge2$ ($\\gamma=16$)", Check("above", 0.8), "80.9-97.9\\%",
          _variant("block16", "share_removed", first=2, pct=True)),
    Claim("top20_negligible", "App. C.6",
          "Reading only each position's top 20 probabilities moves the order-0 floor by less "
          "than 0.001.",
          "top-20 minus full $T^{(0)}_k$", Check("within", -1e-3, 1e-3),
          "at most $1.7\\times10^{-5}$", _floor("T0_top20_minus_full")),
    Claim("api_one_token_removes_most", "Sec. 3.4, App. C.6",
          "Through a top-$K$ API, one realised token removes at least 86\\% of the truncated "
          "floor from slot 2 on.",
          "share removed (API reads), $k\\ge2$", Check("above", 0.86),
          "86-90\\% (DeepSeek-V4-Pro)", _api_removed),
    Claim("training_law_lowers_floor", "App. C.7",
          "Under the drafters' training law (lower temperature, truncated) the final-slot "
          "floor is lower.",
          "$T^{(0)}_{\\gamma-1}$ train minus evaluation law", _BELOW0, "0.16 to 0.09 (gsm8k)",
          _law_change),
)

#: How the text names each drafter role (config ``drafters.roles``).
ROLE_WORDS = {"order0": "the order-0 baseline", "order1": "the order-1 baseline",
              "ours": "the prefix-attention head"}

#: The paper's own setting, which the text sets beside the run's (paper Sec. 3.1, App. H.2).
PAPER_SETTING = {"target": "Qwen3-4B", "anchors": "384", "paths": "256",
                 "drafter layers": "five"}


def _verdict_phrase(verdict: str) -> str:
    """A verdict as the predicate of a sentence ("this finding ...")."""
    return {HOLDS: "holds", NOT_HELD: "does not hold",
            UNRESOLVED: "is not resolved by the intervals", NOT_MEASURED: "is not measured"}[verdict]


def _run_text(claim: Claim, ev: Evidence | None) -> str:
    """The run's numbers as the table and the text cite them."""
    if ev is None or not ev.finite.any():
        return "--"
    idx = np.flatnonzero(ev.finite)
    if len(idx) == 1:
        return f"{ev.show(idx[0])} ({tex_label(ev.labels[idx[0]])})"
    if claim.check.kind in ("rises", "falls"):
        return (f"{ev.show(idx[0])} ({tex_label(ev.labels[idx[0]])}) to {ev.show(idx[-1])} "
                f"({tex_label(ev.labels[idx[-1]])})")
    f = (lambda v: fmt_pct(v)) if ev.pct else (lambda v: fmt(v, 3))
    est = ev.estimate[idx]
    return (f"{f(est.min())} to {f(est.max())} over {tex_label(ev.labels[idx[0]])}.."
            f"{tex_label(ev.labels[idx[-1]])}")


def tex_label(label: str) -> str:
    """An element label (``k=3``, a target name, ``ours@epoch-2``) as LaTeX text."""
    return label.replace("_", "\\_").replace("@", "\\,@")


def direction(claim: Claim, ev: Evidence | None) -> str:
    """The words of what the run shows, never against the verdict. A trend or a one-element
    check with ``words``: its word by the estimate when the intervals decide, "moves (changes),
    within its intervals," when they do not, "(not measured)" without a value; any other check:
    how many elements' estimates sit on the claimed side ("4 of 6")."""
    verdict = judge(claim.check, ev)
    trend = claim.check.kind in ("rises", "falls")
    verb = "moves" if trend else "changes"
    if verdict == NOT_MEASURED:
        return f"{verb} (not measured)" if trend or claim.words else "--"
    on_side, n = claim.check.points(ev)
    up, down = claim.words or ("rises", "falls")
    if not trend and (n > 1 or claim.words is None):
        return f"{on_side} of {n}"
    if verdict == UNRESOLVED:
        return f"{verb}, within its interval{'s' if trend else ''},"
    if trend:
        est = ev.estimate[ev.finite]
        return up if est[-1] > est[0] else down
    return up if on_side else down


@dataclass(frozen=True)
class ClaimResult:
    """One claim's verdict on the run, with what the table and the text print."""

    claim: Claim
    evidence: Evidence | None
    verdict: str

    @property
    def points(self) -> tuple[int, int]:
        return (0, 0) if self.evidence is None else self.claim.check.points(self.evidence)


def evaluate(inputs: Mapping[str, Path], spec: Mapping[str, Any],
             claims_: Sequence[Claim] = CLAIMS) -> list[ClaimResult]:
    """Every claim's verdict on the run whose summaries are ``inputs``."""
    run = RunSummaries(inputs, spec)
    results = []
    for c in claims_:
        ev = c.read(run)
        results.append(ClaimResult(c, ev, judge(c.check, ev)))
    return results


def counts(verdicts: Sequence[str]) -> dict[str, int]:
    """How many claims got each verdict."""
    return {v: sum(x == v for x in verdicts) for v in VERDICTS}


def count_line(verdicts: Sequence[str]) -> str:
    """The one line a run ends with: how many of the paper's findings got each verdict."""
    n = counts(verdicts)
    return (f"the paper's findings on this run: {n[HOLDS]} held, {n[NOT_HELD]} not held, "
            f"{n[UNRESOLVED]} not resolved, {n[NOT_MEASURED]} not measured "
            f"(of {len(verdicts)}; paper/tables/claims.csv)")


def _table(results: Sequence[ClaimResult], out_dir: Path) -> None:
    """``claims.csv`` (full precision: one row per claim and element) and ``claims.tex`` (a
    longtable the paper inputs as it is: one row per claim)."""
    csv = []
    for r in results:
        c, ev = r.claim, r.evidence
        base = {"claim": c.key, "where": c.where, "statement": c.claim, "check": c.check.kind,
                "threshold": c.check.threshold, "high": c.check.high, "verdict": r.verdict,
                "paper": c.paper}
        if ev is None:
            csv.append(base | {"element": "", "estimate": math.nan, "lower": math.nan,
                               "upper": math.nan})
        else:
            csv += [base | {"element": lab, "estimate": e, "lower": lo, "upper": hi}
                    for lab, e, lo, hi in zip(ev.labels, ev.estimate, ev.lower, ev.upper)]
    shown = pd.DataFrame([[c.where, c.claim, f"{c.statistic}: "
                           f"{c.check.describe(bool(r.evidence and r.evidence.pct))}",
                           _run_text(c, r.evidence), c.paper, r.verdict]
                          for r in results for c in [r.claim]],
                         columns=["Where", "Finding", "Check", "This run", "Paper", "Verdict"])
    write_table(pd.DataFrame(csv), "claims", tex_dir=out_dir, latex=shown,
                column_format="".join(f">{{\\raggedright\\arraybackslash}}p{{{w}\\linewidth}}"
                                      for w in (0.08, 0.25, 0.17, 0.19, 0.11, 0.08)),
                environment="longtable")


def _claim_macros(r: ClaimResult) -> dict[str, str]:
    stem = ("claim", r.claim.key)
    on_side, n = r.points
    return {macro_name(*stem, "verdict"): r.verdict,
            macro_name(*stem, "says"): _verdict_phrase(r.verdict),
            macro_name(*stem, "run"): _run_text(r.claim, r.evidence),
            macro_name(*stem, "paper"): r.claim.paper,
            macro_name(*stem, "direction"): direction(r.claim, r.evidence),
            macro_name(*stem, "check"): r.claim.check.describe(
                bool(r.evidence is not None and r.evidence.pct)),
            macro_name(*stem, "count"): f"{on_side} of {n}"}


def _drafter_words(d: Mapping[str, Any]) -> str:
    """A role's drafter in words: imported from its folder or hub id (a URL-like path breaks
    across lines), or trained with its kind, layers and epochs."""
    if "imported" in d:
        return f"{tex_text(d['name'])}, imported from \\url{{{d['imported']}}}"
    s = lambda n: "s" * (int(n) != 1)
    return (f"{tex_text(d['name'])}, a {tex_text(d['kind'])} drafter of {d['layers']} "
            f"layer{s(d['layers'])} trained for {d['epochs']} epoch{s(d['epochs'])}")


def _setting_macros(setting: Mapping[str, Any]) -> dict[str, str]:
    """The run's setting from its config (``spec["setting"]``) and the paper's beside it."""
    values = {macro_name("paper", key): text for key, text in PAPER_SETTING.items()}
    device = str(setting["device"])
    values[macro_name("setting", "device")] = (
        "CPU" if device == "cpu" else "GPU" if device.startswith("cuda") else tex_text(device))
    values[macro_name("setting", "dtype")] = tex_text(setting["dtype"])
    values[macro_name("setting", "taps")] = "$[" + ", ".join(map(str, setting["taps"])) + "]$"
    values[macro_name("setting", "top", "k")] = str(setting["top_k_targets"])
    values[macro_name("setting", "drafters")] = "; ".join(
        f"{ROLE_WORDS.get(role, tex_text(role))} {_drafter_words(d)}"
        for role, d in setting["drafters"].items())
    return values


def claims(inputs: Mapping[str, Path], spec: Mapping[str, Any], out_dir: Path
           ) -> dict[str, str]:
    """The claims table: every finding of :data:`CLAIMS` checked on the run's summaries
    (``inputs``, keys ``<summary kind>__<name>``); ``spec`` holds the drafter roles, the MI
    analysis settings, the component arms and the run's ``setting``. Returns each claim's
    macros, the verdict counts and the setting macros; logs the count line."""
    results = evaluate(inputs, spec)
    _table(results, out_dir)
    values: dict[str, str] = {}
    for r in results:
        values.update(_claim_macros(r))
        log.info("%-36s %-14s run %s | paper %s", r.claim.key, r.verdict,
                 _run_text(r.claim, r.evidence), r.claim.paper)
    n = counts([r.verdict for r in results])
    for verdict, word in zip(VERDICTS, ("held", "not held", "not resolved", "not measured")):
        values[macro_name("claims", word)] = str(n[verdict])
        names = [f"{r.claim.claim.rstrip('.')} ({r.claim.where})" for r in results
                 if r.verdict == verdict]
        values[macro_name("claims", word, "list")] = "; ".join(names) if names else "none"
    values[macro_name("claims", "total")] = str(len(results))
    values.update(_setting_macros(spec["setting"]))
    log.info("%s", count_line([r.verdict for r in results]))
    return values
