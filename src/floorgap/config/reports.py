"""What each kind of report item reads (:data:`REPORT_SUMMARIES`) and the report rules'
inputs and specs that follow from it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from floorgap.config.base import SpecCore


class ReportSpecs(SpecCore):
    """The inputs and specs of the report rules."""

    def report_inputs(self, reads: str) -> dict[str, str]:
        """The files a report item of ``reads`` (a key of :data:`REPORT_SUMMARIES`) reads, as
        KEY -> path (the item function's ``inputs``)."""
        return REPORT_SUMMARIES[reads].inputs(self)

    def report_spec(self, reads: str, kind: str) -> dict[str, Any]:
        """The options one report item receives: the plotting options (figures only, so a
        plotting change reruns nothing upstream) and those of what it reads
        (:data:`REPORT_SUMMARIES`)."""
        spec: dict[str, Any] = dict(self.config["figures"]) if kind == "figure" else {}
        return {**spec, **REPORT_SUMMARIES[reads].options(self)}


@dataclass(frozen=True)
class ReportSummary:
    """What one kind of report item reads: its files, KEY -> path (``inputs``), and the options
    beyond the plotting ones (``options``), both from the resolved config. A new kind of item is
    a new entry of :data:`REPORT_SUMMARIES`; the report rules and their specs follow from it."""

    inputs: Callable[[SpecCore], dict[str, str]]
    options: Callable[[SpecCore], dict[str, Any]] = lambda w: {}


def _primary(path: str) -> Callable[[SpecCore], dict[str, str]]:
    """One summary of the primary target, read as ``summary``."""
    return lambda w: {"summary": f"results/{w.primary}/{path}"}


def _roles(w: SpecCore) -> dict[str, Any]:
    """The drafter roles and the lookup tables' kinds (the gap half's items)."""
    return {"roles": w.roles,
            "lookups": {name: str(w.variant_entry(name, w.primary)["kind"]) for name in w.lookups}}


def _served_beside(path: str) -> Callable[[SpecCore], dict[str, str]]:
    # tables 10 and 13 also show the served tau of the variants the serving benchmark served
    return lambda w: {"summary": f"results/{w.primary}/{path}",
                      "served": f"results/{w.primary}/serving_summary/summary.parquet"}


def _budget_inputs(w: SpecCore) -> dict[str, str]:
    # the budget study also reads each study drafter's training log (blocks per epoch)
    return {"summary": f"results/{w.primary}/gaps/budget.parquet",
            **{f"log_{v}": f"results/{w.primary}/drafters/{v}/train_log.jsonl"
               for v in w.budget_variants + w.budget_arms}}


def _budget_options(w: SpecCore) -> dict[str, Any]:
    # the study's tables (fitted on an arm's subset) have entries and no training epochs
    trained = w.budget_variants + w.budget_arms
    return {**_roles(w), "budget": {v: w.variant_entry(v, w.primary)
                                    for v in trained + w.budget_lookups},
            "train_epochs": {v: w.variant_epochs(v, w.primary) for v in trained}}


#: Each kind of report item (a registry row's ``reads``): the files it reads and its options.
REPORT_SUMMARIES: dict[str, ReportSummary] = {
    "floors": ReportSummary(_primary("floors/summary.parquet")),
    "gaps": ReportSummary(_primary("gaps/summary.parquet"), _roles),
    "gaps_trajectory": ReportSummary(_served_beside("gaps/trajectory.parquet"), _roles),
    "gaps_components": ReportSummary(
        _served_beside("gaps/components.parquet"),
        lambda w: {**_roles(w), "baseline": w.config["drafters"]["components"]["baseline"],
                   "arms": w.arms}),
    "gaps_budget": ReportSummary(_budget_inputs, _budget_options),
    "mi": ReportSummary(
        lambda w: {d: f"results/{w.primary}/mi/{d}.parquet" for d in w.domains},
        lambda w: {"analysis": {"bootstrap": w.config["analysis"]["bootstrap"],
                                "level": w.config["analysis"]["level"],
                                "seed": w.config["seed"]},
                   "ess_gates": w.config["mi"]["ess_gates"]}),
    # App. F.3: published accepted lengths to bound, beside the project's own
    "serving": ReportSummary(
        _primary("serving_summary/summary.parquet"),
        lambda w: {**_roles(w), "published": list(w.serving.get("published", [])),
                   "gamma": w.config["anchors"]["gamma"]}),
    "api_floors": ReportSummary(_primary("api_floors/api/summary.parquet")),
    # App. C.2: the second engine's reads beside the rollouts' full-vocabulary floors
    "replication": ReportSummary(lambda w: {
        "replication": f"results/{w.primary}/api_floors/replication/floors.parquet",
        "anchor_slot": f"results/{w.primary}/floors/anchor_slot.parquet"}),
    "floor_variants": ReportSummary(lambda w: {
        v: f"results/{w.primary}/floor_variants/{v}_summary.parquet" for v in w.FLOOR_VARIANTS}),
    # Fig. 5 compares the targets: every target's gaps summary
    "cross_target": ReportSummary(
        lambda w: {f"gaps_{t}": f"results/{t}/gaps/summary.parquet" for t in w.targets}, _roles),
    # the notation table reads the notation module, no file
    "notation": ReportSummary(lambda w: {}),
}


def _drafter_setting(w: SpecCore, name: str) -> dict[str, Any]:
    """How drafter ``name`` of the primary target came to be: the folder or hub id it is
    imported from, or its kind, layers and training epochs."""
    entry = w.variant_entry(name, w.primary)
    if w.is_imported(name, w.primary):
        return {"name": name,
                "imported": entry["checkpoint"].get("hub") or entry["checkpoint"].get("path")}
    return {"name": name, "kind": entry["kind"], "layers": int(entry["layers"]),
            "epochs": w.variant_epochs(name, w.primary)}


def _setting(w: SpecCore) -> dict[str, Any]:
    """The run's setting the paper's text names (the target's precision and device, the taps,
    the stored top-K, each role's drafter)."""
    target = w.target(w.primary)
    cfg = w.settings(w.primary)
    return {"device": target["device"], "dtype": target["dtype"], "taps": w.taps(w.primary),
            "top_k_targets": cfg["drafters"]["training_data"]["top_k_targets"],
            "drafters": {role: _drafter_setting(w, name) for role, name in w.roles.items()}}


#: The kinds of summary the paper's findings read (reports/claims.py).
CLAIM_READS = ("floors", "gaps", "gaps_trajectory", "gaps_components", "serving", "mi",
               "floor_variants", "api_floors", "cross_target")


def _claims_inputs(w: SpecCore) -> dict[str, str]:
    """Every summary a claim reads: the files of each kind of :data:`CLAIM_READS`, keyed
    ``<kind>__<name>``."""
    return {f"{kind}__{key}": path for kind in CLAIM_READS
            for key, path in REPORT_SUMMARIES[kind].inputs(w).items()}


def _claims_options(w: SpecCore) -> dict[str, Any]:
    mi = REPORT_SUMMARIES["mi"].options(w)
    return {**_roles(w), **mi, "setting": _setting(w),
            "components_baseline": w.config["drafters"]["components"]["baseline"],
            "arms": w.arms}


#: The paper's findings checked on the run (reports/claims.py) read every summary above.
REPORT_SUMMARIES["claims"] = ReportSummary(_claims_inputs, _claims_options)
