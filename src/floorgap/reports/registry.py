"""The one list of report items: every figure and table of the paper, what it reads, where it
goes. The workflow generates one rule per row, the paper rule and the values file read it, the
HTML report takes its categories from it, and the tests iterate over it.

Adding an item = a function ``item(inputs, spec, out_dir) -> {macro: value}`` + one row here +
a caption ``workflow/report/<name>.rst``. Items outside the package join through a plugin
module named in the config (``report.plugins``): a module with ``ITEMS``, a list of
:class:`ReportItem`, whose ``build`` references point at the plugin's own functions.

The rows reference functions by ``"module:function"`` so that Snakemake can read the registry
without importing matplotlib or the analysis code.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from floorgap.config import REPORT_SUMMARIES
from floorgap.errors import StageError

Item = Callable[[Mapping[str, Path], Mapping[str, Any], Path], dict[str, str]]


@dataclass(frozen=True)
class ReportItem:
    """One figure or table: ``name`` is its file stem and rule name, ``kind`` figure (PDF + PNG
    under figures/) or table (.tex + .csv under paper/tables/), ``reads`` a key of
    :data:`floorgap.config.REPORT_SUMMARIES` (which names its files and options), ``section``
    the paper half (the HTML report's category), ``build`` ``"module:function"``, ``caption``
    the caption file (default ``workflow/report/<name>.rst``), ``in_paper`` whether
    paper/main.tex cites it."""

    name: str
    kind: Literal["figure", "table"]
    reads: str
    section: str
    build: str
    caption: str | None = None
    in_paper: bool = True

    def __post_init__(self) -> None:
        if self.kind not in ("figure", "table"):
            raise ValueError(f"report item {self.name}: kind must be figure or table")
        if self.reads not in REPORT_SUMMARIES:  # read live: a new kind is one entry there
            raise ValueError(f"report item {self.name}: reads must be one of "
                             f"{tuple(REPORT_SUMMARIES)}")
        if ":" not in self.build:
            raise ValueError(f"report item {self.name}: build must be 'module:function'")

    @property
    def out_dir(self) -> str:
        return "figures" if self.kind == "figure" else "paper/tables"

    @property
    def files(self) -> list[str]:
        """The item's output files (besides its values fragment)."""
        exts = ("pdf", "png") if self.kind == "figure" else ("tex", "csv")
        return [f"{self.out_dir}/{self.name}.{ext}" for ext in exts]

    @property
    def values(self) -> str:
        return f"paper/values/{self.name}.tex"

    def function(self) -> Item:
        """Import and return the item's function."""
        module, _, attr = self.build.partition(":")
        return getattr(importlib.import_module(module), attr)


def _row(name: str, kind: str, reads: str, section: str, module: str) -> ReportItem:
    return ReportItem(name, kind, reads, section, f"floorgap.reports.{module}:{name}")  # type: ignore[arg-type]


#: The paper's items, in the order the paper presents them within each half.
ITEMS: tuple[ReportItem, ...] = (
    _row("fig2_floor_by_slot", "figure", "floors", "Floors", "floor_items"),
    _row("fig3_floor_by_domain", "figure", "floors", "Floors", "floor_items"),
    _row("figD2_kmedian", "figure", "floors", "Floors", "floor_items"),
    _row("table3_floor_intervals", "table", "floors", "Floors", "floor_items"),
    _row("tableD1_concentration", "table", "floors", "Floors", "floor_items"),
    _row("table4_mi_locality", "table", "mi", "Floors", "mi_items"),
    _row("fig4_drafter_decomposition", "figure", "gaps", "Gaps", "gap_items"),
    _row("fig6_slot_priority", "figure", "gaps", "Gaps", "gap_items"),
    _row("fig7_prefix_attention", "figure", "gaps", "Gaps", "gap_items"),
    _row("table5_dflash", "table", "gaps", "Gaps", "gap_items"),
    _row("table6_dspark", "table", "gaps", "Gaps", "gap_items"),
    _row("table7_serving_risk", "table", "gaps", "Gaps", "gap_items"),
    _row("table8_dependence", "table", "gaps", "Gaps", "gap_items"),
    _row("table10_trajectory", "table", "gaps_trajectory", "Gaps", "gap_items"),
    _row("table12_ours_vs_dspark", "table", "gaps", "Gaps", "gap_items"),
    _row("table13_components", "table", "gaps_components", "Gaps", "gap_items"),
    _row("tableF5_single_slot", "table", "gaps", "Gaps", "gap_items"),
    _row("tableF6_sweeps", "table", "gaps", "Gaps", "gap_items"),
    _row("figE_drafter_learning", "figure", "gaps_budget", "Gaps", "budget_items"),
    _row("tableE_drafter_budget", "table", "gaps_budget", "Gaps", "budget_items"),
    _row("table1_serving", "table", "serving", "Serving", "serving_items"),
    _row("table9_serving_per_task", "table", "serving", "Serving", "serving_items"),
    _row("table11_concurrency", "table", "serving", "Serving", "serving_items"),
    _row("figH_served_vs_offline", "figure", "serving", "Serving", "serving_items"),
    _row("tableC2_replication", "table", "replication", "Floors", "robustness_items"),
    _row("tableC3_finite_m", "table", "floor_variants", "Floors", "robustness_items"),
    _row("tableC4_block16", "table", "floor_variants", "Floors", "robustness_items"),
    _row("tableC6_top20", "table", "floors", "Floors", "floor_items"),
    _row("tableC7_sampling_law", "table", "floor_variants", "Floors", "robustness_items"),
    _row("fig5_cross_target", "figure", "cross_target", "Reach", "reach_items"),
    _row("tableC6_api_floors", "table", "api_floors", "Reach", "reach_items"),
    _row("tableF3_serving_bounds", "table", "serving", "Reach", "reach_items"),
    _row("table2_notation", "table", "notation", "Reach", "reach_items"),
    # the paper's findings checked on this run (every summary above)
    ReportItem("claims", "table", "claims", "Claims", "floorgap.reports.claims:claims"),
)


def report_items(plugins: Iterable[str] = ()) -> dict[str, ReportItem]:
    """Item name -> row: the paper's items and those of the ``plugins`` modules (each with a
    list ``ITEMS`` of :class:`ReportItem`). A name used twice is an error."""
    items: dict[str, ReportItem] = {}
    rows = list(ITEMS)
    for name in plugins:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise StageError(f"report plugin {name!r} cannot be imported ({exc}); put its "
                             "folder on PYTHONPATH or install it") from exc
        extra = getattr(module, "ITEMS", None)
        if not isinstance(extra, (list, tuple)) or not all(isinstance(r, ReportItem)
                                                           for r in extra):
            raise StageError(f"report plugin {name!r} has no list ITEMS of ReportItem rows")
        rows += extra
    for row in rows:
        if row.name in items:
            raise StageError(f"report item {row.name!r} is registered twice")
        items[row.name] = row
    return items
