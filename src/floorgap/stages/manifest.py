"""``floorgap manifest --out results/<target>/manifest.json FILE [FILE ...]``

Write the manifest (row counts and SHA-256) of a set of record files.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from floorgap.records import write_manifest
from floorgap.stages._cli import stage_parser


def build_parser() -> argparse.ArgumentParser:
    parser = stage_parser("floorgap manifest", "Row counts and SHA-256 of record files.",
                          spec=False)
    parser.add_argument("--out", required=True, type=Path, help="manifest JSON to write")
    parser.add_argument("files", nargs="+", help="record files to list")
    return parser


def main(args: argparse.Namespace, logger: logging.Logger) -> None:
    write_manifest(args.out, args.files)
    logger.info("manifest of %d files -> %s", len(args.files), args.out)
