"""``floorgap models --spec JSON --out results/models/<target> --log LOG``

Materialise one target model (a config target entry plus its ``name``) into a local folder.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from floorgap.models.targets import materialise
from floorgap.stages._cli import stage_parser


def build_parser() -> argparse.ArgumentParser:
    parser = stage_parser("floorgap models", __doc__.strip().splitlines()[2])
    parser.add_argument("--out", required=True, type=Path, help="output model folder")
    return parser


def main(args: argparse.Namespace, logger: logging.Logger) -> None:
    info = materialise(args.spec, args.out)
    logger.info("parameters %d, vocab %d, layers %d, dtype %s", info["parameters"],
                info["vocab_size"], info["num_hidden_layers"], info["dtype"])

