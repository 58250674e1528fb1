"""``floorgap check``: is a drafter under-trained, up against its floor, or better than another?

The check_report stage reads the gaps summary of the ``decompose`` group and the floors summary
of one target and writes, for the drafters one check names, a page a person reads
(``index.html``: the verdicts at the top, figures inline, the tables, the command and config
that produced it) and its markdown summary (``summary.md``, printed by the command). This module
turns the numbers into the check and its verdicts; :mod:`floorgap.reports.check_page` draws it.

For each drafter, from its decomposition (:mod:`floorgap.reports.decomposition`): the floor,
the risk and the model gap by slot with the lookup tables of its order beside it, the offline
accepted length tau, and the single-slot best-response gain dtau_br by slot (held out: which
slot to fix first). Its verdicts, each one line computed from those numbers with the threshold
it states:

* **under-trained**: "loses to a lookup table (<table>) at slots ..." where its paired risk
  difference from a table of its order is not below zero
  (:mod:`floorgap.analysis.lookup_verdicts`);
* **floor**: "within 10% of its floor at slots ..." where the model gap G is at most
  :data:`FLOOR_SHARE` of its risk (a better drafter of this order cannot win much back there),
  else how large the gap's share is;
* **order**: the floor of the other conditioning order at the last slot, T^(0) against T^(1):
  what a drafter that sees its predecessor could reach (order 0), or what seeing it removes
  (order 1);
* **fix first**: the slot with the largest held-out dtau_br;
* **export**: for a folder exported from weights trained here (a reference), whether it reads as
  those weights (:mod:`floorgap.probes.export_fidelity`: mean TV(q_ref, q) at most
  :data:`FIDELITY_TV` at every slot), else an export or layout fault; without a reference, that
  an export fault would look like a poorly trained drafter;
* **engine**: for a folder served in the engine on a few rows per task (the serving stage) and
  every round replayed offline with the reference weights, or without one with floorgap's import
  of the folder (the serving_replay stage): "the engine serves what the weights predict" when at
  temperature 1 the accepted drafts agree with the replayed acceptance probabilities (|z| at
  most :data:`SERVED_Z`) and the served tokens are draws from the target's law (lossless |z| at
  most :data:`SERVED_Z`), and at temperature 0 at least :data:`GREEDY_SHARE` of the rounds are
  reproduced; else "engine or layout fault" with the statistics and the first divergent round;
  and "cannot tell" where too few drafts are accepted for a fault to show
  (:data:`MIN_DRAFTS`, :data:`MIN_ACTIVE_ROUNDS`). A fault is named where the rounds replayed
  under it (:func:`floorgap.probes.serving_replay.fault_hypotheses`: the rows in the other block
  layout, the taps one layer off) pass the tests the faithful replay fails;
* **counters**: what the engine counted itself over the served runs (vLLM's /metrics) against
  the per-request records (equal, else "fault of the reading") and, per slot at T > 0, against
  the replay's predicted acceptance (|z| at most :data:`SERVED_Z`);
* **layout**: the block layout the folder declares against the one the check's engine runs
  (:data:`floorgap.models.engine_formats.ENGINE_LAYOUTS`), known before anything is served.

Which faults the offline part alone sees: with a reference, every fault of the folder (block rows
shifted, a wrong mask token, the taps' columns permuted, the taps offset) shows in the export
verdict before anything is served, named from the folder beside the reference. Without one, none
does: the folder reads as a drafter and its numbers look like a poorly trained one's. The served
part then still shows where the engine reads the folder otherwise than floorgap does (or samples
otherwise, like the CPU sampler fault :mod:`floorgap.engine_plugins` mends), but not a fault both
read alike.

For several drafters, each pair's paired difference in tau on the same anchors and paths (and
in risk by slot when both are of one order), with its interval: "a accepts longer than b" only
when the interval excludes zero.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from floorgap.analysis.lookup_verdicts import LOOKUP_DIFF
from floorgap.reports.common import GapSummary
from floorgap.reports.decomposition import Decomposition, decompose, plain_interval, plain_number

__all__ = ["FIDELITY_TV", "FLOOR_SHARE", "GREEDY_SHARE", "MIN_ACTIVE_ROUNDS", "MIN_DRAFTS",
           "ORDER_PARTS", "SERVED_Z", "CheckReport", "Comparison", "DrafterCheck", "ServedCheck",
           "Verdict", "build_check"]

#: A slot is "within reach of its floor" when the model gap is at most this share of the risk.
FLOOR_SHARE = 0.10
#: A folder "reads as its reference weights" when the mean TV(q_ref, q) is at most this at every
#: slot (a faithful export in the weights' dtype gives 0; bf16 rounding stays far below).
FIDELITY_TV = 0.01
#: The served check's |z| bound (acceptance and lossless tests): beyond it the engine does not
#: serve what the replayed weights predict (a faithful folder stays within a few units).
SERVED_Z = 4.0
#: At temperature 0 the engine "reproduces" the replay when at least this share of the complete
#: rounds accepts exactly the drafts before the first whose argmax differs from the target's
#: (1 for a faithful folder in the replay's dtype; near-ties in a lower precision cost a few).
GREEDY_SHARE = 0.9
#: A named fault whose replay reproduces more greedy rounds than the faithful one, with a
#: one-sided sign test on the rounds only one of them reproduces at most this, is what the
#: engine ran, even where the faithful replay passes the tests (a fault that moves q little).
NAMED_SIGN_P = 0.01
#: The served rounds can show a fault only where drafts are accepted: at T > 0 when the engine
#: accepted and the replay predicts at least this many drafts together; at T = 0 when at least
#: :data:`MIN_ACTIVE_ROUNDS` greedy rounds accept a draft, served or replayed. A drafter that
#: accepts (almost) nothing looks the same served and offline whatever its folder holds.
MIN_DRAFTS = 10.0
MIN_ACTIVE_ROUNDS = 5
#: Per order: (floor, gap, gap share, risk) statistics of the decomposition, and the risk's name.
ORDER_PARTS = {0: ("T0", "G0", "G0_share", "R", "R"),
               1: ("T1", "G1", "G1_share", "R_oracle", "R^oracle")}


@dataclass(frozen=True)
class Verdict:
    """One line of the check: ``kind`` (under-trained, floor, order, fix first, compare),
    the sentence, and ``flag`` when it asks the reader to act (a drafter that loses to a table,
    a difference that is resolved)."""

    kind: str
    text: str
    flag: bool = False


@dataclass(frozen=True)
class ServedCheck:
    """A folder served in ``engine`` and its rounds replayed with ``replayed_with``: by
    temperature the served and replayed tau ([estimate, lower, upper], task macro), the rounds
    and the tests (``acceptance_z``, ``lossless_z`` at T > 0; ``greedy_agreement`` at T = 0),
    and the first greedy round the replay does not reproduce (task, row_id, round, served,
    replayed), if any (:func:`floorgap.analysis.serving.served_check`)."""

    engine: str
    replayed_with: str
    by_temperature: Mapping[float, Mapping[str, Any]]
    first_divergent: Mapping[str, Any] | None = None
    #: why there is no replayed round (an engine that reports per-request totals only)
    note: str = ""
    #: by temperature, the engine's own counters beside the per-request records and the
    #: per-slot test (:func:`floorgap.analysis.serving.engine_reading`); empty: not read
    engine_reading: Mapping[float, Mapping[str, Any]] = field(default_factory=dict)
    #: by named fault and temperature, the served rounds against the rounds replayed under it
    #: (:func:`floorgap.analysis.serving.hypothesis_tests`)
    hypotheses: Mapping[str, Mapping[float, Mapping[str, float]]] = field(default_factory=dict)

    def at(self, hot: bool) -> tuple[float, Mapping[str, Any]] | None:
        """(temperature, statistics) of the first temperature above 0 (``hot``) or at 0."""
        temps = [t for t in sorted(self.by_temperature) if (t > 0) == hot]
        return (temps[0], self.by_temperature[temps[0]]) if temps else None


@dataclass
class DrafterCheck:
    """One drafter: its decomposition, dtau_br by slot (estimate, lower, upper), verdicts and,
    when it was served, the served check."""

    decomposition: Decomposition
    gain: pd.DataFrame
    verdicts: list[Verdict]
    served: ServedCheck | None = None

    @property
    def name(self) -> str:
        return self.decomposition.drafter


@dataclass
class Comparison:
    """Drafter ``a`` minus drafter ``b``, paired within anchors: tau (estimate, lower, upper),
    the risk by slot when both are of one order (else empty), and the verdict."""

    a: str
    b: str
    diff_tau: tuple[float, float, float]
    risk_statistic: str
    diff_risk: pd.DataFrame
    verdict: Verdict


@dataclass
class CheckReport:
    """A whole check: its name, target, gamma, interval level, the drafters, their pairwise
    comparisons, and the command and config texts that produced it."""

    name: str
    target: str
    gamma: int
    level: float
    drafters: list[DrafterCheck]
    comparisons: list[Comparison]
    command: str = ""
    configs: dict[str, str] = field(default_factory=dict)

    @property
    def verdicts(self) -> list[Verdict]:
        return [v for d in self.drafters for v in d.verdicts] + [c.verdict for c in
                                                                 self.comparisons]


# ------------------------------------------------------------------------------ numbers


def _slots(values: Sequence[int]) -> str:
    return ", ".join(map(str, values))


def floor_verdict(d: Decomposition) -> Verdict:
    """Where the model gap is at most :data:`FLOOR_SHARE` of the risk (a better drafter of the
    same order cannot win much there), or how large its share is everywhere."""
    _, _, share, _, risk = ORDER_PARTS[d.order]
    shares = {k: d.value(share, k) for k in range(d.gamma)}
    near = [k for k, v in shares.items() if math.isfinite(v) and v <= FLOOR_SHARE]
    if near:
        return Verdict("floor", f"{d.drafter} is within {FLOOR_SHARE:.0%} of its floor at slots "
                       f"{_slots(near)} (model gap at most {FLOOR_SHARE:.0%} of {risk}): a better "
                       f"drafter of order {d.order} cannot win much back there")
    finite = [v for v in shares.values() if math.isfinite(v)]
    if not finite:
        return Verdict("floor", f"{d.drafter}: no slot has a floor estimate (no anchor with a "
                       "floor); the gap cannot be split off")
    return Verdict("floor", f"{d.drafter} is not within {FLOOR_SHARE:.0%} of its floor at any "
                   f"slot: the model gap is {min(finite):.0%}-{max(finite):.0%} of {risk}, which "
                   f"a better drafter of order {d.order} can win back", flag=True)


def order_verdict(d: Decomposition) -> Verdict:
    """The other conditioning order's floor at the last slot beside this order's."""
    last = d.gamma - 1
    if d.order == 0:
        t0, t1 = (plain_number(d.value(s, last)) for s in ("T0", "floors_T1"))
        if t1 == "--":
            return Verdict("order", f"{d.drafter}: the order-1 floor T^(1) at slot {last} was "
                           "not estimated (no covered paths there), so what a drafter that sees "
                           f"its predecessor could reach is unknown; T^(0) is {t0}")
        return Verdict("order", f"{d.drafter}: a higher conditioning order can go lower: at slot "
                       f"{last} the order-0 floor T^(0) is {t0}, the order-1 floor T^(1) {t1} "
                       "(a drafter that sees its predecessor)")
    t1, t0 = d.value("T1", last), d.value("floors_T0", last)
    removed = 1 - t1 / t0 if math.isfinite(t0) and t0 > 0 and math.isfinite(t1) else math.nan
    pct = f"{removed:.0%}" if math.isfinite(removed) else "--"
    return Verdict("order", f"{d.drafter}: seeing its predecessor removes {pct} of the floor at "
                   f"slot {last}: T^(1) {plain_number(t1)} against T^(0) {plain_number(t0)}")


def fix_first_verdict(name: str, gain: pd.DataFrame) -> Verdict:
    """The slot whose single-slot best response gains the most tau (held out)."""
    ok = gain[gain["estimate"].map(math.isfinite)]
    if ok.empty:
        return Verdict("fix first", f"{name}: no single-slot best-response gain was estimated")
    best = ok.loc[ok["estimate"].idxmax()]
    if not best["estimate"] > 0:
        return Verdict("fix first", f"{name}: no single slot's best response gains tau (the "
                       f"largest held-out gain is {plain_number(best['estimate'])})")
    return Verdict("fix first", f"fix slot {int(best['slot'])} of {name} first: the single-slot "
                   f"best response there gains {plain_number(best['estimate'])} in tau "
                   f"{plain_interval(best['lower'], best['upper'])} (held out)")


def export_verdict(name: str, fidelity: Mapping[str, Any] | None) -> Verdict:
    """Whether the folder reads as the weights it was exported from (the export_fidelity
    record), or that no reference was given."""
    if fidelity is None:
        return Verdict("export", f"{name}: no reference weights were given (--reference), so "
                       "an export or layout fault would look offline like a poorly trained "
                       "drafter")
    ref = fidelity["reference"]
    causes = "".join(f"; {c}" for c in fidelity.get("causes") or [])
    if fidelity.get("error"):
        return Verdict("export", f"export or layout fault: {name}'s folder does not read as "
                       f"{ref}{causes}: {fidelity['error']}", flag=True)
    slots = fidelity["slots"]
    bad = [s["slot"] for s in slots if not s["mean_tv"] <= FIDELITY_TV]
    worst = max(s["mean_tv"] for s in slots)
    if not bad:
        return Verdict("export", f"{name}'s folder reads as the weights it was exported from "
                       f"({ref}): mean TV(q_ref, q) at most {worst:.2g} (threshold "
                       f"{FIDELITY_TV}) on {fidelity['anchors']} anchors, largest |q_ref - q| "
                       f"{max(s['max_abs_dq'] for s in slots):.2g}")
    agree = min(s["argmax_agreement"] for s in slots)
    return Verdict("export", f"export or layout fault: {name}'s folder does not read as {ref}"
                   f"{causes}: mean TV(q_ref, q) above {FIDELITY_TV} at slots {_slots(bad)} (up to "
                   f"{worst:.3f}); the most likely token agrees on {agree:.0%} of "
                   f"{fidelity['anchors']} anchors at the worst slot", flag=True)


def engine_verdict(name: str, served: ServedCheck | None, why_not: str) -> Verdict:
    """Whether the engine serves what the replayed weights predict (module docstring), or why
    the folder was not served."""
    if served is None:
        return Verdict("engine", f"{name} was not served: {why_not}")
    if not served.by_temperature:
        return Verdict("engine", f"the served rounds cannot tell whether the engine serves what "
                       f"the weights predict: {name} in {served.engine}: {served.note}; serve "
                       "in vllm (--engine vllm), which reports every round's accepted drafts")
    hot, cold = served.at(True), served.at(False)
    parts, bad = [], []
    if hot is not None:
        temp, stats = hot
        for key, label in (("acceptance_z", "acceptance z"), ("lossless_z", "lossless z")):
            z = float(stats.get(key, math.nan))
            parts.append(f"{label} {z:+.2f} at T = {temp:g}")
            if not abs(z) <= SERVED_Z:
                bad.append(parts[-1])
    if cold is not None:
        temp, stats = cold
        agree = float(stats.get("greedy_agreement", math.nan))
        parts.append(f"{agree:.0%} of {int(stats['rounds'])} rounds reproduced at T = {temp:g}")
        if not agree >= GREEDY_SHARE:
            bad.append(parts[-1])
    taus = [f"tau served {plain_number(s['tau_served'][0])} against replayed "
            f"{plain_number(s['tau_offline'][0])} at T = {t:g}"
            for t, s in sorted(served.by_temperature.items())]
    where = f"{name} in {served.engine}, replayed with {served.replayed_with}"
    closer = closer_fault(served)
    if not bad and closer:
        return Verdict("engine", f"{closer}: {where}: {'; '.join(parts + taus)}", flag=True)
    if not bad and not informative(served):
        drafts = [f"{plain_number(s.get('accepted_observed', math.nan), 0)} drafts accepted "
                  f"against {plain_number(s.get('accepted_expected', math.nan), 1)} predicted at "
                  f"T = {t:g}" for t, s in sorted(served.by_temperature.items()) if t > 0]
        if cold is not None:
            drafts.append(f"{int(cold[1].get('active_rounds', 0))} of {int(cold[1]['rounds'])} "
                          f"greedy rounds accept any draft")
        return Verdict("engine", f"the served rounds cannot tell whether the engine serves what "
                       f"the weights predict: {where}: {'; '.join(drafts)}; a drafter that "
                       "accepts almost nothing looks the same served and offline (serve more "
                       "rows, --serve-rows)")
    if not bad:
        return Verdict("engine", f"the engine serves what the weights predict: {where}: "
                       f"{'; '.join(parts + taus)} (|z| at most {SERVED_Z:g}, at least "
                       f"{GREEDY_SHARE:.0%} of greedy rounds)")
    first = served.first_divergent
    first_text = (f"; first divergent round: {first['task']} row {first['row_id']} round "
                  f"{first['round']} (served {first['served']} drafts accepted, replayed "
                  f"{first['replayed']})" if first else "")
    return Verdict("engine", f"{named_fault(served)}: {where}: {'; '.join(bad)}{first_text}; "
                   f"{'; '.join(taus)}", flag=True)


def named_fault(served: ServedCheck) -> str:
    """The served rounds' fault by name: the named faults (a layout shift, a tap offset) under
    whose replay the rounds pass the engine verdict's tests (|z| at most :data:`SERVED_Z` at
    T > 0, at least :data:`GREEDY_SHARE` of greedy rounds), else "engine or layout fault"
    with the faults tried."""
    if not accepted_any(served):
        # rounds that accept nothing fit every reading that predicts little: name none
        return ("engine or layout fault (the engine accepted no draft, which any reading that "
                "predicts little fits, so no named fault can be told)")
    fits = []
    for name, by_temp in sorted(served.hypotheses.items()):
        tests = [abs(s["acceptance_z"]) <= SERVED_Z if "acceptance_z" in s
                 else s["greedy_agreement"] >= GREEDY_SHARE for s in by_temp.values()]
        if tests and all(tests):
            stats = "; ".join(f"acceptance z {s['acceptance_z']:+.2f} at T = {t:g}"
                              if "acceptance_z" in s else
                              f"{s['greedy_agreement']:.0%} of greedy rounds at T = {t:g}"
                              for t, s in sorted(by_temp.items()))
            fits.append(f"{name} (the rounds replayed so: {stats})")
    if fits:
        return f"{' or '.join(fits)}"
    tried = ", ".join(sorted(served.hypotheses))
    return "engine or layout fault" + (f" (none of {tried} fits)" if tried else "")


def closer_fault(served: ServedCheck) -> str:
    """A named fault whose replay the served greedy rounds fit better than the faithful one
    (sign test at most :data:`NAMED_SIGN_P`), said with its numbers; empty when none does."""
    out = []
    for name, by_temp in sorted(served.hypotheses.items()):
        greedy = by_temp.get(0.0) or {}
        if greedy.get("sign_p", 1.0) <= NAMED_SIGN_P and accepted_any(served):
            out.append(f"{name} (its replay reproduces {int(greedy['greedy_gain'])} more greedy "
                       f"rounds, {greedy['greedy_agreement']:.0%} of them; sign test p = "
                       f"{greedy['sign_p']:.1g})")
    return " or ".join(out)


def accepted_any(served: ServedCheck) -> bool:
    """Whether the engine itself accepted drafts enough to tell readings apart: at least
    :data:`MIN_DRAFTS` at T > 0 or :data:`MIN_ACTIVE_ROUNDS` greedy rounds with a served
    acceptance (counted from the served side only)."""
    hot, cold = served.at(True), served.at(False)
    drafts = float(hot[1].get("accepted_observed", 0)) if hot else 0.0
    active = float(cold[1].get("served_active_rounds", 0)) if cold else 0.0
    return drafts >= MIN_DRAFTS or active >= MIN_ACTIVE_ROUNDS


def counters_verdict(name: str, served: ServedCheck | None) -> Verdict | None:
    """What the engine counted itself (vLLM's /metrics counters over the served runs) against
    the per-request records, which must be equal (else a fault of the reading, named), and at
    T > 0 per slot the engine-counted acceptances against the replay's prediction (|z| at most
    :data:`SERVED_Z`). None for a folder that was not served."""
    if served is None:
        return None
    reading = {t: r for t, r in served.engine_reading.items() if r.get("engine") is not None}
    if not reading:
        return Verdict("counters", f"{name}: the engine's own counters were not read "
                       f"({served.engine} keeps no speculative-decoding counters, or "
                       "serving.engine_counters is false), so only its per-request counts "
                       "stand beside the replay")
    wrong = [f"at T = {t:g} the engine counted {_counted(r['engine'], k)} and the per-request "
             f"records sum to {_counted(r['records'], k)}"
             for t, r in sorted(reading.items()) for k in r.get("differs", [])]
    if wrong:
        return Verdict("counters", f"fault of the reading: {name} in {served.engine}: "
                       f"{'; '.join(wrong)} (they count the same rounds and must be equal)",
                       flag=True)
    totals = "; ".join(f"{r['engine']['drafts']} rounds, {r['engine']['accepted']} accepted "
                       f"drafts at T = {t:g}" for t, r in sorted(reading.items()))
    slots = [(t, r["slots"]) for t, r in sorted(reading.items()) if r.get("slots")]
    if not slots:
        return Verdict("counters", f"{name}: the engine's counters equal the per-request "
                       f"records ({totals})")
    temp, tests = slots[0]
    far = [x["slot"] for x in tests if not abs(x["z"]) <= SERVED_Z]
    per = ", ".join(f"{int(x['observed'])}/{x['trials']} (predicted {x['expected']:.1f}, "
                    f"z {x['z']:+.2f})" for x in tests)
    head = (f"the engine's counters disagree with the replay at slots {_slots(far)}"
            if far else "the engine's counters agree with the replay at every slot")
    return Verdict("counters", f"{head}: {name} in {served.engine}, accepted/reached by slot at "
                   f"T = {temp:g}: {per} (|z| at most {SERVED_Z:g}); they equal the "
                   f"per-request records ({totals})", flag=bool(far))


def _counted(counts: Mapping[str, Any], key: str) -> str:
    value = counts[key]
    return f"{key} {list(value) if key == 'accepted_per_pos' else value}"


def layout_verdict(name: str, facts: Mapping[str, Any], engine: str | None
                   ) -> Verdict | None:
    """The folder's block layout against the one ``engine`` runs it with (``facts``:
    :func:`floorgap.models.engine_formats.describe_folder`), known before anything is served:
    None where the engine runs no such folder; a flagged "block layout shifted by one" where
    the two differ (an engine that reads no layout field runs its own)."""
    run = (facts.get("engine_layouts") or {}).get(engine or "")
    if run is None:
        return None
    own, field_ = facts["block_layout"], facts.get("layout_field")
    said = f"declares {own} ({field_})" if field_ else f"is read as {own} (it declares none)"
    if run == own:
        return Verdict("layout", f"{name}'s folder {said}, the layout {engine} runs it with")
    step = "k + 1" if own == "anchor-first" else "k - 1"
    return Verdict("layout", f"block layout shifted by one: {name}'s folder {said}, but {engine} "
                   f"runs a {facts['layout']} folder {run}, reading no layout field: served, it "
                   f"proposes at slot k what weights trained as declared predict for slot "
                   f"{step}", flag=True)


def informative(served: ServedCheck) -> bool:
    """Whether the served rounds accept enough drafts to show a fault (:data:`MIN_DRAFTS`,
    :data:`MIN_ACTIVE_ROUNDS`)."""
    hot, cold = served.at(True), served.at(False)
    drafts = float(hot[1].get("accepted_observed", 0)) + float(
        hot[1].get("accepted_expected", 0)) if hot else 0.0
    active = float(cold[1].get("active_rounds", 0)) if cold else 0.0
    return drafts >= MIN_DRAFTS or active >= MIN_ACTIVE_ROUNDS


def drafter_check(gaps: GapSummary, d: Decomposition,
                  fidelity: Mapping[str, Any] | None = None, served: ServedCheck | None = None,
                  why_not_served: str = "", layout: Verdict | None = None) -> DrafterCheck:
    """The check of one decomposed drafter: dtau_br by slot and the verdict lines (the layout
    verdict, when an engine would serve its folder; the export verdict from its fidelity
    record, when it has a reference; the engine verdict from its served check, when it was
    served)."""
    gain = _by_slot(gaps, "dtau_br", d.drafter, d.gamma)
    verdicts = [export_verdict(d.drafter, fidelity),
                engine_verdict(d.drafter, served, why_not_served)]
    verdicts += [v for v in (counters_verdict(d.drafter, served), layout) if v is not None]
    verdicts += [Verdict("under-trained", v.sentence(), flag=bool(v.loses)) for v in d.verdicts]
    verdicts += [floor_verdict(d), order_verdict(d), fix_first_verdict(d.drafter, gain)]
    return DrafterCheck(d, gain, verdicts, served)


def _by_slot(gaps: GapSummary, statistic: str, variant: str, gamma: int) -> pd.DataFrame:
    """``slot, estimate, lower, upper`` of one statistic at every slot."""
    return pd.DataFrame([{"slot": k, **gaps.fields(statistic, variant, k)} for k in range(gamma)])


def comparison(gaps: GapSummary, a: Decomposition, b: Decomposition, level: float
               ) -> Comparison:
    """``a`` minus ``b`` from the gaps summary's contrast ``a-b``."""
    name = f"{a.drafter}-{b.drafter}"
    tau = tuple(gaps.fields("diff_tau", name).values())
    if not math.isfinite(tau[0]):
        raise ValueError(f"{gaps.path} has no paired difference {name!r}; the check's pairs "
                         "are contrasts of the decompose summary (rerun its gaps stage)")
    stat = LOOKUP_DIFF[a.order] if a.order == b.order else ""
    diff = _by_slot(gaps, stat, name, a.gamma) if stat else pd.DataFrame()
    est, lo, hi = tau
    ci = f"{level:.0%} CI {plain_interval(lo, hi)}"
    if lo > 0 or hi < 0:
        longer, shorter = (a.drafter, b.drafter) if est > 0 else (b.drafter, a.drafter)
        text = (f"{longer} accepts longer than {shorter}: tau difference {a.drafter} - "
                f"{b.drafter} = {plain_number(est)} ({ci}), paired on the same anchors")
        verdict = Verdict("compare", text, flag=True)
    else:
        verdict = Verdict("compare", f"{a.drafter} and {b.drafter}: no difference in tau "
                          f"resolved ({a.drafter} - {b.drafter} = {plain_number(est)}, {ci})")
    return Comparison(a.drafter, b.drafter, (est, lo, hi), stat.removeprefix("diff_"), diff,
                      verdict)


def build_check(gaps_path: str | Path, floors_path: str | Path, spec: Mapping[str, Any],
                fidelity: Mapping[str, Mapping[str, Any]] | None = None,
                served: Mapping[str, ServedCheck] | None = None) -> CheckReport:
    """The check described by ``spec`` (``floorgap.config.WorkflowSpec.check_spec``): every
    drafter's decomposition and verdicts, and every pair's comparison; ``fidelity`` holds the
    export_fidelity record of each drafter with a reference, ``served`` the served check of
    each drafter the spec serves. Raises ValueError when a drafter, table or pair is missing
    from the summaries or they describe different runs, or a drafter with a reference has no
    fidelity record, or a served drafter no served check."""
    fidelity, served = dict(fidelity or {}), dict(served or {})
    missing = sorted(set(spec.get("references") or {}) - set(fidelity))
    if missing:
        raise ValueError(f"no export_fidelity record for {missing}, which have a reference; "
                         "pass --fidelity results/check/<name>/fidelity/<drafter>.json")
    unserved = sorted(set(spec.get("served") or []) - set(served))
    if unserved:
        raise ValueError(f"no served rounds for {unserved}, which the check serves; pass their "
                         "serving_replay records (--replay)")
    level = float(spec["level"])
    decs = {d["name"]: decompose(gaps_path, floors_path, d["name"],
                                 kind=str((d.get("entry") or {}).get("kind", "")), level=level,
                                 lookups=list(d.get("lookups", [])))
            for d in spec["drafters"]}
    gaps = GapSummary(gaps_path)
    first = next(iter(decs.values()))
    configs = {str(p): p.read_text() if p.is_file() else f"({p} no longer exists)"
               for p in map(Path, spec.get("configfiles", []))}
    return CheckReport(
        name=str(spec["name"]), target=first.target, gamma=first.gamma, level=level,
        drafters=[drafter_check(gaps, d, fidelity.get(name), served.get(name),
                                _why_not_served(spec, d), _layout(spec, name))
                  for name, d in decs.items()],
        comparisons=[comparison(gaps, decs[a], decs[b], level) for a, b in spec.get("pairs", [])],
        command=str(spec.get("command", "")), configs=configs)


def _layout(spec: Mapping[str, Any], name: str) -> Verdict | None:
    """The layout verdict of drafter ``name``'s folder in the check's engine (None without an
    engine or a local folder in a layout the engines load)."""
    from floorgap.models.engine_formats import ENGINE_LAYOUTS, describe_folder

    entry = next(d for d in spec["drafters"] if d["name"] == name).get("entry") or {}
    ckpt = entry.get("checkpoint") or {}
    if not spec.get("engine") or "path" not in ckpt or not any(
            ckpt.get("format") in m for m in ENGINE_LAYOUTS.values()):
        return None
    try:
        facts = describe_folder(ckpt["path"])
    except (ValueError, FileNotFoundError) as exc:
        return Verdict("layout", f"{name}'s folder cannot be read: {exc}", flag=True)
    return layout_verdict(name, facts, str(spec["engine"]))


def _why_not_served(spec: Mapping[str, Any], d: Decomposition) -> str:
    """The config's reason (``not_served`` of the check spec), else that there is no engine."""
    why = (spec.get("not_served") or {}).get(d.drafter)
    if why:
        return str(why)
    return ("the config has no serving section (the engine, its python and the tasks)"
            if not spec.get("engine") else "the check does not serve it")
