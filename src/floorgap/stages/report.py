"""``floorgap report ITEM --input KEY=PATH [...] [--spec JSON] [--plugin MODULE ...]
--out-dir DIR --out-values paper/values/ITEM.tex [--log LOG]``

One report item (a figure or a table) from analysis summaries. The item is a row of
:mod:`floorgap.reports.registry` (or of a ``--plugin`` module's ``ITEMS``); its function
``item(inputs, spec, out_dir) -> {macro: value}`` gets the named input files (``--summary X`` is
short for ``--input summary=X``), the options the rule hands over (``spec``: plotting options
for figures, drafter roles for the gap half) and the folder of its files (``figures`` or
``paper/tables``). The returned macros go to the values fragment ``--out-values``.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from floorgap.errors import StageError
from floorgap.reports.common import write_values
from floorgap.reports.registry import report_items
from floorgap.stages._cli import add_files, parse_spec, stage_parser


def _named_input(text: str) -> tuple[str, Path]:
    key, sep, path = text.partition("=")
    if not sep or not key or not path:
        raise argparse.ArgumentTypeError(f"--input wants KEY=PATH, got {text!r}")
    return key, Path(path)


def build_parser() -> argparse.ArgumentParser:
    parser = stage_parser("floorgap report", "Build one report item (figure or table) and its "
                          "values fragment.", spec=False)
    parser.add_argument("item", help="the item's name (a row of floorgap.reports.registry)")
    parser.add_argument("--summary", type=Path, help="the item's summary (input 'summary')")
    parser.add_argument("--input", action="append", default=[], type=_named_input,
                        metavar="KEY=PATH", help="a named input file (repeatable)")
    parser.add_argument("--spec", type=parse_spec, default={},
                        help="JSON object (or @file) of the item's options")
    parser.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                        help="a module with more items (a list ITEMS of ReportItem; repeatable)")
    add_files(parser, "--out-dir", "--out-values",
              help={"--out-dir": "folder of the item's output files",
                    "--out-values": "values fragment to write"})
    return parser


def main(args: argparse.Namespace, logger: logging.Logger) -> None:
    items = report_items(args.plugin)
    if args.item not in items:
        raise StageError(f"unknown item {args.item!r}; known: {sorted(items)}")
    inputs = dict(args.input)
    if args.summary is not None:
        inputs["summary"] = args.summary
    for key, path in inputs.items():
        if not path.exists():
            raise StageError(f"input {key}={path} does not exist")
    try:
        values = items[args.item].function()(inputs, args.spec, args.out_dir)
    except ValueError as exc:  # the records do not hold what the item needs
        raise StageError(f"{args.item}: {exc}") from exc
    source = ", ".join(str(p) for p in inputs.values())
    write_values(args.out_values, values, source=source)
    logger.info("%s: wrote %s and %d values to %s", args.item, args.out_dir, len(values),
                args.out_values)
