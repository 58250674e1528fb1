"""``floorgap report ITEM --summary S [--input KEY=PATH ...] [--spec JSON]
--out-dir DIR --out-values paper/values/ITEM.tex [--log LOG]``

One paper item (a figure or a table) from analysis records. ``ITEMS`` maps each item name to
its function ``item(inputs, spec, out_dir) -> {macro: value}``: ``inputs`` are the named input
files (``--summary X`` is short for ``--input summary=X``), ``spec`` the options the rule hands
over (the plotting options for figures), ``out_dir`` the folder of the item's files
(``figures`` or ``paper/tables``). The dispatcher writes the returned macros to the values
fragment ``--out-values``.

``floorgap report values --out paper/values.tex FRAGMENT...`` concatenates the
values fragments of every item (a macro defined twice is an error).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from floorgap.errors import StageError
from floorgap.stages._cli import run_stage, stage_parser
from floorgap.reports import floor_items, gap_items, mi_items

Item = Callable[[Mapping[str, Path], Mapping[str, Any], Path], dict[str, str]]

#: Item name (the output file stem and the rule name) -> the function that builds it.
ITEMS: dict[str, Item] = {
    "fig2_floor_by_slot": floor_items.fig2_floor_by_slot,
    "fig3_floor_by_domain": floor_items.fig3_floor_by_domain,
    "figD2_kmedian": floor_items.figD2_kmedian,
    "table3_floor_intervals": floor_items.table3_floor_intervals,
    "tableD1_concentration": floor_items.tableD1_concentration,
    "table4_mi_locality": mi_items.table4_mi_locality,
    "fig4_drafter_decomposition": gap_items.fig4_drafter_decomposition,
    "fig6_slot_priority": gap_items.fig6_slot_priority,
    "fig7_prefix_attention": gap_items.fig7_prefix_attention,
    "table5_dflash": gap_items.table5_dflash,
    "table6_dspark": gap_items.table6_dspark,
    "table7_serving_risk": gap_items.table7_serving_risk,
    "table8_dependence": gap_items.table8_dependence,
    "table10_trajectory": gap_items.table10_trajectory,
    "table12_ours_vs_dspark": gap_items.table12_ours_vs_dspark,
    "table13_components": gap_items.table13_components,
    "tableF5_single_slot": gap_items.tableF5_single_slot,
    "tableF6_sweeps": gap_items.tableF6_sweeps,
}

VALUES = "values"


def _spec(text: str) -> dict[str, Any]:
    if not text:
        return {}
    raw = Path(text[1:]).read_text() if text.startswith("@") else text
    try:
        spec = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"--spec is not valid JSON: {exc}") from exc
    if not isinstance(spec, dict):
        raise argparse.ArgumentTypeError("--spec must be a JSON object")
    return spec


def _named_input(text: str) -> tuple[str, Path]:
    key, sep, path = text.partition("=")
    if not sep or not key or not path:
        raise argparse.ArgumentTypeError(f"--input wants KEY=PATH, got {text!r}")
    return key, Path(path)


def build_parser() -> argparse.ArgumentParser:
    parser = stage_parser("floorgap report", "Build one paper item (figure or table) and its "
                          "values fragment, or concatenate values fragments.", spec=False)
    parser.add_argument("item", help=f"one of {sorted(ITEMS)} or '{VALUES}'")
    parser.add_argument("fragments", nargs="*", type=Path,
                        help=f"values fragments to concatenate ('{VALUES}' only)")
    parser.add_argument("--summary", type=Path, help="the floors summary (input 'summary')")
    parser.add_argument("--input", action="append", default=[], type=_named_input,
                        metavar="KEY=PATH", help="a named input file (repeatable)")
    parser.add_argument("--spec", type=_spec, default={},
                        help="JSON object (or @file) of the item's options")
    parser.add_argument("--out-dir", type=Path, help="folder of the item's output files")
    parser.add_argument("--out-values", type=Path, help="values fragment to write")
    parser.add_argument("--out", type=Path, help=f"values file to write ('{VALUES}' only)")
    # The fragments follow the options (`values --out X --log L A.tex B.tex`): positionals
    # separated by options need argparse's intermixed parsing.
    parser.parse_args = parser.parse_intermixed_args  # type: ignore[method-assign]
    return parser


def main(args: argparse.Namespace, logger: logging.Logger) -> None:
    from floorgap.reports.common import concat_values, write_values

    if args.item == VALUES:
        if args.out is None or not args.fragments:
            raise StageError(f"'{VALUES}' needs --out and at least one fragment")
        concat_values(args.out, args.fragments)
        logger.info("values: %d fragments -> %s", len(args.fragments), args.out)
        return
    if args.item not in ITEMS:
        raise StageError(f"unknown item {args.item!r}; known: {sorted(ITEMS)} and '{VALUES}'")
    if args.fragments:
        raise StageError(f"unexpected positional arguments {args.fragments}")
    if args.out_dir is None or args.out_values is None:
        raise StageError("an item needs --out-dir and --out-values")
    inputs = dict(args.input)
    if args.summary is not None:
        inputs["summary"] = args.summary
    for key, path in inputs.items():
        if not path.exists():
            raise StageError(f"input {key}={path} does not exist")
    try:
        values = ITEMS[args.item](inputs, args.spec, args.out_dir)
    except ValueError as exc:  # the records do not hold what the item needs
        raise StageError(f"{args.item}: {exc}") from exc
    source = ", ".join(str(p) for p in inputs.values())
    write_values(args.out_values, values, source=source)
    logger.info("%s: wrote %s and %d values to %s", args.item, args.out_dir, len(values),
                args.out_values)

