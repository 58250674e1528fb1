"""``floorgap values --out paper/values.tex FRAGMENT...``

Concatenate the values fragments of the report items into the file paper/main.tex inputs, so
the text cites only computed numbers (a macro defined twice is an error).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from floorgap.reports.common import concat_values
from floorgap.stages._cli import stage_parser


def build_parser() -> argparse.ArgumentParser:
    parser = stage_parser("floorgap values", "Concatenate values fragments.", spec=False)
    parser.add_argument("--out", required=True, type=Path, help="values file to write")
    parser.add_argument("fragments", nargs="+", type=Path, help="values fragments")
    # The fragments follow the options (`values --out X --log L A.tex B.tex`).
    parser.parse_args = parser.parse_intermixed_args  # type: ignore[method-assign]
    return parser


def main(args: argparse.Namespace, logger: logging.Logger) -> None:
    concat_values(args.out, args.fragments)
    logger.info("values: %d fragments -> %s", len(args.fragments), args.out)
